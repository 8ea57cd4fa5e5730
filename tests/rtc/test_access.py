"""Serving beyond localhost: TLS, the access token, the Origin allow-list, the per-address cap,
the offer timeout, and the start-up refusals of `talkloop serve`."""

from __future__ import annotations

import asyncio
import json
import ssl

import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from talkloop.pipeline.cli import main
from talkloop.rtc.security import AccessPolicy, check_exposure, normalize_origin
from talkloop.rtc.server import AvatarServer
from talkloop.rtc.tls import fingerprint, self_signed, server_context

from support import http_get, make_reference, run, tiny_args, tiny_config, with_server

pytestmark = pytest.mark.unit

TINY = tiny_args()
TOKEN = "0123456789abcdef0123"


async def first(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


async def closed_code(ws) -> int:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    return closed.value.rcvd.code


# -- TLS -------------------------------------------------------------------------------------------


def test_https_page_and_wss_session_with_a_self_signed_certificate(live_pipeline, tmp_path) -> None:
    cert, key = self_signed(["localhost", "127.0.0.1"], tmp_path)
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert self_signed(["127.0.0.1", "localhost"], tmp_path) == (cert, key)  # reused
    client = ssl.create_default_context(cafile=str(cert))  # trusts exactly this certificate

    async def body(server, ws_url, port):
        page = await asyncio.to_thread(http_get, f"https://127.0.0.1:{port}/", client)
        async with websockets.connect(ws_url, ssl=client) as ws:
            hello = await first(ws)
        # a client that does not trust the certificate is refused by its own TLS check
        with pytest.raises(ssl.SSLCertVerificationError):
            await websockets.connect(ws_url, ssl=ssl.create_default_context())
        return page, hello

    page, hello = run(with_server(live_pipeline, body, ssl_context=server_context(cert, key)))
    assert page[0] == 200 and b"talkloop" in page[2]
    assert hello["type"] == "session"
    assert len(fingerprint(cert).split(":")) == 32


def test_bad_tls_files_are_one_clear_error(tmp_path) -> None:
    from talkloop.pipeline.core.errors import ConfigError

    with pytest.raises(ConfigError, match="--tls-cert: no such file"):
        server_context(tmp_path / "nope.pem", tmp_path / "nope.key")
    cert, _ = self_signed(["localhost"], tmp_path)
    other_cert, other_key = self_signed(["example.test"], tmp_path)
    with pytest.raises(ConfigError, match="cannot use"):
        server_context(cert, other_key)


# -- access token ----------------------------------------------------------------------------------


def test_the_access_token_guards_pages_and_agents(live_pipeline) -> None:
    async def body(server, ws_url, port):
        results = {}
        for name, query in [("none", ""), ("wrong", "?access=" + "x" * 20)]:
            async with websockets.connect(ws_url + query) as ws:
                results[name] = (await first(ws), await closed_code(ws))
        async with websockets.connect(ws_url + f"?access={TOKEN}") as page:
            hello = await first(page)
            agent_url = ws_url + f"?token={hello['token']}&role=agent"
            async with websockets.connect(agent_url) as agent:  # the session token is not enough
                results["agent_without"] = (await first(agent), await closed_code(agent))
            async with websockets.connect(agent_url + f"&access={TOKEN}") as agent:
                results["agent"] = await first(agent)
        results["hello"] = hello
        return results

    r = run(with_server(live_pipeline, body, access=AccessPolicy(token=TOKEN)))
    for name in ("none", "wrong", "agent_without"):
        msg, code = r[name]
        assert msg["code"] == "bad_access" and "access token" in msg["message"], name
        assert code == 4401, name
    assert r["hello"]["type"] == "session" and r["agent"]["type"] == "agent"


# -- origins ---------------------------------------------------------------------------------------


def test_a_page_from_another_origin_is_refused_before_the_upgrade(live_pipeline) -> None:
    async def body(server, ws_url, port):
        own = f"http://127.0.0.1:{port}"
        statuses = {}
        for origin in ("https://evil.example", "null", f"http://127.0.0.1:{port + 1}"):
            with pytest.raises(InvalidStatus) as refused:
                await websockets.connect(ws_url, origin=origin)
            statuses[origin] = refused.value.response.status_code
        hellos = []
        for origin in (own, "https://app.example", None):  # own, allowed, not a browser
            async with websockets.connect(ws_url, origin=origin) as ws:
                hellos.append((await first(ws))["type"])
        return statuses, hellos

    statuses, hellos = run(
        with_server(
            live_pipeline, body, access=AccessPolicy(allowed_origins=["https://APP.example:443/"])
        )
    )
    assert set(statuses.values()) == {403}
    assert hellos == ["session"] * 3


def test_origins_are_normalised_and_checked_against_the_host_header() -> None:
    policy = AccessPolicy(allowed_origins=["https://a.example"])
    assert normalize_origin("HTTPS://A.example:443") == "https://a.example"
    assert normalize_origin("http://[::1]:8080") == "http://[::1]:8080"
    assert policy.origin_ok("https://a.example", "other:1", "http")
    assert policy.origin_ok("https://host.lan:8443", "host.lan:8443", "https")
    assert not policy.origin_ok("http://host.lan:8443", "host.lan:8443", "https")  # scheme
    assert not policy.origin_ok("https://evil.lan", "host.lan", "https")
    assert not policy.origin_ok("https://host.lan", None, "https")
    assert policy.origin_ok(None, "host.lan", "https")
    from talkloop.pipeline.core.errors import ConfigError

    with pytest.raises(ConfigError, match="no path"):
        normalize_origin("https://a.example/app")


def test_the_token_is_compared_in_constant_time(monkeypatch) -> None:
    import hmac

    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    policy = AccessPolicy(token=TOKEN)
    assert policy.token_ok(TOKEN) and not policy.token_ok(TOKEN[:-1]) and not policy.token_ok(None)
    assert len(calls) == 2


# -- per-address cap -------------------------------------------------------------------------------


def test_connections_per_address_are_capped(live_pipeline) -> None:
    async def body(server, ws_url, port):
        a = await websockets.connect(ws_url)
        await first(a)
        b = await websockets.connect(ws_url)
        await first(b)
        with pytest.raises(InvalidStatus) as refused:
            await websockets.connect(ws_url)
        await a.close()
        for _ in range(100):
            if server.access.connections("127.0.0.1") < 2:
                break
            await asyncio.sleep(0.05)
        async with websockets.connect(ws_url) as c:  # a closed connection frees its place
            again = await first(c)
        await b.close()
        return refused.value.response.status_code, again

    status, again = run(
        with_server(
            live_pipeline, body, max_sessions=3, access=AccessPolicy(max_connections_per_ip=2)
        )
    )
    assert status == 429 and again["type"] == "session"


# -- offer timeout ---------------------------------------------------------------------------------


def test_a_session_without_an_offer_times_out_and_frees_its_slot(live_pipeline) -> None:
    async def body(server, ws_url, port):
        idle = await websockets.connect(ws_url)
        await first(idle)
        timeout = json.loads(await asyncio.wait_for(idle.recv(), 10))
        code = await closed_code(idle)
        async with websockets.connect(ws_url) as fresh:  # the only slot is free again
            hello = await first(fresh)
        return timeout, code, hello

    timeout, code, hello = run(with_server(live_pipeline, body, offer_timeout_s=0.5))
    assert timeout["type"] == "error" and timeout["code"] == "offer_timeout"
    assert "offer" in timeout["message"]
    assert code == 4408 and hello["type"] == "session"


def test_a_connected_agent_keeps_a_session_without_an_offer(live_pipeline) -> None:
    async def body(server, ws_url, port):
        page = await websockets.connect(ws_url)
        token = (await first(page))["token"]
        async with websockets.connect(ws_url + f"?token={token}&role=agent") as agent:
            await first(agent)
            await asyncio.sleep(1.2)  # over twice the timeout
            kept = token in server.calls
        # the agent left and still no offer: the timeout runs again from now
        await asyncio.sleep(0.2)
        still = token in server.calls
        while (msg := json.loads(await asyncio.wait_for(page.recv(), 10)))["type"] == "stats":
            pass
        return kept, still, msg

    kept, still, msg = run(with_server(live_pipeline, body, offer_timeout_s=0.5))
    assert kept and still and msg["code"] == "offer_timeout"


# -- start-up refusals -----------------------------------------------------------------------------


# Non-loopback hosts below are RFC 5737 documentation addresses, only ever checked: nothing binds
# them (check_exposure is pure; `served` replaces the server start).


def test_exposure_needs_a_token_and_tls_unless_insecure() -> None:
    from talkloop.pipeline.core.errors import ConfigError

    check_exposure("127.0.0.1", None, False, False)
    check_exposure("localhost", None, False, False)
    check_exposure("203.0.113.7", None, False, True)
    check_exposure("203.0.113.7", TOKEN, True, False)
    with pytest.raises(ConfigError, match=r"access token .* and TLS"):
        check_exposure("203.0.113.7", None, False, False)
    with pytest.raises(ConfigError, match="TLS") as err:
        check_exposure("192.168.1.5", TOKEN, False, False)
    assert "access token" not in str(err.value) and "--insecure" in str(err.value)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--host", "203.0.113.7"], "needs an access token"),
        (["--host", "203.0.113.7", "--access-token", TOKEN], "needs TLS"),
        (["--access-token", "short"], "at least 16 characters"),
        (["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"], "no such file"),
        (["--tls-cert", "/nonexistent.pem"], "--tls-cert and --tls-key go together"),
        (["--allow-origin", "ftp://x"], "--allow-origin must look like"),
        (["--max-connections-per-ip", "0"], "at least 1"),
        (["--offer-timeout-s", "0"], "--offer-timeout-s"),
        (["--placement", "a2v=offloaded", "--max-sessions", "2"], "one call at a time"),
        (["--placement", "a2v=offloaded", "--max-calls", "2"], "one call at a time"),
        (["--max-calls", "0"], "--max-calls must be at least 1"),
    ],
)
def test_unsafe_or_bad_serving_flags_are_refused(capsys, served, flags, message) -> None:
    code = main(["serve", *TINY, *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("talkloop: error: ") and "\n" not in err
    assert message in err and not served


def test_max_calls_and_its_first_name_max_sessions_are_one_flag(served) -> None:
    assert main(["serve", *TINY, "--max-calls", "3"]) == 0
    assert main(["serve", *TINY, "--max-sessions", "2"]) == 0
    assert main(["serve", *TINY]) == 0
    assert [s["max_calls"] for s in served] == [3, 2, 1]


def test_serving_other_machines_with_token_and_tls(capsys, served, tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    flags = ["--host", "203.0.113.7", "--access-token-file", str(token_file)]
    flags += ["--tls-self-signed", "myhost.lan,10.0.0.5", "--tls-dir", str(tmp_path / "tls")]
    flags += ["--allow-origin", "https://app.example", "--offer-timeout-s", "5"]
    assert main(["serve", *TINY, *flags]) == 0
    assert main(["serve", *TINY, "--host", "203.0.113.7", "--insecure"]) == 0
    secure, insecure = served
    assert secure["access"].token == TOKEN and secure["ssl_context"] is not None
    assert secure["access"].allowed_origins == {"https://app.example"}
    assert secure["offer_timeout_s"] == 5
    assert insecure["access"].token is None and insecure["ssl_context"] is None
    from cryptography import x509

    pem = next((tmp_path / "tls").glob("*.pem")).read_bytes()
    alt = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    names = {str(n.value) for n in alt.value}
    assert {"myhost.lan", "10.0.0.5", "localhost", "127.0.0.1"} <= names


def test_the_avatar_upload_obeys_the_same_rules(live_pipeline) -> None:
    async def body(server, ws_url, port):
        async with websockets.connect(ws_url + "?avatar=1") as ws:  # no token: no photo read
            refused = (await first(ws), await closed_code(ws))
        with pytest.raises(InvalidStatus) as foreign:
            await websockets.connect(ws_url + f"?avatar=1&access={TOKEN}", origin="https://x.test")
        return refused, foreign.value.response.status_code, len(server.calls)

    (msg, code), status, sessions = run(
        with_server(live_pipeline, body, access=AccessPolicy(TOKEN))
    )
    assert msg["code"] == "bad_access" and code == 4401
    assert status == 403 and sessions == 0


def test_the_server_itself_refuses_offloaded_placement_for_several_sessions() -> None:
    """Not only the CLI: an in-process AvatarServer (tests, embedders) is refused too."""
    from types import SimpleNamespace

    from talkloop.pipeline.core.errors import ConfigError

    offloaded = SimpleNamespace(config=tiny_config(model={"placement": {"a2v": "offloaded"}}))
    with pytest.raises(ConfigError, match=r"--max-calls \(--max-sessions\) is 2"):
        AvatarServer(offloaded, make_reference(), max_sessions=2)
    AvatarServer(offloaded, make_reference(), max_sessions=1).executor.shutdown()
