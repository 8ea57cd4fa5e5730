"""Per-network timings of the studio family on each backend: ``python -m talkloop.pipeline.models.studio.bench``.

Each network is called on fixed inputs at the default schedule's shapes (decoder micro-batch 3
and the live schedule's 5, one A2V step over ctx_len + n_len = 26 frames, SR and mouth net over a
24-frame segment); the figures are the minimum wall time and the minimum process CPU time of ``--runs`` calls
after a warm-up, the backends interleaved call by call, so a busy neighbour on a shared machine
slows all of them alike.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from talkloop.pipeline.backends.runtime import graph_threads, set_graph_threads
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.models.registry import load_modules


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=0, help="compute threads (0: torch's default)")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--backends", default="torch,onnxruntime,openvino")
    args = p.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
        set_graph_threads(args.threads)
    threads = graph_threads()

    nets = {}
    for b in args.backends.split(","):
        modules = load_modules(build_config(model={"family": "studio", "backend": b}))
        nets[b] = {name: m.net for name, m in modules.items()}
    # An exported backend leaves torch one thread for its glue (studio ``use_backend``); the
    # torch networks timed here get the graphs' threads back, so both compute alike.
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    f = 26
    inputs = {
        "decoder b3": lambda n: (n["vae"].decoder, (torch.randn(3, 24, 32, 32, generator=g),)),
        "decoder b5": lambda n: (n["vae"].decoder, (torch.randn(5, 24, 32, 32, generator=g),)),
        "a2v step F26": lambda n: (
            n["a2v"],
            (
                torch.randn(1, f, 8, 16, 16, generator=g),
                torch.rand(1, f, generator=g),
                torch.arange(f, dtype=torch.float32)[None] - 2,
                torch.randn(1, 8, 16, 16, generator=g),
                torch.randn(1, f, 128, generator=g),
                torch.randn(1, 384, generator=g),
            ),
        ),
        "sr T24": lambda n: (
            n["sr"],
            (torch.randn(24, 8, 16, 16, generator=g), torch.randn(1, 8, 32, 32, generator=g)),
        ),
        "mouth T24": lambda n: (
            n["mouth"],
            (torch.randn(24, 8, 32, 32, generator=g), torch.randn(24, 128, generator=g)),
        ),
    }
    result: dict[str, dict[str, float]] = {}
    # CPU seconds of the whole process (all its threads): with --threads 1 on a busy machine,
    # closer to a quiet machine's wall time than the wall time is.
    cpu_ms: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for name, make in inputs.items():
            calls = {}
            for b in nets:
                net, x = make(nets[b])
                if name.startswith("decoder") and b == "torch":
                    x = (x[0].contiguous(memory_format=torch.channels_last),)
                net(*x)  # warm-up (a new shape compiles here)
                calls[b] = (net, x)
            best = dict.fromkeys(calls, float("inf"))
            cpu = dict.fromkeys(calls, float("inf"))
            for _ in range(args.runs):
                for b, (net, x) in calls.items():
                    t0, c0 = time.perf_counter(), time.process_time()
                    net(*x)
                    best[b] = min(best[b], time.perf_counter() - t0)
                    cpu[b] = min(cpu[b], time.process_time() - c0)
            result[name] = {b: round(s * 1000, 1) for b, s in best.items()}
            cpu_ms[name] = {b: round(s * 1000, 1) for b, s in cpu.items()}
            print(
                f"{name:14s} "
                + "  ".join(
                    f"{b} {ms:7.1f} ms (cpu {cpu_ms[name][b]:7.1f})"
                    for b, ms in result[name].items()
                )
            )
    print(json.dumps({"threads": threads, "min_ms": result, "cpu_ms": cpu_ms}))


if __name__ == "__main__":
    main()
