"""``talkloop bench --offload``: resident vs offloaded vs sharded, side by side.

Each placement runs in its own process (sharded: two gloo/NCCL ranks under torchrun) on the same
config and audio. Reported per placement: ``rtf``, ``fps``, device-pool weight bytes and host
master bytes, block copies issued, and on CUDA ``peak_alloc_mb``, per-block exposed stall and
``swap_stall_ms``; on the CPU the copy/compute schedule head is printed instead of stalls.

Worker: ``python -m talkloop.pipeline.offload.bench SPEC.json RESULT.json`` (rank 0 writes RESULT).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from talkloop.pipeline.bench.worker import bench_reference, looped_speech
from talkloop.pipeline.core.config import TalkloopConfig, build_config
from talkloop.pipeline.core.errors import TalkloopError
from talkloop.pipeline.models.registry import build_pipeline, load_modules
from talkloop.pipeline.offload.device import make_ops
from talkloop.pipeline.offload.distributed import env_world_size, is_publisher
from talkloop.pipeline.offload.offloaded import BlockOffloader
from talkloop.pipeline.offload.placement import memory_report

PLACEMENTS = ("resident", "offloaded", "sharded")
BLOCK_MODULES = ("a2v", "sr")


def _launch(spec: dict, mode: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps({**spec, "placement": mode}))
        cmd = [
            sys.executable,
            "-m",
            "talkloop.pipeline.offload.bench",
            str(spec_path),
            str(result_path),
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        if mode == "sharded":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            cmd += ["--nproc-per-node", "2", "-m", "talkloop.pipeline.offload.bench"]
            cmd += [str(spec_path), str(result_path)]
            if spec["config"]["model"]["device"] == "cpu":
                env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU mesh; CUDA + gloo crashed (pt#132471)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise TalkloopError(
                f"offload bench {mode} failed:\n{(proc.stdout + proc.stderr)[-2000:]}"
            )
        return json.loads(result_path.read_text())


def run_offload_bench(args: argparse.Namespace, config: TalkloopConfig, seconds: float) -> int:
    """Run every placement for ``seconds`` of video, print a table, write offload.json."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    spec = {"config": config.model_dump(mode="json"), "seconds": seconds}
    rows = []
    for mode in PLACEMENTS:
        print(f"  running {mode} (a2v, sr) {seconds:g} s ...", flush=True)
        rows.append(_launch(spec, mode))
    (out / "offload.json").write_text(
        json.dumps({"config": spec["config"], "runs": rows}, indent=2)
    )
    print_table(rows)
    print(f"wrote {out / 'offload.json'}")
    return 0


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'placement':10s} {'ranks':>5s} {'rtf':>6s} {'fps':>6s} {'device_mb':>10s} "
        f"{'host_mb':>8s} {'copies':>7s} {'peak_alloc_mb':>13s} {'stall_ms_p50':>12s} "
        f"{'swap_stall_ms':>13s}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['placement']:10s} {r['ranks']:5d} {r['rtf']:6.3f} {r['fps']:6.1f} "
            f"{r['device_mb']:10.2f} {r['host_mb']:8.2f} {r['copies']:7d} "
            f"{_f(r['peak_alloc_mb'], '.0f'):>13s} {_f(r['stall_ms_p50'], '.3f'):>12s} "
            f"{_f(r['swap_stall_ms'], '.3f'):>13s}"
        )
    for r in rows:
        if r.get("schedule_head"):
            print(
                f"schedule ({r['placement']}, a2v, first entries): {' '.join(r['schedule_head'])}"
            )


def _worker(spec: dict) -> dict | None:

    cfg = spec["config"]
    cfg["model"]["placement"] = {m: spec["placement"] for m in BLOCK_MODULES}
    config = build_config(**cfg)
    modules = load_modules(config)
    offloaders = [m.runtime for m in modules.values() if isinstance(m.runtime, BlockOffloader)]
    ops = offloaders[0].ops if offloaders else None
    for off in offloaders:
        off.measure = True
    pipeline = build_pipeline(config, modules)
    v = config.video

    class Count:
        frames = 0

        def open(self, info: object) -> None: ...

        def write(self, video, audio) -> None:  # noqa: ANN001 - the sink protocol
            Count.frames += len(video)

        def close(self) -> None: ...

        abort = close

    session = pipeline.open_session(bench_reference(config), sinks=[Count()])
    t0 = time.perf_counter()
    session.render(looped_speech(config.audio.sample_rate, spec["seconds"]))
    wall = time.perf_counter() - t0
    frames = session.stats.frames
    mem = memory_report(modules)
    stalls = [off.stalls() for off in offloaders]
    per_block = [x for s in stalls for x in s["per_block"]]
    swap = [x for s in stalls for x in s["swap_stall_ms"]]
    peak = None
    if config.model.device == "cuda":
        peak = make_ops("cuda").memory_stats()["peak_device_mb"]
    if not is_publisher():
        return None
    return {
        "placement": spec["placement"],
        "ranks": env_world_size(),
        "seconds": spec["seconds"],
        "frames": frames,
        "rtf": wall / max(frames / v.fps, 1e-9),
        "fps": frames / wall,
        "device_mb": sum(m.device_bytes for m in mem) / 2**20,
        "host_mb": sum(m.host_bytes for m in mem) / 2**20,
        "copies": sum(1 for e in ops.schedule.entries if e.op == "copy") if ops else 0,
        "peak_alloc_mb": peak,
        "stall_ms_p50": float(np.median(per_block)) if per_block else None,
        "swap_stall_ms": float(np.mean(swap)) if swap else None,
        "schedule_head": ops.schedule.ops("a2v")[:16] if ops else [],
    }


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    result = _worker(spec)
    if result is not None:
        Path(argv[1]).write_text(json.dumps(result))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
