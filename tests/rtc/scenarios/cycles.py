"""20 calls in a row, each hung up after a second: everything a session held must be freed."""

from __future__ import annotations

import argparse
import asyncio
import gc
import threading
import weakref

import numpy as np

from talkloop.pipeline.bench.worker import rss_mb
from talkloop.rtc.client import run_call

from common import start_server, tiny_live_pipeline
from support import emit


def own_threads() -> list[str]:
    """Threads other than the worker pools (the event loop's and the server's control pool keep
    idle workers by design)."""
    pools = ("asyncio_", "talkloop-control")
    return sorted(t.name for t in threading.enumerate() if not t.name.startswith(pools))


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=20)
    args = ap.parse_args()
    pipeline = tiny_live_pipeline(128)
    server, url = await start_server(pipeline)
    refs: list[weakref.ref] = []
    server.on_call = lambda call: refs.append(weakref.ref(call))
    mic = np.zeros(16000, np.float32)
    await run_call(url, 1.0, mic=mic)  # warm-up: codecs, thread pools, allocator pools
    await asyncio.sleep(0.5)
    gc.collect()
    base_rss, base_threads = rss_mb(), own_threads()
    rss = []
    for _ in range(args.cycles):
        await run_call(url, 1.0, mic=mic)
        await asyncio.sleep(0.2)
        gc.collect()
        rss.append(rss_mb())
    await asyncio.sleep(0.5)
    gc.collect()
    alive = sum(1 for r in refs if r() is not None)
    emit(
        {
            "base_rss_mb": base_rss,
            "rss_mb": rss,
            "base_threads": base_threads,
            "threads": own_threads(),
            "sessions_left": len(server.calls),
            "tracked": len(refs),
            "alive_calls": alive,
        }
    )
    await server.stop()


asyncio.run(main())
