"""Live behaviour: interrupting speech, and generation that falls behind real time.

--case interrupt: the client asks the avatar to say a long sentence, interrupts after 2 s; the
  returned audio must fall silent and the queued speech be gone.
--case slow: generation is slowed to 2.5x real time for 3 s (a throttle stage in the publish
  phase), then recovers; audio must never stop, late frames must be counted, and the lag must
  come back down afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import websockets
from aiortc import RTCPeerConnection, RTCSessionDescription

from talkloop.pipeline.audio.pcm import pcm16_to_float
from talkloop.pipeline.core.graph import default_phases
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.core.stage import Stage, StageContext
from talkloop.rtc.client import CallResult

from common import emit, start_server, tiny_live_pipeline


class Throttle(Stage):
    """Sleeps in the publish phase between ``start`` and ``stop`` seconds after the first call."""

    name = "throttle"
    reads = ("segment_latents",)

    def __init__(self, fps: int, factor: float, start: float, stop: float) -> None:
        self.fps, self.factor, self.start, self.stop = fps, factor, start, stop
        self.t0: float | None = None

    def run(self, ctx: StageContext) -> None:
        self.t0 = self.t0 or time.monotonic()
        if self.start <= time.monotonic() - self.t0 < self.stop:
            frames = ctx.read("segment_latents").shape[0]
            time.sleep(self.factor * frames / self.fps)


async def interrupt_case() -> dict:
    pipeline = tiny_live_pipeline(128)
    server, url = await start_server(pipeline)
    pc = RTCPeerConnection()
    from talkloop.rtc.client import WavMicrophone

    pc.addTrack(WavMicrophone(np.zeros(0, np.float32), 16000))
    pc.addTransceiver("video", direction="recvonly")
    rms: list[tuple[float, float]] = []

    async def read_audio(track) -> None:
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            pcm = pcm16_to_float(frame.to_ndarray())
            rms.append((time.monotonic(), float(np.sqrt(np.mean(pcm**2)))))

    tasks = []
    pc.on(
        "track",
        lambda t: tasks.append(asyncio.ensure_future(read_audio(t))) if t.kind == "audio" else None,
    )
    events = []
    async with websockets.connect(url) as ws:
        await ws.recv()
        await pc.setLocalDescription(await pc.createOffer())
        await ws.send(json.dumps({"type": "offer", "sdp": pc.localDescription.sdp}))

        async def receive():
            async for raw in ws:
                msg = json.loads(raw)
                if msg["type"] == "answer":
                    await pc.setRemoteDescription(RTCSessionDescription(msg["sdp"], "answer"))
                elif msg["type"] in ("speech", "stats", "error"):
                    events.append({**msg, "t": time.monotonic()})

        rx = asyncio.ensure_future(receive())
        await asyncio.sleep(1.0)
        text = "This is a long sentence that the avatar will not be allowed to finish saying, " * 3
        await ws.send(json.dumps({"type": "say", "text": text}))
        await asyncio.sleep(2.5)
        t_int = time.monotonic()
        await ws.send(json.dumps({"type": "interrupt"}))
        await asyncio.sleep(2.5)
        rx.cancel()
    await pc.close()
    for t in tasks:
        t.cancel()
    await server.stop()
    before = [r for t, r in rms if t_int - 1.0 <= t < t_int]
    after = [r for t, r in rms if t >= t_int + 0.3]
    stats = [e for e in events if e["type"] == "stats" and e["t"] > t_int + 0.5]
    return {
        "rms_before": float(np.max(before)) if before else 0.0,
        "rms_after_max": float(np.max(after)) if after else 1.0,
        "audio_frames_after": len(after),
        "speech_events": [e["state"] for e in events if e["type"] == "speech"],
        "speech_pending_after": stats[-1]["speech_pending_s"] if stats else None,
        "errors": [e for e in events if e["type"] == "error"],
    }


async def slow_case() -> dict:
    base = tiny_live_pipeline(128)
    phases = default_phases(base.config)
    throttle = Throttle(base.info.fps, factor=2.5, start=3.0, stop=6.0)
    phases["publish"].stages = [throttle, *phases["publish"].stages]
    pipeline = Pipeline(base.config, base.modules, phases)
    server, url = await start_server(pipeline)
    # The client runs in its own process, as a browser would: in this one it would share the
    # server's GIL and event loop, and its own pauses would show up as gaps in the audio.
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "client.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "talkloop.rtc.client", url, "16", str(out)
        )
        await proc.wait()
        r = CallResult(**json.loads(out.read_text()))
    await server.stop()
    t = np.array(r.audio_times)
    gaps = np.diff(t) if t.size > 1 else np.zeros(1)
    lat = np.array(r.stamps_latency_ms)
    n = lat.size
    return {
        "audio_frames": int(t.size),
        "audio_span_s": float(t[-1] - t[0]) if t.size > 1 else 0.0,
        "max_audio_gap_ms": float(gaps.max() * 1000),
        "late_frames": r.stats[-1]["late_frames"] if r.stats else None,
        "dropped_frames": r.stats[-1]["dropped_frames"] if r.stats else None,
        "latency_early_ms": float(np.median(lat[n // 8 : n // 4])) if n else None,
        "latency_late_ms": float(np.median(lat[-n // 8 :])) if n else None,
        "video_frames": len(r.video_times),
        "latency_by_second_ms": [float(np.median(lat[i : i + 25])) for i in range(0, n, 25)],
        "errors": r.errors,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=["interrupt", "slow"], required=True)
    args = ap.parse_args()
    emit(await (interrupt_case() if args.case == "interrupt" else slow_case()))


asyncio.run(main())
