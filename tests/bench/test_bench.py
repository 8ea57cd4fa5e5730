"""`talkloop bench` runs end to end on the tiny config and writes its table, JSON and plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    assert "ttff_ms" in table and "mem_slope_mb_per_min" in table
    result = json.loads((out / "bench.json").read_text())
    assert result["ttff_ms"] > 0
    modes = {r["mode"]: r for r in result["runs"]}
    assert set(modes) == {"ours", "naive"}
    for r in modes.values():
        assert r["frames"] == 50 and r["rtf"] > 0 and r["fps"] > 0 and r["peak_rss_mb"] > 50
        assert r["mem_slope_mb_per_min"] is None  # 2 s is too short for a slope
    png = (out / "memory.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.unit
def test_slope_is_fitted_after_warm_up() -> None:
    flat = [(t, 500.0 + (50.0 if t < 10 else 0.0)) for t in range(0, 600, 5)]
    assert abs(slope_per_min(flat)) < 1e-6
    growing = [(t, 500.0 + t / 60 * 300) for t in range(0, 600, 5)]  # 300 MB per minute
    assert abs(slope_per_min(growing) - 300) < 1e-6
    assert slope_per_min([(0, 1.0), (30, 2.0)]) != slope_per_min([(0, 1.0), (30, 2.0)])  # NaN
