"""Calls relayed by a real TURN server (Debian's coturn on a loopback address, inside the test's
own network namespace): an aiortc client and headless Chromium, relay only."""

from __future__ import annotations

import shutil

import pytest

from netns import needs_chromium, run_in_netns
from support import on_frame_grid

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("turnserver") is None, reason="needs coturn (scripts/setup.sh --test)"
    ),
]
TURN_HOST = "127.0.0.3"


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_a_relay_only_aiortc_client_calls_through_coturn(transport) -> None:
    r = run_in_netns("turn.py", "--seconds", "5", "--transport", transport)
    assert r["errors"] == [] and r["codec"] == "H264"
    # frames arrive, each a later slot of the frame grid (no frame rate: that is speed)
    assert r["video_frames"] > 0 and on_frame_grid(r["video_pts"])
    # the server tells the page its ICE servers (with the TURN credentials)
    turn = f"turn:{TURN_HOST}:3478?transport={transport}"
    assert r["session_ice"]["iceServers"][0]["urls"] == turn
    assert r["session_ice"]["iceTransportPolicy"] == "all"
    # the pair aioice nominated: our relay (the only candidate a relay-only peer has) to the
    # server; coturn allocated and opened a permission to the server's address
    assert r["pair"][0] == "relay"
    assert r["allocations"] >= 1 and r["server_host"] in r["relayed_peers"]
    # coturn's count of the call it relayed (seen ~500 kB; how much depends on how many
    # fresh frames this machine made, so only that it carried the call)
    assert r["relayed_bytes"] > 0
    assert r["sessions_left"] == 0


def page_call_is_live_through_the_relay(r: dict) -> None:
    s = r["stats"]
    assert s["codec"] == "video/H264" and s["frameWidth"] == 128
    assert s["framesDecoded"] > 0  # no frame rate floor: how fast is this machine's business
    assert s["micPackets"] > 0  # the fake microphone reached the server, relayed too
    assert r["pair"]["localType"] == "relay" and r["pair"]["localAddress"] == TURN_HOST
    assert r["pair"]["relayProtocol"] == "udp"
    # coturn's own count of what it relayed between the peers (seen ~720 kB for 6 s of call)
    assert r["relayed_bytes"] > 0
    assert r["sessions_left"] == 0
    assert [m for m in r["console"] if m.startswith("error")] == []


@needs_chromium
def test_chromium_relay_only_page_calls_through_coturn(tmp_path) -> None:
    r = run_in_netns(
        "turn_browser.py", "--relay", "page", "--screenshot", str(tmp_path / "relay.png")
    )
    page_call_is_live_through_the_relay(r)
    assert r["pair"]["remoteType"] == "host"  # the server itself may be reached directly


@needs_chromium
def test_ice_relay_only_sends_both_sides_through_coturn(tmp_path) -> None:
    r = run_in_netns(
        "turn_browser.py", "--relay", "server", "--screenshot", str(tmp_path / "relay.png")
    )
    page_call_is_live_through_the_relay(r)
    assert r["pair"]["remoteType"] == "relay"  # the server offered its relay candidate only
