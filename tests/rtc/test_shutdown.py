"""`talkloop serve` stops cleanly on SIGTERM and Ctrl-C (SIGINT) in the middle of a call (the
avatar generating): exit 0, "stopped", no traceback."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import websockets

from support import offer_without_candidates

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_without_a_traceback(sig) -> None:
    cmd = [
        sys.executable,
        "-m",
        "talkloop.pipeline.cli",
        "serve",
        "--family",
        "studio",
        "--untrained",
        "--preset",
        "tiny",
    ]
    cmd += ["--size", "64", "--port", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line, deadline = "", time.monotonic() + 120
        while "serving on" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        url = re.search(r"http://([\d.]+:\d+)/", line)
        assert url, f"no 'serving on' line: {line!r} {proc.stderr.read()[-2000:]}"

        async def session_then_signal() -> list[str]:
            async with websockets.connect(f"ws://{url.group(1)}/ws") as ws:
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
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "talkloop: stopped" in out
    assert "Traceback" not in err and "generation failed" not in err, err[-2000:]
