"""`talkloop serve` stops cleanly on SIGTERM and Ctrl-C (SIGINT) in the middle of a call (the
avatar generating): exit 0, "stopped", no traceback."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
import websockets

from support import offer_without_candidates, serving, tiny_args

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_without_a_traceback(sig) -> None:
    args = [*tiny_args(), "--port", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    with serving(args, timeout=120, env=env) as served:
        proc = served.proc

        async def session_then_signal() -> list[str]:
            async with websockets.connect(served.url.replace("http://", "ws://") + "ws") as ws:
                assert json.loads(await ws.recv())["type"] == "session"
                await ws.send(
                    json.dumps({"type": "offer", "sdp": await offer_without_candidates()})
                )
                while json.loads(await ws.recv())["type"] != "stats":  # generating now
                    pass
                proc.send_signal(sig)
                got = []
                try:
                    while True:
                        got.append(await asyncio.wait_for(ws.recv(), 30))
                except websockets.ConnectionClosed:
                    return got

        asyncio.run(session_then_signal())
        out, err = served.stop(None)
    assert proc.returncode == 0, err[-2000:]
    assert "talkloop: stopped" in out
    assert "Traceback" not in err and "generation failed" not in err, err[-2000:]
