"""``talkloop eval`` in its CI mode: tiny preset, random weights, one short clip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.train.evaluate import FIELDS

pytestmark = pytest.mark.unit  # ~5 s on an idle 2-core machine


def test_eval_writes_every_figure_and_the_contact_sheet(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    args = ["eval", "--out", str(out), "--clips", "1", "--minutes", "0.02", "--quiet"]
    args += ["--untrained", "--preset", "tiny", "--size", "64", "--dtype", "float32"]
    assert main(args) == 0
    result = json.loads((out / "eval.json").read_text())
    missing = [f for f in FIELDS if f not in result]
    assert not missing
    assert -1.0 <= result["lipsync_corr"] <= 1.0
    assert abs(result["lipsync_lag_ms"]) <= 200.0
    assert result["seam_ratio"] > 0 and result["seam_ratio_no_i"] > 0
    assert result["readout_trained"] is False and result["untrained"] is True
    png = (out / "eval.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_eval_rejects_a_bad_clip_count(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["eval", "--out", str(tmp_path), "--clips", "0", "--untrained", "--preset", "tiny"]
    assert main(args) == 2
    assert "--clips" in capsys.readouterr().err
