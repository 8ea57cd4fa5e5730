"""`talkloop bench` runs end to end on the tiny config and writes its table, JSON and plot."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.bench.run import machine_info
from pipeline.bench.worker import slope_per_min
from pipeline.cli import main


@pytest.mark.e2e
def test_bench_tiny_writes_json_and_plot(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--untrained",
            "--preset",
            "tiny",
            "--size",
            "64",
            "--steps",
            "1",
            "--durations",
            "2",
            "--ttff-runs",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    table = capsys.readouterr().out
    assert "ttff_ms" in table and "mem_slope_mb_per_min" in table and "where the time goes" in table
    result = json.loads((out / "bench.json").read_text())
    assert result["ttff_ms"] > 0
    assert result["machine"]["cpus"] == len(os.sched_getaffinity(0))
    modes = {r["mode"]: r for r in result["runs"]}
    assert set(modes) == {"ours", "naive"}
    for r in modes.values():
        assert r["torch_threads"] >= 1
        stages = r["stage_rtf"]
        assert "publish/decode" in stages and "n_chunk/a2v" in stages, stages
        assert all(v >= 0 for v in stages.values()) and sum(stages.values()) <= r["rtf"] * 1.001
        assert r["frames"] == 50 and r["rtf"] > 0 and r["fps"] > 0 and r["peak_rss_mb"] > 50
        assert r["mem_slope_mb_per_min"] is None  # 2 s is too short for a slope
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


@pytest.mark.unit
def test_slope_is_fitted_after_warm_up() -> None:
    flat = [(t, 500.0 + (50.0 if t < 10 else 0.0)) for t in range(0, 600, 5)]
    assert abs(slope_per_min(flat)) < 1e-6
    growing = [(t, 500.0 + t / 60 * 300) for t in range(0, 600, 5)]  # 300 MB per minute
    assert abs(slope_per_min(growing) - 300) < 1e-6
    assert slope_per_min([(0, 1.0), (30, 2.0)]) != slope_per_min([(0, 1.0), (30, 2.0)])  # NaN
