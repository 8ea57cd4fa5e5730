"""``talkloop bench``: ttff, rtf, fps and memory of our pipeline against a naive baseline.

Each measured run is a separate process (``talkloop.pipeline.bench.worker``) so its peak RSS is its own.
The naive baseline is our own pipeline made to keep everything: the same networks and schedule,
but every latent and frame is kept until the end and the mp4 is encoded last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from talkloop.pipeline.args import serve_flags
from talkloop.pipeline.bench.calls import AUDIO_GAP_S
from talkloop.pipeline.bench.memory import MIN_STEADY_S
from talkloop.pipeline.core.config import TalkloopConfig, build_config, cpu_info, native_bf16
from talkloop.pipeline.core.errors import ConfigError, TalkloopError
from talkloop.pipeline.models.sizes import warn_unless_native_size
from talkloop.pipeline.offload.bench import run_offload_bench
from talkloop.rtc.app import live_config_dict


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
    p.add_argument(
        "--offload",
        action="store_true",
        help="compare a2v/sr resident vs offloaded vs sharded (2 processes) for the shortest "
        "duration instead (docs/offload.md)",
    )


def add_live_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--live",
        action="store_true",
        help="measure a real WebRTC call instead: glass_to_glass_ms, fps, av_offset_ms",
    )
    p.add_argument("--seconds", type=float, default=60, help="length of the --live call")
    p.add_argument(
        "--calls",
        type=int,
        default=None,
        metavar="N",
        help="measure how many live calls at once this machine carries, 1 to N calls of "
        "--seconds each (clients on the same cores); the figure is cached for "
        "`talkloop worker --slots auto`",
    )
    p.add_argument(
        "--level-runs",
        type=int,
        default=1,
        metavar="K",
        help="with --calls: run each level K times; a level passes only when every run of it "
        "passes (a shared VM's speed drifts: one run of a level says little about the next)",
    )
    p.add_argument("--playout-delay-ms", type=int, default=None, help="live playout delay")
    p.add_argument(
        "--cycles",
        type=int,
        default=0,
        help="with --live: instead of one long call, this many calls in a row of --seconds each; "
        "reports the server's RSS after each against where it started (cycles.json)",
    )


def parse_durations(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--durations must be comma-separated seconds, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ConfigError(f"--durations must be positive seconds, got {text!r}")
    return values


def machine_info(compute_dtype: str) -> dict:
    """Where the figures were measured: the CPUs this process may use (its affinity mask, as under
    ``taskset``, not the host's count), the CPU model and whether it has bf16 in hardware."""

    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every CPU counts
    return {
        "cpus": len(affinity(0)) if affinity else os.cpu_count(),
        "host_cpus": os.cpu_count(),
        "cpu_model": cpu_info().get("model name") or platform.processor() or "unknown",
        "cpu_native_bf16": native_bf16("cpu"),
        "platform": platform.platform(),
        "compute_dtype": compute_dtype,  # as asked; cmd_bench puts what auto chose here
    }


def run_worker(
    spec: dict, module: str = "talkloop.pipeline.bench.worker", netns: bool = False
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", module, str(spec_path), str(result_path)]
        if netns:
            cmd = ["unshare", "-n", "sh", "-c", NETNS_SETUP, *cmd]
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        if proc.returncode != 0:
            raise TalkloopError(
                f"bench run {spec.get('mode', module.rsplit('.', 1)[-1])} {spec.get('seconds')} s failed:\n{proc.stdout[-2000:]}"
            )
        return json.loads(result_path.read_text())


def cmd_bench(args: argparse.Namespace, config: TalkloopConfig) -> int:

    warn_unless_native_size(config)  # here too: the runs' own logs are only shown if they fail
    if args.cycles < 0 or (args.cycles and not args.live):
        raise ConfigError(f"--cycles takes a count of calls with --live, got {args.cycles}")
    if args.level_runs != 1 and (args.calls is None or args.level_runs < 1):
        raise ConfigError(f"--level-runs takes a count of runs with --calls, got {args.level_runs}")
    if args.calls is not None:
        return cmd_bench_calls(args, config)
    if args.live:
        return cmd_bench_live(args, config)
    durations = parse_durations(args.durations)
    if getattr(args, "offload", False):
        return run_offload_bench(args, config, min(durations))
    cfg = config.model_dump(mode="json")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info(config.model.dtype)
    print(
        f"talkloop bench: family={config.model.family} preset={config.model.preset} "
        f"{config.video.width}x{config.video.height} "
        f"@{config.video.fps} fps, steps={config.sampler.steps}, dtype={config.model.dtype}, "
        f"cpus={machine['cpus']} ({machine['cpu_model']})",
        flush=True,
    )
    ttff_run = run_worker({"config": cfg, "mode": "ttff", "seconds": 0, "repeats": args.ttff_runs})
    ttff, runtime = ttff_run["ttff_ms"], ttff_run["runtime"]
    machine["compute_dtype"] = runtime["dtype"]  # what --dtype auto chose in the worker
    print(
        f"  runtime: backend={runtime['backend']} dtype={runtime['dtype']} "
        f"int8={','.join(runtime['int8']) or 'none'}",
        flush=True,
    )
    runs = []
    modes = ["ours", "naive"] if args.baseline else ["ours"]
    for seconds in durations:
        for mode in modes:
            print(f"  running {mode:5s} {seconds:g} s ...", flush=True)
            runs.append(run_worker({"config": cfg, "mode": mode, "seconds": seconds}))
    ttff_sorted = sorted(ttff)
    result = {
        "config": cfg,
        "machine": machine,
        "runtime": runtime,  # the resolved --backend, dtype and int8 networks
        "ttff_ms": ttff_sorted[len(ttff_sorted) // 2],
        "ttff_ms_runs": ttff,
        "runs": runs,
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    plot_memory(runs, out / "memory.png")
    print_table(result)
    print(f"wrote {out / 'bench.json'} and {out / 'memory.png'}")
    return 0


NETNS_SETUP = 'ip link set lo up && ip addr add 127.0.0.2/8 dev lo && exec "$0" "$@"'


def can_use_netns() -> bool:

    return os.geteuid() == 0 and bool(shutil.which("unshare")) and bool(shutil.which("ip"))


def cmd_bench_calls(args: argparse.Namespace, config: TalkloopConfig) -> int:
    """``talkloop bench --calls N``: the calls per node of the family (bench/calls.py)."""
    if args.calls < 1:
        raise ConfigError(f"--calls must be at least 1, got {args.calls}")
    if args.seconds < 10:  # shorter calls are mostly their connection set-up
        raise ConfigError(f"--seconds must be at least 10 with --calls, got {args.seconds:g}")
    netns = can_use_netns()
    spec = {
        "max_calls": args.calls,
        "seconds": args.seconds,
        "level_runs": args.level_runs,
        "serve_args": serve_flags(args),  # the servers get the video and model flags given
        "out": str(args.out.resolve()),
        "host": "127.0.0.2" if netns else "127.0.0.1",
    }
    runs = f", each level {args.level_runs} times" if args.level_runs > 1 else ""
    print(
        f"talkloop bench --calls {args.calls}{runs}: {args.seconds:g} s calls of `talkloop serve "
        f"{' '.join(spec['serve_args'])}`, clients on the same cores, in "
        f"{'a private network namespace' if netns else 'this host' + chr(39) + 's network'}",
        flush=True,
    )
    r = run_worker(spec, module="talkloop.pipeline.bench.calls", netns=netns)
    for level in r["levels"]:
        calls = level["per_call"]
        worst = max(c["late_pct"] for c in calls)
        skipped = sum(c["skipped_frames"] for c in calls)
        gaps = max(c["audio_gaps"] for c in calls)
        longest = max((c["longest_audio_gap_ms"] or 0.0) for c in calls)
        run = f", run {level['run']}" if args.level_runs > 1 else ""
        runtime = calls[0]["runtime"] or {}
        print(
            f"  {level['calls']} call(s){run}: worst {worst} % late or missed, {skipped} frames "
            f"skipped: {'pass' if level['passed'] else 'FAIL'}; at the clients at most {gaps} "
            f"audio gaps over {AUDIO_GAP_S * 1000:g} ms a call (the longest {longest:g} ms); "
            f"computed on {runtime.get('backend', '?')}, {runtime.get('dtype', '?')}"
            f"{cost_line(level['cost'])}"
        )
    passed = ""
    if args.level_runs > 1:  # how often each level passed: where the figure is near its edge
        counts = Counter(lv["calls"] for lv in r["levels"] if lv["passed"])
        ran = sorted({lv["calls"] for lv in r["levels"]})
        passed = ", passed " + ", ".join(f"{n} calls {counts[n]}/{args.level_runs}" for n in ran)
    print(
        f"calls per node: {r['calls']} ({r['cpu']}, {r['cores']} cores{passed}); "
        f"wrote {args.out / 'calls.json'}"
    )
    return 0


def cost_line(cost: dict) -> str:
    """What a level's calls cost, as ``talkloop bench --calls`` prints it (empty when unknown)."""
    if cost["cores_per_call"] is None:
        return ""
    line = (
        f"; {cost['cores_per_call']} cores a call (server and render workers "
        f"{cost['server_cores']}, clients {cost['client_cores']}), the host took "
        f"{cost['steal_pct']} % of the CPU time"
    )
    parts = cost.get("server_parts")
    if parts:
        line += "; the server's cores by part: " + ", ".join(
            f"{part.replace('_', ' ')} {cores}" for part, cores in parts.items()
        )
    return line


def cmd_bench_live(args: argparse.Namespace, config: TalkloopConfig) -> int:

    base = config.model_dump(mode="json")
    base.pop("schedule")
    cfg = build_config(**live_config_dict(base, sampler_given=args.steps is not None)).model_dump(
        mode="json"
    )
    netns = can_use_netns()
    live = {} if args.playout_delay_ms is None else {"playout_delay_ms": args.playout_delay_ms}
    spec = {
        "config": cfg,
        "seconds": args.seconds,
        "live": live,
        "host": "127.0.0.2" if netns else "127.0.0.1",
        "cycles": args.cycles,
    }
    where = "a private network namespace" if netns else "this host's network"
    steps = cfg["sampler"]["steps"]
    i_steps = f"/{cfg['sampler']['i_steps']}" if cfg["schedule"]["i_len"] else " (no I chunks)"
    print(
        f"talkloop bench --live: {args.seconds:g} s call, family={config.model.family}, "
        f"preset={config.model.preset}, schedule={cfg['schedule']}, steps={steps}{i_steps}, "
        f"in {where}",
        flush=True,
    )
    r = run_worker(spec, module="talkloop.pipeline.bench.live", netns=netns)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.cycles:
        (out / "cycles.json").write_text(json.dumps(r, indent=2))
        print(
            f"{r['cycles']} calls of {r['seconds']:g} s: RSS {r['base_rss_mb']:.1f} MB after the "
            f"warm-up call, {r['end_minus_base_mb']:+.1f} MB after the last "
            f"(at most {r['max_minus_base_mb']:+.1f} MB); calls left open "
            f"{r['calls_left_open']}; slowest call {r['fps_min']:.1f} fps; "
            f"errors {len(r['errors'])}"
        )
        print(f"wrote {out / 'cycles.json'}")
        return 0 if not r["errors"] and not r["calls_left_open"] else 1
    (out / "live.json").write_text(json.dumps(r, indent=2))
    g, a = r["glass_to_glass_ms"], r["av_offset_ms"]
    print(
        f"glass_to_glass_ms p50 {_fmt(g['p50'])}  p95 {_fmt(g['p95'])}  max {_fmt(g['max'])} "
        f"({g['samples']} frames)"
    )
    rl = r["reply_latency_ms"]
    print(
        f"reply_latency_ms p50 {_fmt(rl['p50'])}  p95 {_fmt(rl['p95'])} ({rl['n']} of "
        f"{rl['sent']} agent replies, sent at {rl['speedup']:g}x real time)"
    )
    if rl.get("waited_ms", {}).get("n"):
        w, pl = rl["waited_ms"], rl["plays_in_ms"]
        print(
            f"  in the server: audio waited p50 {_fmt(w['p50'])} / p95 {_fmt(w['p95'])}, then "
            f"played after p50 {_fmt(pl['p50'])} / p95 {_fmt(pl['p95'])} ({w['n']} early starts)"
        )
    if r.get("runtime"):
        rt = r["runtime"]
        print(f"runtime: backend={rt['backend']} dtype={rt['dtype']} int8={rt['int8'] or 'none'}")
    print(
        f"fps {r['fps']:.2f}  codec {r['codec']}  late {r['late_frames']} of {r['frames_sent']} "
        f"sent  dropped {r['dropped_frames']}  overrun {r.get('overrun_frames')}  "
        f"skipped {r['skipped_frames']}  rtf {r['rtf']}"
    )
    print(where_the_time_goes(f"{r['seconds']:g} s call", r["stage_rtf"]))
    print(
        f"av_offset_ms end {_fmt(a['end'])}  max |.| {_fmt(a['max_abs'])}  trend "
        f"{_fmt(a['trend_ms_per_min'], ' ms/min')}"
    )
    print(
        f"peak_rss_mb {_fmt(r['peak_rss_mb'])}  mem_warmup_growth_mb "
        f"{_fmt(r['mem_warmup_growth_mb'])} (first {r['mem_warmup_s']:g} s)  "
        f"mem_slope_mb_per_min {_fmt(r['mem_slope_mb_per_min'])} (after it)"
    )
    print(f"wrote {out / 'live.json'}")
    return 0 if not r["errors"] else 1


def print_table(result: dict) -> None:
    print(
        f"\nttff_ms (median of {len(result['ttff_ms_runs'])} real-time-fed runs): "
        f"{result['ttff_ms']:.0f}  (runs: {', '.join(f'{x:.0f}' for x in result['ttff_ms_runs'])})"
    )
    head = (
        f"{'mode':6s} {'seconds':>8s} {'frames':>7s} {'rtf':>6s} {'fps':>7s} {'peak_rss_mb':>12s} "
        f"{'mem_warmup_growth_mb':>21s} {'mem_slope_mb_per_min':>21s}"
    )
    print(head)
    print("-" * len(head))
    for r in result["runs"]:
        print(
            f"{r['mode']:6s} {r['seconds']:8g} {r['frames']:7d} {r['rtf']:6.3f} {r['fps']:7.1f} "
            f"{r['peak_rss_mb']:12.0f} {_fmt(r['mem_warmup_growth_mb']):>21s} "
            f"{_fmt(r['mem_slope_mb_per_min']):>21s}"
        )
    if result["runs"]:
        print(
            f"memory: growth over the first {result['runs'][0]['mem_warmup_s']:g} s of video "
            f"(warm-up), then the slope of the rest; n/a where less than {MIN_STEADY_S:g} s "
            f"follow the warm-up"
        )
    for r in result["runs"]:
        if r["mode"] == "ours":
            print(where_the_time_goes(f"{r['seconds']:g} s", r["stage_rtf"]))


def where_the_time_goes(what: str, stage_rtf: dict[str, float]) -> str:
    """The six costliest stages of a run, in seconds per second of video."""
    top = sorted(stage_rtf.items(), key=lambda kv: -kv[1])[:6]
    return f"where the time goes ({what}, seconds per second of video): " + ", ".join(
        f"{k} {v:.3f}" for k, v in top
    )


def _fmt(value: float | None, unit: str = "") -> str:
    """A figure, or n/a where it was not measured (a run too short for a slope)."""
    return "n/a" if value is None else f"{value:.2f}{unit}"


def memory_lines(runs: list[dict]) -> list[dict]:
    """What ``plot_memory`` draws per run: minutes, MB, colour, line style and legend label.

    One colour per run, so "ours 20 s" and "ours 60 s" differ, and one line style per mode; the
    label gives the warm-up growth and the steady slope (``bench/memory.py``).
    """
    import matplotlib

    palette = matplotlib.colormaps["tab10"].colors
    styles = {"ours": "-", "naive": "--"}
    lines = []
    for i, r in enumerate(runs):
        growth, slope = r["mem_warmup_growth_mb"], r["mem_slope_mb_per_min"]
        lines.append(
            {
                "t": [s[0] / 60 for s in r["samples"]],
                "mb": [s[1] for s in r["samples"]],
                "color": palette[i % len(palette)],
                "linestyle": styles.get(r["mode"], ":"),
                "label": f"{r['mode']} {r['seconds']:g} s: warm-up "
                f"{'n/a' if growth is None else f'{growth:+.0f} MB'}, "
                f"{'slope n/a (too short)' if slope is None else f'then {slope:+.1f} MB/min'}",
            }
        )
    return lines


def plot_memory(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    warmup = max((r["mem_warmup_s"] for r in runs), default=0.0)
    if warmup:
        ax.axvspan(0, warmup / 60, color="0.9", zorder=0, label=f"warm-up ({warmup:g} s)")
    for line in memory_lines(runs):
        ax.plot(line.pop("t"), line.pop("mb"), alpha=0.9, **line)
    ax.set_xlabel("generated video (minutes)")
    ax.set_ylabel("resident memory (MB)")
    ax.set_title("talkloop memory against generated duration")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
