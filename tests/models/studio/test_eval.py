"""``talkloop eval`` in its CI mode: tiny preset, random weights, one short clip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from talkloop.pipeline.cli import main
from talkloop.pipeline.models.studio.evaluate import FIELDS
from talkloop.pipeline.models.studio.recipe import PHASES

from support import tiny_args

pytestmark = pytest.mark.unit  # ~5 s on an idle 2-core machine


def test_eval_writes_every_figure_and_the_contact_sheet(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    args = ["eval", "--out", str(out), "--clips", "1", "--minutes", "0.02", "--quiet"]
    args += [*tiny_args(), "--dtype", "float32"]
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
    args = [
        "eval",
        "--out",
        str(tmp_path),
        "--clips",
        "0",
        "--family",
        "studio",
        "--untrained",
        "--preset",
        "tiny",
    ]
    assert main(args) == 2
    assert "--clips" in capsys.readouterr().err


def test_train_rejects_a_bad_character_share(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["train", "--family", "studio", "--out", str(tmp_path), "--preset", "tiny"]
    args += ["--clips-per-character", "0"]
    assert main(args) == 2
    assert "--clips-per-character must be >= 1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("phase", PHASES)
def test_train_has_a_steps_flag_per_phase_that_rejects_negatives(
    phase: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    flag = f"--steps-{phase}"
    assert main(["train", "--family", "studio", "--out", str(tmp_path), flag, "-1"]) == 2
    assert f"{flag} must be >= 0" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


def test_train_rejects_generation_flags_with_given_data(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    args = ["train", "--family", "studio", "--out", str(out), "--data", str(data)]
    args += ["--clips-per-character", "2"]
    assert main(args) == 2
    assert "--clips-per-character only shape generated clips" in capsys.readouterr().err
    assert not out.exists()


def test_model_card_reports_logged_phases_and_every_metric(tmp_path: Path) -> None:
    from talkloop.pipeline.models.studio.card import METRICS, write_model_card
    from talkloop.pipeline.models.studio.recipe import TrainConfig

    recipe = TrainConfig.recipe().model_dump(mode="json")
    summary = {"recipe": recipe, "latent_scale": 0.99, "clips_used": 7, "frames_used": 900}
    (tmp_path / "train_summary.json").write_text(json.dumps(summary))
    rows = [("vae", 10, 0.5), ("vae", 20, 0.3)]  # one VAE run of 20 steps
    rows += [("a2v", 10, 0.2), ("a2v", 20, 0.1), ("a2v", 10, 0.09), ("a2v", 30, 0.05)]
    log = [
        {"phase": p, "step": s, "loss": e, "loss_ema": e, "lr": 1e-4, "sec_per_step": 0.5}
        for p, s, e in rows
    ]
    (tmp_path / "train_log.jsonl").write_text("\n".join(json.dumps(r) for r in log) + "\n")
    result = {key: 0.5 for key, _, _ in METRICS} | {"clips": 4, "minutes": 10.0}
    result["lipsync_lag_ms"] = None  # a figure the evaluation could not define

    card = write_model_card(tmp_path, result).read_text()
    assert "7 training clips (900 frames)" in card  # what was used, not the recipe's 400
    assert "| vae | 20 |" in card
    # The A2V phase was started over once (20 steps, then 30): both runs are reported.
    assert "| a2v | 20 + 30 |" in card and "0.0500" in card
    assert all(f"`{key}`" in card for key, _, _ in METRICS)
    assert "| `lipsync_lag_ms` | n/a |" in card
    assert json.loads((tmp_path / "eval.json").read_text())["clips"] == 4


def test_model_card_needs_a_training_log(tmp_path: Path) -> None:
    from talkloop.pipeline.core.errors import ConfigError
    from talkloop.pipeline.models.studio.card import write_model_card

    with pytest.raises(ConfigError, match="train_summary.json"):
        write_model_card(tmp_path, {})
    assert not (tmp_path / "MODEL_CARD.md").exists()
