"""`talkloop bench --live`: a real call against a real server, measured from the client side.

The server stamps into every frame the wall-clock time at which that frame's audio reached the
peer; the client reads the stamp when it has decoded the frame, so ``glass_to_glass_ms`` covers
microphone audio in -> generated -> encoded -> sent -> received -> decoded.

An agent joins the call (the websocket agent protocol) and speaks ``REPLIES`` replies with pauses
between them, each sent at ``REPLY_SPEEDUP`` times real time as a streaming TTS sends it:
``reply_latency_ms`` is, per reply, from its first byte leaving the agent (loopback: reaching the
server) to its first audible sample arriving at the client. Runs in its own process; as root with
`unshare` available it runs in a private network namespace (loopback only).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import websockets

from talkloop.pipeline.assets import HELLO_WAV
from talkloop.pipeline.audio.io import load_audio
from talkloop.pipeline.audio.pcm import float_to_pcm16
from talkloop.pipeline.bench.memory import memory_trend
from talkloop.pipeline.bench.worker import bench_reference, rss_mb
from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.models.registry import build_pipeline
from talkloop.rtc.call import CallConfig
from talkloop.rtc.client import MARKER_HZ, CallResult
from talkloop.rtc.server import AvatarServer

if TYPE_CHECKING:
    from talkloop.rtc.client import CallResult
    from talkloop.rtc.server import AvatarServer

HOST_IN_NETNS = "127.0.0.2"
REPLIES = 10
REPLY_S = 1.5  # each reply: this much speech from the bundled voice
# A reply starts this often (the rest is the pause after it): not a whole number of blocks, so
# that the replies meet the 20 ms grid the clock jumps by at phases spread over it.
REPLY_EVERY_S = 5.013
REPLY_SPEEDUP = 2.0
AGENT_RATE = 24000  # what voice agents' TTS sends (OpenAI Realtime)
MARKER_AMP = 0.05  # each reply carries a faint MARKER_HZ tone (the model's 16 kHz never sees it)


async def measure(spec: dict) -> dict:

    config = TalkloopConfig.model_validate(spec["config"])
    pipeline = await asyncio.to_thread(build_pipeline, config)
    live = CallConfig(**{**spec.get("live", {}), "stamp_frames": True})
    reference = bench_reference(config)
    server = AvatarServer(pipeline, reference, "", live, 1, "")
    port = await server.start(spec["host"], 0)
    seconds = float(spec["seconds"])
    memory: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample_memory() -> None:
        t0 = time.monotonic()
        while not stop.wait(1.0):
            memory.append((time.monotonic() - t0, rss_mb()))

    url = f"ws://{spec['host']}:{port}/ws"
    cycles = int(spec.get("cycles", 0))
    if cycles:
        try:
            return await measure_cycles(server, url, seconds, cycles)
        finally:
            await server.stop()
    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    replies: list[float] = []
    agent = asyncio.ensure_future(agent_replies(server, url, seconds, replies))
    result = await client_call(url, seconds)
    stop.set()
    agent.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await agent
    await server.stop()
    warm = int(config.video.fps * 2)  # the first two seconds include connection set-up
    g2g = (
        np.array(result.stamps_latency_ms[warm:])
        if len(result.stamps_latency_ms) > warm
        else np.zeros(0)
    )
    offsets = [
        (i, s["av_offset_ms"])
        for i, s in enumerate(result.stats)
        if s.get("av_offset_ms") is not None
    ]
    last = result.stats[-1] if result.stats else {}
    mem = np.array(memory)
    reply_ms = reply_latencies(replies, result)
    return {
        "seconds": seconds,
        "reply_latency_ms": {
            "p50": float(np.percentile(reply_ms, 50)) if reply_ms.size else None,
            "p95": float(np.percentile(reply_ms, 95)) if reply_ms.size else None,
            "n": int(reply_ms.size),
            "sent": len(replies),
            "speedup": REPLY_SPEEDUP,
            "started_early": last.get("early_replies"),  # the server's count
            # per early start (the server's stats, once a second, carry the latest): how long
            # its audio waited to start, and how long from the start until it played
            **early_start_figures(result.stats),
        },
        "video_frames": len(result.video_times),
        "fps": result.summary()["fps"],
        "codec": result.codec,
        "glass_to_glass_ms": {
            "p50": float(np.percentile(g2g, 50)) if g2g.size else None,
            "p95": float(np.percentile(g2g, 95)) if g2g.size else None,
            "max": float(g2g.max()) if g2g.size else None,
            "samples": int(g2g.size),
            "unreadable": result.stamps_unreadable,
        },
        "av_offset_ms": {
            "end": offsets[-1][1] if offsets else None,
            "first": offsets[0][1] if offsets else None,
            "max_abs": max((abs(o) for _, o in offsets), default=None),
            "trend_ms_per_min": float(
                np.polyfit([i / 60 for i, _ in offsets], [o for _, o in offsets], 1)[0]
            )
            if len(offsets) >= 3
            else None,
        },
        "frames_sent": last.get("frames_sent"),
        "late_frames": last.get("late_frames"),
        "dropped_frames": last.get("dropped_frames"),
        "skipped_frames": last.get("skipped_frames"),
        # frame slots the sender missed because it came after the next frame was due (encoder or
        # event loop behind); it then sends the frame due now, so this costs frames, not lag
        "overrun_frames": last.get("overrun_frames"),
        # Cumulative late frames at every stats message (one a second): when they happened.
        "late_timeline": [s.get("late_frames") for s in result.stats],
        "mic_backlog_ms": [s.get("mic_backlog_ms") for s in result.stats],
        "rtf": last.get("rtf"),
        "stage_rtf": last.get("stage_rtf") or {},  # where the server's generation time goes
        "runtime": last.get("runtime"),  # the server's backend, dtype and int8 networks
        "peak_rss_mb": float(mem[:, 1].max()) if mem.size else None,
        # RSS growth in the first WARMUP_S of the call, then the slope of the rest
        **memory_trend(memory),
        "memory": memory,
        "errors": result.errors,
    }


async def agent_replies(server: AvatarServer, url: str, seconds: float, sent: list[float]) -> None:
    """The call's agent: ``REPLIES`` replies, the first byte of each stamped into ``sent``."""
    speech = load_audio(HELLO_WAV, AGENT_RATE)
    start = int(np.argmax(np.abs(speech) > 0.05))  # from its first audible sample on
    reply = speech[start : start + int(REPLY_S * AGENT_RATE)]
    reply = reply + MARKER_AMP * np.sin(2 * np.pi * MARKER_HZ * np.arange(len(reply)) / AGENT_RATE)
    while not server.calls:  # the client's call: its token
        await asyncio.sleep(0.05)
    token = next(iter(server.calls))
    async with websockets.connect(f"{url}?token={token}&role=agent") as ws:
        await ws.recv()  # the hello
        await ws.send(
            json.dumps({"type": "audio_format", "sample_rate": AGENT_RATE, "channels": 1})
        )
        t0 = time.monotonic()
        block = AGENT_RATE // 50  # 20 ms
        for i in range(REPLIES):
            at = t0 + 1.0 + REPLY_EVERY_S * i
            if at + REPLY_S + 1.5 > t0 + seconds:
                break  # no room left for this reply and its playout
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            sent.append(time.monotonic())
            for j in range(0, len(reply), block):
                await ws.send(float_to_pcm16(reply[j : j + block]).tobytes())
                await asyncio.sleep(0.02 / REPLY_SPEEDUP)
            await ws.send(json.dumps({"type": "segment_end"}))


def early_start_figures(stats: list[dict]) -> dict:
    """``waited_ms`` and ``plays_in_ms`` ``{p50, p95, n}`` over the call's early starts."""
    seen: dict[int, dict] = {}
    for msg in stats:
        if msg.get("early_reply") is not None:
            seen[int(msg.get("early_replies", 0))] = msg["early_reply"]
    out = {}
    for key in ("waited_ms", "plays_in_ms"):
        x = np.array([e[key] for e in seen.values()], np.float64)
        out[key] = {
            "p50": float(np.percentile(x, 50)) if x.size else None,
            "p95": float(np.percentile(x, 95)) if x.size else None,
            "n": int(x.size),
        }
    return out


def reply_latencies(sent: list[float], result: CallResult) -> np.ndarray:
    """Per reply: ms from its first byte to the first output frame after it that carries the
    reply's marker tone (the echoed microphone has none: it is 16 kHz speech)."""
    times, marker = np.array(result.audio_times), np.array(result.audio_marker)
    out = []
    for at in sent:
        after = np.flatnonzero((times >= at) & (marker > MARKER_AMP / 2))
        if after.size:
            out.append(1000 * (times[after[0]] - at))
    return np.array(out)


async def client_call(url: str, seconds: float) -> CallResult:
    """One call from a client in its own process, like a browser: its decoding must not share
    the server's interpreter (GIL) and distort the server's figures."""

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "client.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "talkloop.rtc.client", url, str(seconds), str(out), "--stamps"
        )
        await proc.wait()
        return CallResult(**json.loads(out.read_text()))


async def measure_cycles(server: AvatarServer, url: str, seconds: float, cycles: int) -> dict:
    """``cycles`` calls in a row, each hung up after ``seconds``: the server's RSS after each
    (after a warm-up call that fills codec, thread and allocator pools) must come back to where
    it started, and no call may be left open."""
    await client_call(url, seconds)  # warm-up
    await asyncio.sleep(0.5)
    gc.collect()
    base = rss_mb()
    rss: list[float] = []
    errors: list[dict] = []
    fps: list[float] = []
    for _ in range(cycles):
        result = await client_call(url, seconds)
        errors += result.errors
        fps.append(result.summary()["fps"])
        await asyncio.sleep(0.2)
        gc.collect()
        rss.append(rss_mb())
    return {
        "cycles": cycles,
        "seconds": seconds,
        "base_rss_mb": base,
        "rss_mb": rss,
        "end_minus_base_mb": rss[-1] - base,
        "max_minus_base_mb": max(rss) - base,
        "calls_left_open": len(server.calls),
        "fps_min": min(fps),
        "errors": errors,
    }


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(asyncio.run(measure(spec))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
