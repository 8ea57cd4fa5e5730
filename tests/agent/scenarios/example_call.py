"""The example agent drives a live session end to end: an aiortc viewer opens the session, then
examples/agent.py (a separate process) joins with the agent URL the page shows, speaks two lines and interrupts the
second. Prints RESULT with the agent's playback events and what the viewer received."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "rtc" / "scenarios"))

from talkloop.agent.tts import EspeakTTS  # noqa: E402
from talkloop.rtc.call import CallConfig  # noqa: E402
from talkloop.rtc.client import run_call  # noqa: E402

from common import start_server, tiny_live_pipeline  # noqa: E402
from support import emit  # noqa: E402

LINES = [
    "Hello there, I am the avatar.",
    "This second sentence is long, and the agent will cut it off before it ends.",
]


async def main() -> None:
    pipeline = tiny_live_pipeline(128)
    server, url = await start_server(pipeline, call_config=CallConfig())
    tokens: asyncio.Queue[str] = asyncio.Queue()
    server.on_call = lambda call: tokens.put_nowait(call.token)
    # The call outlasts the agent by a margin: its process spends seconds importing before it
    # joins, more on a busy machine, and a call that ends first makes it exit with an error.
    call = asyncio.create_task(run_call(url, 20.0))
    token = await asyncio.wait_for(tokens.get(), 30)
    await asyncio.sleep(1.5)  # the call is up
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples" / "agent.py"),
        "--url",
        f"{url}?token={token}&role=agent",  # the agent URL as the page shows it
        "--interrupt-after",
        "0.8",
        *LINES,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    r = await call
    await server.stop()
    tts = EspeakTTS()
    durations_ms = [1000 * (await tts.synthesize(line, 16000)).shape[0] / 16000 for line in LINES]
    events = [json.loads(x) for x in out.decode().splitlines() if x.startswith("{")]
    emit(
        {
            **r.summary(),
            "video_pts": r.video_pts,
            "agent_rc": proc.returncode,
            "agent_stderr": err.decode()[-2000:],
            "events": events,
            "durations_ms": durations_ms,
            "audio_rms": r.audio_rms,
            "sessions_left": len(server.calls),
        }
    )


asyncio.run(main())
