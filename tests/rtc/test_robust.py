"""Hostile or broken traffic ends at most its own message or session: deep JSON, bad ICE
candidates, say floods, generation failures; a clean stop logs no traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from talkloop.rtc.server import MAX_QUEUED_SAYS

from support import offer_without_candidates, run, until, with_server

pytestmark = pytest.mark.unit


def test_deep_json_and_bad_candidates_get_errors_and_the_session_goes_on(live_pipeline) -> None:
    async def body(server, ws_url, port):
        offer = await offer_without_candidates()
        async with websockets.connect(ws_url) as ws:
            await until(ws, "session")
            errors = []
            await ws.send("[" * 200_000)
            errors.append(await until(ws, "error"))
            await ws.send(json.dumps({"type": "offer", "sdp": offer}))
            answer = await until(ws, "answer")
            for cand in [
                {"candidate": "candidate:1 1 udp 2130706431 127.0.0.2 5000 typ host"},
                {"candidate": "candidate:garbage", "sdpMid": "0", "sdpMLineIndex": 0},
                {"candidate": "x" * 1500, "sdpMid": "0"},
                {"candidate": "candidate:1 1 udp 1 127.0.0.2 5000 typ host", "sdpMid": "9"},
            ]:
                await ws.send(json.dumps({"type": "candidate", **cand}))
                errors.append(await until(ws, "error"))
            await ws.send(json.dumps({"type": "agent", "x": [[[[1]]]] * 3}))  # unknown type
            errors.append(await until(ws, "error"))
            await ws.send(json.dumps({"type": "prompt", "text": "calm"}))
            stats = await until(ws, "stats")
            alive = len(server.calls)
        return errors, answer, stats, alive

    errors, answer, stats, alive = run(with_server(live_pipeline, body), 90)
    assert [e["code"] for e in errors] == [
        "bad_json",
        "bad_candidate",
        "bad_candidate",
        "bad_candidate",
        "bad_candidate",
        "unknown_type",
    ]
    assert "nested too deeply" in errors[0]["message"]
    assert "sdpMid" in errors[1]["message"]
    assert answer["sdp"].startswith("v=0") and alive == 1 and stats["type"] == "stats"


def test_agent_receive_loop_survives_deep_json(live_pipeline) -> None:
    async def body(server, ws_url, port):
        async with websockets.connect(ws_url) as page:
            token = (await until(page, "session"))["token"]
            async with websockets.connect(ws_url + f"?token={token}&role=agent") as agent:
                await until(agent, "agent")
                await agent.send('{"a":' * 40_000)
                err = await until(agent, "error")
                await agent.send(json.dumps({"type": "prompt", "text": "calm"}))
                await agent.send(json.dumps({"type": "dance"}))
                after = await until(agent, "error")
        return err, after

    err, after = run(with_server(live_pipeline, body), 90)
    assert err["code"] == "bad_json" and after["code"] == "unknown_type"


def test_a_say_flood_is_bounded_and_off_the_default_executor(live_pipeline) -> None:
    async def body(server, ws_url, port):
        async with websockets.connect(ws_url) as ws:
            token = (await until(ws, "session"))["token"]
            avatar = server.calls[token].call.avatar
            text = ("Hello there, this is a long sentence to speak. " * 45)[:2000]
            for _ in range(200):
                await ws.send(json.dumps({"type": "say", "text": text}))
            busy = 0
            while busy < 200 - (MAX_QUEUED_SAYS + 1):
                busy += (await until(ws, "error"))["code"] == "busy"
            queued = len(avatar._say_tasks)
            names = [t.name for t in threading.enumerate()]
            await ws.send(json.dumps({"type": "interrupt"}))  # drops the queue
            for _ in range(100):
                if not avatar._say_tasks:
                    break
                await asyncio.sleep(0.05)
            left = len(avatar._say_tasks)
        return busy, queued, names, left

    busy, queued, names, left = run(with_server(live_pipeline, body), 90)
    assert busy == 200 - (MAX_QUEUED_SAYS + 1)
    assert queued <= MAX_QUEUED_SAYS + 1
    # speech and session set-up run on the server's own workers; the loop's default executor,
    # which aiortc encodes every call's audio and video on, is never used for them
    assert any(n.startswith("talkloop-control") for n in names)
    assert not any(n.startswith("asyncio_") for n in names)
    assert left == 0


class Boom(RuntimeError):
    pass


def test_a_generation_failure_ends_that_session_only_and_says_so(live_pipeline, caplog) -> None:
    async def body(server, ws_url, port):
        async with websockets.connect(ws_url) as ok, websockets.connect(ws_url) as bad:
            await until(ok, "session")
            token = (await until(bad, "session"))["token"]
            call = server.calls[token].call
            agent = await websockets.connect(ws_url + f"?token={token}&role=agent")
            await until(agent, "agent")

            def broken(*a, **k):
                raise Boom("the model fell over")

            call.avatar.frames.write = broken  # its first chunk's frames cannot be published
            call.start()
            page_err = await until(bad, "error")
            agent_err = await until(agent, "error")
            with pytest.raises(ConnectionClosed):
                await until(bad, "never", 10)
            await asyncio.sleep(0.3)  # time for a warning storm, if there were one
            left = list(server.calls)
            await ok.send(json.dumps({"type": "prompt", "text": "calm"}))
            still = await until(ok, "stats")
            await agent.close()
        return page_err, agent_err, token, left, still

    with caplog.at_level(logging.WARNING):
        page_err, agent_err, token, left, still = run(
            with_server(live_pipeline, body, max_sessions=2), 90
        )
    assert page_err["code"] == agent_err["code"] == "generation_failed"
    assert "the model fell over" in page_err["message"]
    assert token not in left and len(left) == 1 and still["type"] == "stats"
    rejected = [r for r in caplog.records if "driving audio rejected" in r.getMessage()]
    assert len(rejected) <= 1
    failed = [r for r in caplog.records if "generation failed" in r.getMessage()]
    assert len(failed) == 1  # the real failure is logged once, with its traceback


def test_stopping_the_server_mid_call_logs_no_traceback(live_pipeline, caplog) -> None:
    async def body(server, ws_url, port):
        ws = await websockets.connect(ws_url)
        token = (await until(ws, "session"))["token"]
        server.calls[token].call.start()
        await until(ws, "stats")
        await asyncio.sleep(0.5)
        return server.calls[token].call

    with caplog.at_level(logging.WARNING):
        call = run(with_server(live_pipeline, body), 90)
    assert not call.avatar.generating
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert noisy == [], [r.getMessage() for r in noisy]
