"""ICE servers: `talkloop serve --ice-server/--ice-username/--ice-credential/--ice-relay-only`,
what the server's peer uses and what the page is told."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from aiortc.rtcconfiguration import RTCIceTransportPolicy

from talkloop.pipeline.cli import main
from talkloop.pipeline.core.errors import ConfigError
from talkloop.rtc.ice import IceConfig, check_ice_url
from talkloop.rtc.peer import Peer

from support import run, tiny_args, with_server

pytestmark = pytest.mark.unit

TINY = tiny_args()
TURN = "turn:turn.example:3478?transport=udp"


@pytest.mark.parametrize(
    "url",
    [
        "stun:stun.example",
        "stun:10.0.0.1:3478",
        "stun:[2001:db8::1]:19302",
        "turn:turn.example",
        "turn:127.0.0.3:3478?transport=tcp",
        "turns:turn.example:5349",
        "turns:turn.example:443?transport=tcp",
    ],
)
def test_good_ice_urls_pass(url) -> None:
    assert check_ice_url(url) == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("turn:u:p@turn.example", "--ice-username/--ice-credential, not in the URL"),
        ("https://turn.example", "stun:, turn: or turns: URLs"),
        ("stun:stun.example:0", "port 0 is not in 1-65535"),
        ("stun:stun.example:70000", "port 70000"),
        ("stun:stun.example?transport=udp", "takes no ?transport="),
        ("turns:turn.example?transport=udp", "tcp only"),
        ("turn:turn.example?transport=sctp", "expected stun:HOST"),
        ("turn:", "expected stun:HOST"),
    ],
)
def test_bad_ice_urls_are_one_clear_error(url, message) -> None:
    with pytest.raises(ConfigError, match="--ice-server") as err:
        check_ice_url(url)
    assert message in str(err.value) and url in str(err.value)


def test_ice_config_feeds_aiortc_and_the_page() -> None:
    ice = IceConfig(["stun:stun.example:3478", TURN], "user", "secret", relay_only=True)
    rtc = ice.rtc_configuration()
    assert rtc.iceTransportPolicy is RTCIceTransportPolicy.RELAY
    assert [(s.urls, s.username, s.credential) for s in rtc.iceServers] == [
        ("stun:stun.example:3478", None, None),
        (TURN, "user", "secret"),
    ]
    assert ice.for_page() == {
        "iceServers": [
            {"urls": "stun:stun.example:3478"},
            {"urls": TURN, "username": "user", "credential": "secret"},
        ],
        "iceTransportPolicy": "relay",
    }
    # no --ice-server: aiortc's default (None) for the server, none for the page
    default = IceConfig()
    assert default.rtc_configuration().iceServers is None
    assert default.for_page() == {"iceServers": [], "iceTransportPolicy": "all"}
    # --ice-server none: no server at all, not even aiortc's public STUN default
    assert IceConfig([]).rtc_configuration().iceServers == []


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"urls": [TURN]}, "needs --ice-username and --ice-credential"),
        ({"urls": [TURN], "username": "u"}, "go together"),
        ({"urls": ["stun:s.example"], "username": "u", "credential": "p"}, "are for a turn:"),
        ({"urls": ["stun:s.example"], "relay_only": True}, "--ice-relay-only needs a TURN"),
        ({"urls": None, "relay_only": True}, "--ice-relay-only needs a TURN"),
    ],
)
def test_inconsistent_ice_settings_are_refused(kw, message) -> None:
    with pytest.raises(ConfigError, match=message):
        IceConfig(**kw)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ice-server", "turn:user:pw@host"], "not in the URL"),
        (["--ice-server", "none", "--ice-server", "stun:s.example"], "give it alone"),
        (["--ice-server", TURN], "needs --ice-username"),
        (["--ice-relay-only"], "needs a TURN server"),
        (
            ["--ice-server", TURN, "--ice-username", "u", "--ice-credential-file", "/nonexistent"],
            "cannot read /nonexistent",
        ),
        (["--ice-credential", "p", "--ice-credential-file", "/x"], "not both"),
    ],
)
def test_bad_ice_flags_exit_2_with_one_line(capsys, served, flags, message) -> None:
    assert main(["serve", *TINY, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("talkloop: error: ") and "\n" not in err and message in err
    assert not served


def test_ice_flags_reach_the_server(served, tmp_path) -> None:
    flags = ["--ice-server", "stun:127.0.0.3", "--ice-server", TURN]
    flags += ["--ice-username", "u", "--ice-credential", "p", "--ice-relay-only"]
    assert main(["serve", *TINY, *flags]) == 0
    assert main(["serve", *TINY, "--ice-server", "none"]) == 0
    assert main(["serve", *TINY]) == 0
    secret = tmp_path / "turn-password"
    secret.write_text("from-a-file\n")
    flags = ["--ice-server", TURN, "--ice-username", "u", "--ice-credential-file", str(secret)]
    assert main(["serve", *TINY, *flags]) == 0
    given, none, default, from_file = (k["ice"] for k in served)
    assert given == IceConfig(["stun:127.0.0.3", TURN], "u", "p", relay_only=True)
    assert none.urls == [] and default.urls is None
    assert from_file.credential == "from-a-file"


def test_the_session_message_tells_the_page_and_the_peer_uses_them(
    live_pipeline, monkeypatch
) -> None:
    import talkloop.rtc.signaling
    from talkloop.rtc.protocol import ProtocolError

    ice = IceConfig([TURN], "u", "p", relay_only=True)
    given = []

    class RecordingPeer(Peer):  # the configuration the server builds its peer with
        def __init__(self, *args, configuration=None, **kwargs) -> None:
            given.append(configuration)
            super().__init__(*args, configuration=configuration, **kwargs)

        async def answer(self, sdp: str) -> str:  # no media needed: stop at the offer
            raise ProtocolError("bad_sdp", "not answered in this test")

    monkeypatch.setattr(talkloop.rtc.signaling, "Peer", RecordingPeer)

    async def body(server, ws_url, port) -> tuple[dict, dict]:
        async with websockets.connect(ws_url) as ws:
            hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
            await ws.send(json.dumps({"type": "offer", "sdp": "v=0"}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
        return hello, reply

    hello, reply = run(with_server(live_pipeline, body, ice=ice))
    assert hello["type"] == "session" and hello["ice"] == ice.for_page()
    assert reply["code"] == "bad_sdp" and len(given) == 1
    assert given[0].iceTransportPolicy is RTCIceTransportPolicy.RELAY
    assert [(s.urls, s.username, s.credential) for s in given[0].iceServers] == [(TURN, "u", "p")]
