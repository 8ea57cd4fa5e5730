"""``talkloop bench``: ttff, rtf, fps and memory of our pipeline against a naive baseline.

Each measured run is a separate process (``pipeline.bench.worker``) so its peak RSS is its own.
The naive baseline uses the same networks and schedule but keeps every latent and frame until the
end and encodes the mp4 last, as most open pipelines do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.core.config import TalkloopConfig
from pipeline.core.errors import ConfigError, TalkloopError


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--durations",
        default="10,600",
        help="seconds of generated video per run, comma-separated (default 10,600)",
    )
    p.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the naive keep-everything baseline (default on)",
    )
    p.add_argument("--ttff-runs", type=int, default=3, help="real-time-fed runs for ttff_ms")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for JSON and PNG")


def parse_durations(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--durations must be comma-separated seconds, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ConfigError(f"--durations must be positive seconds, got {text!r}")
    return values


def run_worker(spec: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline.bench.worker", str(spec_path), str(result_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        if proc.returncode != 0:
            raise TalkloopError(
                f"bench run {spec['mode']} {spec.get('seconds')} s failed:\n{proc.stdout[-2000:]}"
            )
        return json.loads(result_path.read_text())


def cmd_bench(args: argparse.Namespace, config: TalkloopConfig) -> int:
    durations = parse_durations(args.durations)
    cfg = config.model_dump(mode="json")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"talkloop bench: preset={config.model.preset} {config.video.width}x{config.video.height} "
        f"@{config.video.fps} fps, steps={config.sampler.steps}, dtype={config.model.dtype}, "
        f"threads={os.cpu_count()}",
        flush=True,
    )
    ttff = run_worker({"config": cfg, "mode": "ttff", "seconds": 0, "repeats": args.ttff_runs})[
        "ttff_ms"
    ]
    runs = []
    modes = ["ours", "naive"] if args.baseline else ["ours"]
    for seconds in durations:
        for mode in modes:
            print(f"  running {mode:5s} {seconds:g} s ...", flush=True)
            runs.append(run_worker({"config": cfg, "mode": mode, "seconds": seconds}))
    ttff_sorted = sorted(ttff)
    result = {
        "config": cfg,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor(),
        },
        "ttff_ms": ttff_sorted[len(ttff_sorted) // 2],
        "ttff_ms_runs": ttff,
        "runs": runs,
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    plot_memory(runs, out / "memory.png")
    print_table(result)
    print(f"wrote {out / 'bench.json'} and {out / 'memory.png'}")
    return 0


def print_table(result: dict) -> None:
    print(
        f"\nttff_ms (median of {len(result['ttff_ms_runs'])} real-time-fed runs): "
        f"{result['ttff_ms']:.0f}  (runs: {', '.join(f'{x:.0f}' for x in result['ttff_ms_runs'])})"
    )
    head = f"{'mode':6s} {'seconds':>8s} {'frames':>7s} {'rtf':>6s} {'fps':>7s} {'peak_rss_mb':>12s} {'mem_slope_mb_per_min':>21s}"
    print(head)
    print("-" * len(head))
    for r in result["runs"]:
        print(
            f"{r['mode']:6s} {r['seconds']:8g} {r['frames']:7d} {r['rtf']:6.3f} {r['fps']:7.1f} "
            f"{r['peak_rss_mb']:12.0f} {_fmt(r['mem_slope_mb_per_min']):>21s}"
        )


def _fmt(value: float | None, unit: str = "") -> str:
    """A figure, or n/a where it was not measured (a run too short for a slope)."""
    return "n/a" if value is None else f"{value:.2f}{unit}"


def plot_memory(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    colors = {"ours": "#1f77b4", "naive": "#d62728"}
    for r in runs:
        t = [s[0] / 60 for s in r["samples"]]
        m = [s[1] for s in r["samples"]]
        ax.plot(
            t,
            m,
            color=colors.get(r["mode"], "k"),
            alpha=0.85,
            label=f"{r['mode']} {r['seconds']:g} s (slope {_fmt(r['mem_slope_mb_per_min'], ' MB/min')})",
        )
    ax.set_xlabel("generated video (minutes)")
    ax.set_ylabel("resident memory (MB)")
    ax.set_title("talkloop memory against generated duration")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
