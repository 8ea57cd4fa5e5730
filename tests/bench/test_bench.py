"""`talkloop bench` runs end to end on the tiny config and writes its table, JSON and plot."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from talkloop.pipeline.bench.live import early_start_figures
from talkloop.pipeline.bench.memory import MIN_STEADY_S, WARMUP_S, memory_trend
from talkloop.pipeline.bench.run import machine_info, memory_lines, print_table
from talkloop.pipeline.cli import main

from support import tiny_args


@pytest.mark.e2e
def test_bench_tiny_writes_json_and_plot(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            *tiny_args(),
            "--steps",
            "1",
            "--durations",
            "2",
            "--ttff-runs",
            "1",
            "--backend",
            "torch",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    table = capsys.readouterr().out
    assert "ttff_ms" in table and "where the time goes" in table
    assert "mem_warmup_growth_mb" in table and "mem_slope_mb_per_min" in table
    result = json.loads((out / "bench.json").read_text())
    assert result["ttff_ms"] > 0
    assert result["runtime"]["backend"] == "torch" and result["runtime"]["int8"] == []
    assert result["machine"]["cpus"] == len(os.sched_getaffinity(0))
    modes = {r["mode"]: r for r in result["runs"]}
    assert set(modes) == {"ours", "naive"}
    for r in modes.values():
        assert r["torch_threads"] >= 1
        stages = r["stage_rtf"]
        assert "publish/decode" in stages and "n_chunk/a2v" in stages, stages
        assert all(v >= 0 for v in stages.values()) and sum(stages.values()) <= r["rtf"] * 1.001
        assert r["frames"] == 50 and r["rtf"] > 0 and r["fps"] > 0 and r["peak_rss_mb"] > 50
        # 2 s is all warm-up: neither a warm-up growth nor a slope
        assert r["mem_warmup_s"] == WARMUP_S
        assert r["mem_warmup_growth_mb"] is None and r["mem_slope_mb_per_min"] is None
    png = (out / "memory.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.unit
def test_machine_info_counts_the_cpus_this_process_may_use() -> None:
    """Under ``taskset`` the figures come from fewer CPUs than the host has: say so."""
    allowed = os.sched_getaffinity(0)
    one = min(allowed)
    try:
        os.sched_setaffinity(0, {one})
        info = machine_info("float32")
    finally:
        os.sched_setaffinity(0, allowed)
    assert info["cpus"] == 1 and info["host_cpus"] == os.cpu_count()
    assert info["cpu_model"] and info["compute_dtype"] == "float32"
    assert isinstance(info["cpu_native_bf16"], bool)


def _trace(seconds: float, warmup_mb: float, slope_mb_per_min: float) -> list[list[float]]:
    """RSS once a second: ``warmup_mb`` gained over the first 20 s, then a straight line."""
    return [
        [t, 600 + warmup_mb * min(t, 20) / 20 + slope_mb_per_min * max(0, t - 20) / 60]
        for t in range(int(seconds) + 1)
    ]


@pytest.mark.unit
def test_warm_up_is_reported_apart_from_the_steady_slope() -> None:
    # the shape of the shipped model's runs: +120 MB in the first 20 s, then flat
    five_min = memory_trend(_trace(300, 120, 0.0))
    assert five_min["mem_warmup_growth_mb"] == pytest.approx(120)
    assert five_min["mem_slope_mb_per_min"] == pytest.approx(0, abs=1e-9)
    assert five_min["mem_steady_range_mb"] == [pytest.approx(720), pytest.approx(720)]
    # the same warm-up fitted into the slope, as a 20 %-cut fit over 60 s did, reads as a leak
    minute = _trace(60, 120, 0.0)
    naive_tail = [p for p in minute if p[0] >= 12]
    assert np.polyfit([p[0] / 60 for p in naive_tail], [p[1] for p in naive_tail], 1)[0] > 20
    # a real leak after the warm-up is measured as it is
    leak = memory_trend(_trace(600, 120, 3.0))
    assert leak["mem_slope_mb_per_min"] == pytest.approx(3.0)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("seconds", "growth", "slope"),
    [
        (20, False, False),  # ends inside the warm-up
        (60, True, False),  # 30 s after the warm-up: a slope would be noise
        (WARMUP_S + MIN_STEADY_S, True, True),
    ],
)
def test_short_runs_report_no_slope(seconds: float, growth: bool, slope: bool) -> None:
    trend = memory_trend(_trace(seconds, 50, 1.0))
    assert (trend["mem_warmup_growth_mb"] is not None) == growth
    assert (trend["mem_slope_mb_per_min"] is not None) == slope


def _run(mode: str, seconds: float) -> dict:
    samples = _trace(seconds, 100, 0.5)
    return {
        "mode": mode,
        "seconds": seconds,
        "frames": int(seconds * 25),
        "rtf": 0.3,
        "fps": 80.0,
        "peak_rss_mb": 700.0,
        "stage_rtf": {"publish/decode": 0.1},
        "samples": samples,
        **memory_trend(samples),
    }


@pytest.mark.unit
def test_plot_tells_runs_apart_and_table_agrees_with_json(capsys) -> None:
    runs = [_run("ours", 20), _run("naive", 20), _run("ours", 120), _run("naive", 120)]
    lines = memory_lines(runs)
    assert len({line["color"] for line in lines}) == 4  # one colour per run
    assert [line["linestyle"] for line in lines] == ["-", "--", "-", "--"]
    assert lines[0]["label"] == "ours 20 s: warm-up n/a, slope n/a (too short)"
    assert lines[2]["label"] == "ours 120 s: warm-up +100 MB, then +0.5 MB/min"
    print_table({"ttff_ms": 140.0, "ttff_ms_runs": [140.0], "runs": runs})
    rows = [r.split() for r in capsys.readouterr().out.splitlines() if r.startswith("ours ")]
    # mode seconds frames rtf fps peak_rss_mb mem_warmup_growth_mb mem_slope_mb_per_min
    assert rows == [
        ["ours", "20", "500", "0.300", "80.0", "700", "n/a", "n/a"],
        # warm-up: RSS at 30 s (100 MB by 20 s + 10 s at 0.5 MB/min) minus RSS at 0
        ["ours", "120", "3000", "0.300", "80.0", "700", "100.08", "0.50"],
    ]


@pytest.mark.unit
def test_early_starts_are_counted_once_from_the_stats_that_repeat_them() -> None:
    stats = [
        {"early_replies": 0, "early_reply": None},
        {"early_replies": 1, "early_reply": {"waited_ms": 60.0, "plays_in_ms": 70.0}},
        {"early_replies": 1, "early_reply": {"waited_ms": 60.0, "plays_in_ms": 70.0}},
        {"early_replies": 2, "early_reply": {"waited_ms": 80.0, "plays_in_ms": 50.0}},
    ]
    figures = early_start_figures(stats)
    assert figures["waited_ms"] == {"p50": 70.0, "p95": 79.0, "n": 2}
    assert figures["plays_in_ms"]["n"] == 2 and figures["plays_in_ms"]["p50"] == 60.0
    assert early_start_figures([])["waited_ms"] == {"p50": None, "p95": None, "n": 0}
