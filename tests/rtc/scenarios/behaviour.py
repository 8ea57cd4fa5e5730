"""Live behaviour: interrupting speech, and generation that falls behind real time.

Judged by media position and order of events, never by arrival times (a busy machine delays
packets, not media timestamps):

--case interrupt: the client asks the avatar to say a long sentence and, once it has heard some
  of it, interrupts; the server's cut (the first output sample the interrupt silenced) is noted,
  and every sample the client receives from that media position on must be silent, the queued
  speech gone.
--case slow: generating the chunks of media seconds 3-6 is slowed to 2.5x real time (a throttle
  stage in the publish phase, by frame index, not by clock); audio must never skip, the late
  frames must be counted, and frames made after the slowness must be shown on time again (each
  frame carries its number: tests/rtc/scenarios/common.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np
import websockets
from aiortc import RTCPeerConnection, RTCSessionDescription

from talkloop.pipeline.audio.pcm import pcm16_to_float
from talkloop.pipeline.bench.worker import looped_speech
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.core.stage import Stage, StageContext
from talkloop.pipeline.models.registry import family_phases
from talkloop.rtc.call import CallConfig
from talkloop.rtc.client import WavMicrophone, run_call

from common import FrameNumberStage, frame_numbers, start_server, tiny_live_pipeline
from support import emit

HANG_S = 60  # bounds a wait that should end in well under a second: a hang, not a timing


class Throttle(Stage):
    """Sleeps ``factor`` x the media duration of each segment that starts in frames
    ``[start, stop)`` (publish phase, first)."""

    name = "throttle"
    reads = ("segment_latents", "segment_start")

    def __init__(self, fps: int, factor: float, start: int, stop: int) -> None:
        self.fps, self.factor, self.start, self.stop = fps, factor, start, stop

    def run(self, ctx: StageContext) -> None:
        if self.start <= ctx.read("segment_start") < self.stop:
            frames = ctx.read("segment_latents").shape[0]
            time.sleep(self.factor * frames / self.fps)


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        await asyncio.sleep(0.01)


async def interrupt_case() -> dict:
    pipeline = tiny_live_pipeline(128)
    server, url = await start_server(pipeline)
    cuts: list[int] = []

    def watch(call) -> None:  # note the server's cut: the first output sample it silences
        avatar, clear = call.avatar, call.avatar.clear_buffer

        def clear_buffer():
            cuts.append(avatar.driver.out_index(avatar._audio_next))
            return clear()

        avatar.clear_buffer = clear_buffer

    server.on_call = watch
    pc = RTCPeerConnection()
    pc.addTrack(WavMicrophone(np.zeros(0, np.float32), 16000))
    pc.addTransceiver("video", direction="recvonly")
    pts: list[int] = []
    rms: list[float] = []

    async def read_audio(track) -> None:
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            pcm = pcm16_to_float(frame.to_ndarray())
            pts.append(int(frame.pts))
            rms.append(float(np.sqrt(np.mean(pcm**2))))

    tasks = []
    pc.on(
        "track",
        lambda t: tasks.append(asyncio.ensure_future(read_audio(t))) if t.kind == "audio" else None,
    )
    events: list[dict] = []
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
                    events.append(msg)

        rx = asyncio.ensure_future(receive())
        await until(lambda: len(rms) > 0, "the avatar's audio")
        text = "This is a long sentence that the avatar will not be allowed to finish saying, " * 3
        await ws.send(json.dumps({"type": "say", "text": text}))
        await until(lambda: sum(x > 0.05 for x in rms) >= 25, "half a second of speech")
        await ws.send(json.dumps({"type": "interrupt"}))
        await until(lambda: any(e.get("state") == "interrupted" for e in events), "interrupted")
        heard = len(rms)
        await until(lambda: len(rms) >= heard + 75, "1.5 s of audio after the interrupt")
        stats_seen = sum(e["type"] == "stats" for e in events)
        await until(lambda: sum(e["type"] == "stats" for e in events) > stats_seen, "stats")
        rx.cancel()
    await pc.close()
    for t in tasks:
        t.cancel()
    await server.stop()
    # The audio track starts at media sample 0: a received block's place is its pts offset.
    at = np.array(pts) - pts[0]
    level = np.array(rms)
    cut = cuts[0] if cuts else -1
    # Opus's look-ahead (6.5 ms) carries the end of a frame's input into the next decoded frame:
    # the block that starts at the cut still holds the last of the speech; silence from the next.
    before, after = level[(at >= cut - 48000) & (at < cut)], level[at >= cut + 960]
    return {
        "cut": cut,
        "audio_pts": pts,
        "rms_before": float(before.max()) if before.size else 0.0,
        "rms_after_max": float(after.max()) if after.size else 1.0,
        "rms_after": [round(float(x), 4) for x in after[:10]],  # for a look after a failure
        "audio_frames_after": int(after.size),
        "speech_events": [e["state"] for e in events if e["type"] == "speech"],
        "speech_pending_after": [e for e in events if e["type"] == "stats"][-1]["speech_pending_s"],
        "errors": [e for e in events if e["type"] == "error"],
    }


THROTTLED = (75, 150)  # frames of media seconds 3-6


async def slow_case() -> dict:
    base = tiny_live_pipeline(128)
    phases = family_phases(base.config)
    throttle = Throttle(base.info.fps, 2.5, *THROTTLED)
    phases["publish"].stages = [throttle, *phases["publish"].stages, FrameNumberStage()]
    pipeline = Pipeline(base.config, base.modules, phases)
    server, url = await start_server(pipeline, call_config=CallConfig())
    seconds = 16.0
    mic = np.concatenate(list(looped_speech(16000, seconds + 5)))
    r = await run_call(url, seconds, mic=mic, keep_frames=100_000)
    await server.stop()
    stats = r.stats[-1] if r.stats else {}
    return {
        "video_pts": r.video_pts,
        "audio_pts": r.audio_pts,
        "numbers": frame_numbers(r.frames),
        "throttled": list(THROTTLED),
        "late_frames": stats.get("late_frames"),
        "dropped_frames": stats.get("dropped_frames"),
        "skipped_frames": stats.get("skipped_frames"),
        "rtf": stats.get("rtf"),
        "errors": r.errors,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=["interrupt", "slow"], required=True)
    args = ap.parse_args()
    emit(await (interrupt_case() if args.case == "interrupt" else slow_case()))


asyncio.run(main())
