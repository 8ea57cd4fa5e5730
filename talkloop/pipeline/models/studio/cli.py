"""``talkloop train`` and ``talkloop eval`` for the studio family (the spec's trainer and evaluator)."""

from __future__ import annotations

import argparse
from pathlib import Path

from talkloop.pipeline.args import config_from_args
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.studio.card import write_model_card
from talkloop.pipeline.models.studio.evaluate import evaluate
from talkloop.pipeline.models.studio.recipe import PHASES, TrainConfig
from talkloop.pipeline.models.studio.train import train as train_networks


def add_args(command: str, group) -> None:
    """The studio family's own options of ``talkloop train`` and ``talkloop eval``."""
    if command == "eval":
        group.add_argument(
            "--card",
            action="store_true",
            help="also write MODEL_CARD.md and eval.json into the weights folder",
        )
        return
    group.add_argument(
        "--preset", choices=["default", "tiny"], default="default", help="training recipe"
    )
    group.add_argument("--data", type=Path, help="synth clips (index.jsonl); default: generate")
    group.add_argument(
        "--clips-per-character",
        type=int,
        help="generated clips per character (default 4: each face shows several styles)",
    )
    for phase in PHASES:
        help_ = f"{PHASE_HELP[phase]} steps (recipe default)"
        group.add_argument(f"--steps-{phase}", type=int, help=help_)
    group.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")


PHASE_HELP = {
    "vae": "VAE",
    "decoder": "VAE decoder (on the frozen encoder's latents)",
    "a2v": "audio encoder + A2V",
    "sr": "SR",
    "readout": "readout (eval)",
    "expression": "expression (prompt -> reference)",
    "mouth": "mouth (audio -> mouth shape, editor)",
}


def train(args: argparse.Namespace) -> int:
    """``talkloop train --family studio``: every network on rendered clips."""
    if args.data is not None:
        given = [f for f in ("clips", "clips_per_character") if getattr(args, f) is not None]
        if given:
            flags = " and ".join("--" + f.replace("_", "-") for f in given)
            raise ConfigError(
                f"{flags} only shape generated clips; --data {args.data} already has its clips "
                "(make them with `talkloop synth dataset --clips N --characters M`)"
            )
    cfg = TrainConfig.recipe(args.preset)
    updates: dict[str, object] = {"seed": args.seed}
    if args.clips is not None:
        if args.clips < 1:
            raise ConfigError(f"--clips must be >= 1, got {args.clips}")
        updates["clips"] = args.clips
    if args.clips_per_character is not None:
        if args.clips_per_character < 1:
            raise ConfigError(f"--clips-per-character must be >= 1, got {args.clips_per_character}")
        updates["clips_per_character"] = args.clips_per_character
    if args.minutes is not None:
        if args.minutes <= 0:
            raise ConfigError(f"--minutes must be > 0, got {args.minutes}")
        updates["minutes"] = args.minutes
    for phase in PHASES:
        steps = getattr(args, f"steps_{phase}")
        if steps is not None:
            if steps < 0:
                raise ConfigError(f"--steps-{phase} must be >= 0, got {steps}")
            updates[phase] = getattr(cfg, phase).model_copy(update={"steps": steps})
    cfg = TrainConfig.model_validate({**cfg.model_dump(), **updates})
    if args.data is not None and not (args.data / "index.jsonl").is_file():
        raise ConfigError(f"--data {args.data} has no index.jsonl (see `talkloop synth dataset`)")
    out = train_networks(cfg, args.out, args.data, resume=args.resume, progress=not args.quiet)
    print(f"wrote weights to {out} (use: talkloop render --weights {out} ...)")
    return 0


def evaluate_cli(args: argparse.Namespace) -> int:
    """``talkloop eval --family studio``: lip sync, seams and drift on held-out studio clips."""

    config = config_from_args(args)
    result = evaluate(
        config, args.out, clips=args.clips, minutes=args.minutes, progress=not args.quiet
    )
    keys = ("lipsync_corr", "lipsync_lag_ms", "seam_ratio", "seam_ratio_no_i", "identity_drift")
    print("  ".join(f"{k}={result[k]:.3g}" for k in keys if result.get(k) is not None))
    print(f"wrote {args.out / 'eval.json'} and {args.out / 'eval.png'}")
    if args.card:
        if result["weights"] is None:
            raise ConfigError("--card needs trained weights (--weights DIR or installed ones)")
        print(f"wrote {write_model_card(Path(str(result['weights'])), result)}")
    return 0
