"""A voice agent in another process: speaks lines through a running talkloop session.

Open the page (or any viewer) first; it shows the session token. Then:

    python examples/agent.py --url ws://127.0.0.1:8080/ws --token <token> "Hello." "How are you?"

Each line is synthesised with the built-in TTS (espeak-ng), streamed as binary PCM16 while it is
being made, and closed with segment_end. With --interrupt-after S the agent interrupts the last
line S seconds after it started playing (as it would when the user barges in). Playback events
are printed as JSON lines, e.g. ``{"type": "playback_finished", "position_ms": 1480, ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import websockets

# Run as a script, this file's folder comes first on sys.path, and the file, being named like
# the package it uses, would shadow it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from agent.tts import EspeakTTS, TTSOptions  # noqa: E402


async def run(url: str, token: str, lines: list[str], interrupt_after: float | None) -> None:
    tts = EspeakTTS(TTSOptions())
    async with websockets.connect(f"{url}?token={token}&role=agent", max_size=2**20) as ws:
        hello = json.loads(await ws.recv())
        if hello["type"] != "agent":
            raise SystemExit(f"not accepted: {hello}")
        await ws.send(json.dumps({"type": "audio_format", "sample_rate": tts.sample_rate}))
        finished: asyncio.Queue[dict] = asyncio.Queue()
        started: asyncio.Queue[dict] = asyncio.Queue()

        async def events() -> None:
            async for raw in ws:
                msg = json.loads(raw)
                print(json.dumps(msg), flush=True)
                if msg["type"] == "playback_finished":
                    finished.put_nowait(msg)
                elif msg["type"] == "playback_started":
                    started.put_nowait(msg)

        reader = asyncio.create_task(events())
        for i, line in enumerate(lines):
            while not started.empty():  # only this line's playback_started counts below
                started.get_nowait()
            async for frame in tts.stream(line):  # send while espeak is still synthesising
                await ws.send(frame.data)
            await ws.send(json.dumps({"type": "segment_end"}))
            if interrupt_after is not None and i == len(lines) - 1:
                await started.get()
                await asyncio.sleep(interrupt_after)
                await ws.send(json.dumps({"type": "interrupt"}))
            await finished.get()  # one segment at a time, like a turn-taking agent
        await ws.send(json.dumps({"type": "bye"}))
        reader.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="ws://127.0.0.1:8080/ws")
    ap.add_argument("--token", required=True, help="the session token the page shows")
    ap.add_argument("--interrupt-after", type=float, default=None, metavar="S")
    ap.add_argument("lines", nargs="*", default=["Hello, I am your avatar.", "Nice to meet you."])
    args = ap.parse_args()
    asyncio.run(run(args.url, args.token, args.lines, args.interrupt_after))


if __name__ == "__main__":
    main()
