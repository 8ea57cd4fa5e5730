"""The signaling server: static page, protocol errors, caps, tokens, vanishing clients."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from support import RecordingMirror, http_get, run, until, with_server

pytestmark = pytest.mark.unit


def test_page_is_served(live_pipeline) -> None:
    async def body(server, ws_url, port):
        http = f"http://127.0.0.1:{port}"
        page = await asyncio.to_thread(http_get, http + "/")
        js = await asyncio.to_thread(http_get, http + "/app.js")
        missing = await asyncio.to_thread(http_get, http + "/nope.html")
        escape = await asyncio.to_thread(http_get, http + "/..%2Fpyproject.toml")
        return page, js, missing, escape

    page, js, missing, escape = run(with_server(live_pipeline, body))
    assert page[0] == 200 and page[1].startswith("text/html") and b"talkloop" in page[2]
    assert js[0] == 200 and b"RTCPeerConnection" in js[2]
    assert missing[0] == 404 and escape[0] == 404


def test_session_hello_and_protocol_errors_keep_the_session(live_pipeline) -> None:
    async def body(server, ws_url, port):
        async with websockets.connect(ws_url) as ws:
            hello = json.loads(await ws.recv())
            errors = []
            for raw in [
                "{not json",
                json.dumps({"type": "dance"}),
                json.dumps([1, 2]),
                json.dumps({"type": "offer", "sdp": "v=0\r\nthis is not sdp"}),
                json.dumps({"type": "say", "text": ""}),
                json.dumps({"type": "candidate", "candidate": "candidate:1 1 udp"}),
            ]:
                await ws.send(raw)
                errors.append(await until(ws, "error"))
            await ws.send(json.dumps({"type": "prompt", "text": "calm"}))
            await ws.send(json.dumps({"type": "interrupt"}))
            alive = len(server.calls)
            return hello, errors, alive

    hello, errors, alive = run(with_server(live_pipeline, body, notice="note"))
    assert hello["type"] == "session" and len(hello["token"]) > 10 and hello["notice"] == "note"
    codes = [e["code"] for e in errors]
    assert codes == [
        "bad_json",
        "unknown_type",
        "bad_message",
        "bad_sdp",
        "bad_message",
        "bad_state",
    ]
    assert "expected one of" in errors[1]["message"]
    assert errors[3]["message"].startswith("invalid SDP offer")
    assert alive == 1


def test_busy_bad_token_and_oversize(live_pipeline) -> None:
    async def body(server, ws_url, port):
        async with websockets.connect(ws_url) as first:
            await first.recv()
            async with websockets.connect(ws_url) as second:
                busy = json.loads(await second.recv())
                with pytest.raises(ConnectionClosed) as closed:
                    await second.recv()
                busy_code = closed.value.rcvd.code
            async with websockets.connect(ws_url + "?token=nope") as third:
                bad = json.loads(await third.recv())
            # an oversize message ends only its own connection
            await first.send(json.dumps({"type": "say", "text": "x" * 400_000}))
            with pytest.raises(ConnectionClosed) as big:
                await first.recv()
        await asyncio.sleep(0.2)
        left = len(server.calls)
        async with websockets.connect(ws_url) as again:
            fresh = json.loads(await again.recv())
        return busy, busy_code, bad, big.value.rcvd.code, left, fresh

    busy, busy_code, bad, big_code, left, fresh = run(with_server(live_pipeline, body))
    assert busy["code"] == "busy" and "limit of 1" in busy["message"] and busy_code == 1013
    assert bad["code"] == "bad_token"
    assert big_code == 1009  # message too big
    assert left == 0  # the oversize session was freed
    assert fresh["type"] == "session"  # and the server still serves


def test_vanished_client_frees_its_session(live_pipeline) -> None:
    async def body(server, ws_url, port):
        ws = await websockets.connect(ws_url)
        await ws.recv()
        call = next(iter(server.calls.values())).call
        call.start()  # generation thread + driver running, as in a call
        await asyncio.sleep(0.5)
        ws.transport.abort()  # no close frame: the client just disappears
        for _ in range(100):
            if not server.calls:
                break
            await asyncio.sleep(0.05)
        return len(server.calls), call

    left, call = run(with_server(live_pipeline, body))
    assert left == 0
    assert not call.avatar.generating
    assert call.session.state.fields["context_latents"] is None  # tensors released
    assert not [t for t in threading.enumerate() if t.name.startswith("gen-")]


def test_session_tokens_are_hex_and_sessions_get_free_slots(live_pipeline) -> None:
    slots: list[int] = []

    def mirrors(slot: int) -> list:
        slots.append(slot)
        return []

    async def body(server, ws_url, port):
        server.mirror_factory = mirrors
        first = await websockets.connect(ws_url)
        hello = json.loads(await first.recv())
        async with websockets.connect(ws_url) as second:
            await second.recv()
            await first.close()  # frees slot 1 while slot 2 stays taken
            for _ in range(100):
                if len(server.calls) == 1:
                    break
                await asyncio.sleep(0.05)
            async with websockets.connect(ws_url) as third:
                await third.recv()
                open_slots = sorted(s.number for s in server.calls.values())
        return hello, open_slots

    hello, open_slots = run(with_server(live_pipeline, body, max_sessions=2))
    # hex: a token never starts with "-" (read as an option after --token) nor needs quoting
    assert len(hello["token"]) == 32 and set(hello["token"]) <= set("0123456789abcdef")
    assert slots == [1, 2, 1] and open_slots == [1, 2]


class SlowClosingMirror:
    """A mirror sink whose close blocks until released, as a KVS mirror draining its upload."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closing = threading.Event()

    def open(self, info) -> None:
        pass

    def write(self, video, audio) -> None:
        pass

    def close(self) -> None:
        self.closing.set()
        self.release.wait(30)

    def abort(self) -> None:
        self.close()


def test_a_slot_stays_taken_while_its_mirror_drains(live_pipeline) -> None:
    made: list[tuple[int, SlowClosingMirror]] = []

    def mirrors(slot: int) -> list:
        made.append((slot, SlowClosingMirror()))
        return [made[-1][1]]

    async def body(server, ws_url, port):
        server.mirror_factory = mirrors
        ws = await websockets.connect(ws_url)
        await ws.recv()
        next(iter(server.calls.values())).call.start()  # generating, so sinks get closed
        await asyncio.sleep(0.5)
        await ws.close()
        await asyncio.to_thread(made[0][1].closing.wait, 30)
        async with websockets.connect(ws_url) as during:  # slot 1's stream is still uploading
            refused = json.loads(await during.recv())
        made[0][1].release.set()
        for _ in range(100):
            if not server.pool.draining:
                break
            await asyncio.sleep(0.05)
        async with websockets.connect(ws_url) as after:
            accepted = json.loads(await after.recv())
        made[-1][1].release.set()
        return refused, accepted

    refused, accepted = run(with_server(live_pipeline, body))
    assert refused["code"] == "busy"
    assert accepted["type"] == "session" and [slot for slot, _ in made] == [1, 1]


def test_a_session_that_never_started_closes_its_mirrors(live_pipeline) -> None:
    mirror = RecordingMirror()

    async def body(server, ws_url, port):
        server.mirror_factory = lambda slot: [mirror]
        async with websockets.connect(ws_url) as ws:  # the page opens a session, no call follows
            await ws.recv()
        for _ in range(100):
            if not server.calls and not server.pool.draining:
                break
            await asyncio.sleep(0.05)

    run(with_server(live_pipeline, body))
    assert mirror.events == ["open", "close"]


def test_free_memory_goes_back_to_the_system_while_calls_run(live_pipeline, monkeypatch) -> None:
    from talkloop.rtc import server as server_module

    released: list[int] = []
    monkeypatch.setattr(server_module, "RELEASE_EVERY_S", 0.05)
    monkeypatch.setattr(server_module, "release_free_memory", lambda: released.append(1) or True)

    async def body(server, ws_url, port):
        await asyncio.sleep(0.3)
        idle = len(released)  # no call yet: nothing to give back
        ws = await websockets.connect(ws_url)
        await ws.recv()  # the session hello: the call is open
        for _ in range(200):  # however slow the machine, two periods pass within 10 s
            if len(released) >= 2:
                break
            await asyncio.sleep(0.05)
        during = len(released)
        await ws.close()
        for _ in range(100):
            if not server.calls:
                break
            await asyncio.sleep(0.05)
        after_close = len(released)
        await asyncio.sleep(0.3)
        return idle, during, after_close, len(released)

    idle, during, after_close, later = run(with_server(live_pipeline, body))
    assert idle == 0
    assert during >= 2  # every RELEASE_EVERY_S while the call was open
    assert later - after_close <= 1  # and no more once it closed (one may have been under way)
