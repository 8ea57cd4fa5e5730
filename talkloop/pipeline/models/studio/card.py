"""Model card: what a weights folder was trained on, how, and how it scores.

Everything in the card is read from files the run wrote: ``train_summary.json`` (recipe),
``train_log.jsonl`` (every logged step of every phase) and an ``eval.json`` from ``talkloop
eval``. Phases are summarised from the log, not from the recipe, so a run that was resumed,
budgeted or continued from an earlier run's phases reports the steps that actually happened.
"""

from __future__ import annotations

import json
from pathlib import Path

from talkloop.pipeline.core.errors import ConfigError

# (eval.json key, what it means, target)
METRICS = (
    ("lipsync_corr", "mouth opening read from frames vs ground truth", ">= 0.7"),
    ("lipsync_lag_ms", "lag of that correlation's peak", "abs <= 40"),
    ("lipsync_corr_at_0", "correlation at zero lag", ""),
    ("lipsync_corr_clip_mean", "mean of each clip's own correlation (timing only)", ""),
    ("readout_corr_gt", "readout on ground-truth frames (its ceiling)", ""),
    ("seam_ratio", "frame change at chunk seams / elsewhere, with I chunks", "<= 1.15"),
    ("seam_ratio_no_i", "the same without I chunks", "> seam_ratio"),
    ("identity_distance_start", "face distance to the reference, first 10 s", ""),
    ("identity_distance_end", "face distance to the reference, last 10 s", "<= start"),
    ("identity_drift", "slope of that distance per minute", "~0"),
    ("prompt_smile_delta", "smile readout, held-out smiling minus serious prompts", "> 0"),
)


def phase_rows(log: Path) -> dict[str, dict[str, object]]:
    """Per phase from ``train_log.jsonl``: steps of each run (a run that starts a phase over
    shows as a new entry), final loss EMA, mean seconds per step and optimiser minutes."""
    runs: dict[str, list[dict[str, float]]] = {}
    for line in log.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        phase_runs = runs.setdefault(r["phase"], [])
        if not phase_runs or r["step"] <= phase_runs[-1]["steps"]:
            phase_runs.append({"steps": 0, "secs": 0.0, "n": 0})
        cur = phase_runs[-1]
        cur.update(steps=r["step"], loss_ema=r["loss_ema"])
        cur["secs"] += r["sec_per_step"]
        cur["n"] += 1
    rows: dict[str, dict[str, object]] = {}
    for phase, phase_runs in runs.items():
        minutes = sum(run["steps"] * run["secs"] / run["n"] / 60 for run in phase_runs)
        steps = sum(run["steps"] for run in phase_runs)
        rows[phase] = {
            "steps": " + ".join(str(int(run["steps"])) for run in phase_runs),
            "loss_ema": phase_runs[-1]["loss_ema"],
            "sec_per_step": minutes * 60 / max(1, steps),
            "minutes": minutes,
        }
    return rows


def model_card(weights: Path, result: dict, provenance: str = "") -> str:
    """The Markdown card for ``weights`` scored by ``result`` (an ``eval.json`` dict)."""
    summary_path, log_path = weights / "train_summary.json", weights / "train_log.jsonl"
    for path in (summary_path, log_path):
        if not path.is_file():
            raise ConfigError(f"{weights} has no {path.name}: a model card needs a training run")
    summary = json.loads(summary_path.read_text())
    recipe = summary["recipe"]
    phases = phase_rows(log_path)
    total_min = sum(p["minutes"] for p in phases.values())
    frames = f" ({summary['frames_used']} frames)" if "frames_used" in summary else ""
    lines = [
        "# talkloop studio model (default weights)",
        "",
        "Reference image + speech (+ optional style prompt) -> 256x256 talking-face video at "
        "25 fps, on CPU. Trained only on synthetic characters from `talkloop/pipeline/synth` "
        "(procedural faces, espeak-ng speech with phoneme-timed visemes, augmented audio); it "
        "knows nothing about real faces. Weights: fp16 safetensors, one file per network.",
        "",
        "## Data",
        "",
        f"{summary.get('clips_used', recipe['clips'])} training clips{frames} of "
        f"{recipe['size']} px (`talkloop synth dataset`, seed {recipe['seed']}), split by "
        "character, sentence and voice: the evaluation uses test characters, sentences, voices "
        "and prompt paraphrases never seen in training.",
        "",
        "## Training (phases as logged)",
        "",
        "| phase | steps | batch | peak lr | s/step (2-core CPU) | minutes | final loss (EMA) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in phases.items():
        pc = recipe.get(name, {})
        lines.append(
            f"| {name} | {p['steps']} | {pc.get('batch', '')} | {pc.get('lr', '')} | "
            f"{p['sec_per_step']:.3f} | {p['minutes']:.1f} | "
            f"{p['loss_ema']:.4f} |"
        )
    lines += [
        "",
        f"Optimiser time in total: {total_min:.0f} minutes (data generation and latent "
        "encoding not included). Latent scale: "
        f"{summary.get('latent_scale', float('nan')):.4f}.",
    ]
    if provenance:
        lines += ["", provenance.strip()]
    lines += [
        "",
        "## Evaluation (`talkloop eval`, held-out test split)",
        "",
        f"{result.get('clips')} test clips, drift over {result.get('minutes')} minutes, "
        f"{result.get('size')} at {result.get('fps')} fps.",
        "",
        "| metric | value | target | meaning |",
        "|---|---|---|---|",
    ]
    for key, meaning, target in METRICS:
        value = result.get(key)
        shown = "n/a" if value is None else f"{value:.3f}"
        lines.append(f"| `{key}` | {shown} | {target} | {meaning} |")
    lines += ["", "The contact sheet `eval.png` shows generated frames over time with the audio."]
    return "\n".join(lines) + "\n"


def write_model_card(weights: Path, result: dict, provenance: str = "") -> Path:
    """Write ``MODEL_CARD.md`` and ``eval.json`` into ``weights``; returns the card's path."""
    card = model_card(weights, result, provenance)
    (weights / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    path = weights / "MODEL_CARD.md"
    path.write_text(card)
    return path
