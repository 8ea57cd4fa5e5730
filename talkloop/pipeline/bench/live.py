"""`talkloop bench --live`: a real call against a real server, measured from the client side.

The server stamps into every frame the wall-clock time at which that frame's audio reached the
peer; the client reads the stamp when it has decoded the frame, so ``glass_to_glass_ms`` covers
microphone audio in -> generated -> encoded -> sent -> received -> decoded. Runs in its own
process; as root with `unshare` available it runs in a private network namespace (loopback only).
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from talkloop.pipeline.bench.memory import memory_trend
from talkloop.pipeline.bench.worker import bench_reference, rss_mb
from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.models.registry import build_pipeline
from talkloop.rtc.call import CallConfig
from talkloop.rtc.client import CallResult
from talkloop.rtc.server import AvatarServer

if TYPE_CHECKING:
    from talkloop.rtc.client import CallResult
    from talkloop.rtc.server import AvatarServer

HOST_IN_NETNS = "127.0.0.2"


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
    result = await client_call(url, seconds)
    stop.set()
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
    return {
        "seconds": seconds,
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


async def client_call(url: str, seconds: float) -> CallResult:
    """One call from a client in its own process, like a browser: its decoding must not share
    the server's interpreter (GIL) and distort the server's figures."""

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "client.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "talkloop.rtc.client", url, str(seconds), str(out)
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
