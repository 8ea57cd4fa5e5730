"""``talkloop train`` and ``talkloop eval``: argument parsing only; the work is elsewhere."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from talkloop.pipeline.core.errors import ConfigError


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``train``."""
    t = sub.add_parser("train", help="train a model family on synthetic talking faces")
    t.add_argument("--out", type=Path, required=True, help="weights + checkpoint folder")
    t.add_argument(
        "--family",
        choices=["studio", "portrait"],
        default="studio",
        help="studio: every network on rendered clips; portrait: the motion generator only",
    )
    t.add_argument("--steps", type=int, help="portrait: motion generator steps")
    t.add_argument("--preset", choices=["default", "tiny"], default="default")
    t.add_argument("--data", type=Path, help="studio clips (index.jsonl); default: generate")
    t.add_argument("--clips", type=int, help="clips to generate when --data is not given")
    t.add_argument(
        "--clips-per-character",
        type=int,
        help="generated clips per studio character (default 4: each face shows several styles)",
    )
    t.add_argument("--steps-vae", type=int, help="VAE steps (recipe default otherwise)")
    t.add_argument(
        "--steps-decoder", type=int, help="VAE decoder steps on the frozen encoder's latents"
    )
    t.add_argument("--steps-a2v", type=int, help="audio encoder + A2V steps")
    t.add_argument("--steps-sr", type=int, help="SR steps")
    t.add_argument("--steps-readout", type=int, help="readout (eval) steps")
    t.add_argument("--steps-expression", type=int, help="expression (prompt -> reference) steps")
    t.add_argument("--steps-mouth", type=int, help="mouth (audio -> mouth shape, editor) steps")
    t.add_argument("--minutes", type=float, help="wall-clock budget for the training phases")
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quiet", action="store_true", help="no progress bars")


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``eval`` (model options come from the shared model arguments)."""
    from talkloop.pipeline.cli import add_model_args, add_video_args

    e = sub.add_parser("eval", help="score weights on held-out studio clips (JSON + PNG)")
    e.add_argument("--out", type=Path, required=True, help="folder for eval.json and eval.png")
    e.add_argument("--clips", type=int, default=4, help="test clips for lip sync and seams")
    e.add_argument("--minutes", type=float, default=1.0, help="length of the drift generation")
    e.add_argument("--quiet", action="store_true", help="no progress output")
    e.add_argument(
        "--card",
        action="store_true",
        help="also write MODEL_CARD.md and eval.json into the weights folder",
    )
    add_video_args(e)
    add_model_args(e)


def cmd_train(args: argparse.Namespace) -> int:
    """Run ``talkloop train``."""
    from talkloop.pipeline.train.config import PHASES, TrainConfig
    from talkloop.pipeline.train.trainer import train

    if args.family == "portrait":
        return _train_portrait(args)
    if args.steps is not None:
        raise ConfigError("--steps is for --family portrait; studio phases take --steps-<phase>")
    if args.data is not None:
        given = [f for f in ("clips", "clips_per_character") if getattr(args, f) is not None]
        if given:
            flags = " and ".join("--" + f.replace("_", "-") for f in given)
            raise ConfigError(
                f"{flags} only shape generated clips; --data {args.data} already has its clips "
                "(make them with `talkloop studio dataset --clips N --characters M`)"
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
        raise ConfigError(f"--data {args.data} has no index.jsonl (see `talkloop studio dataset`)")
    out = train(cfg, args.out, args.data, resume=args.resume, progress=not args.quiet)
    print(f"wrote weights to {out} (use: talkloop render --weights {out} ...)")
    return 0


def _train_portrait(args: argparse.Namespace) -> int:
    """``talkloop train --family portrait``: the motion generator on studio clips' parameters."""
    from talkloop.pipeline.models.portrait.train import MotionTrainConfig, train_motion
    from talkloop.pipeline.train.config import PHASES

    studio_only = ["data", "clips_per_character", "resume"] + [f"steps_{p}" for p in PHASES]
    given = [f for f in studio_only if getattr(args, f) not in (None, False)]
    if args.preset != "default":
        given.append("preset")
    if given:
        flags = ", ".join("--" + f.replace("_", "-") for f in given)
        raise ConfigError(
            f"{flags}: studio-only option(s); --family portrait takes --steps, "
            "--clips, --minutes, --seed"
        )
    updates: dict[str, object] = {"seed": args.seed}
    for flag, value, low in (("steps", args.steps, 0), ("clips", args.clips, 1)):
        if value is not None:
            if value < low:
                raise ConfigError(f"--{flag} must be >= {low}, got {value}")
            updates[flag] = value
    if args.minutes is not None:
        if args.minutes <= 0:
            raise ConfigError(f"--minutes must be > 0, got {args.minutes}")
        updates["minutes"] = args.minutes
    cfg = MotionTrainConfig.model_validate({**MotionTrainConfig().model_dump(), **updates})
    out = train_motion(cfg, args.out, progress=not args.quiet)
    print(f"wrote portrait motion weights to {out}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Run ``talkloop eval``."""
    from talkloop.pipeline.cli import config_from_args
    from talkloop.pipeline.train.evaluate import evaluate

    if args.clips < 1:
        raise ConfigError(f"--clips must be >= 1, got {args.clips}")
    if args.minutes <= 0:
        raise ConfigError(f"--minutes must be > 0, got {args.minutes}")
    if args.family == "portrait":
        return _eval_portrait(args)
    config = config_from_args(args)
    result = evaluate(
        config, args.out, clips=args.clips, minutes=args.minutes, progress=not args.quiet
    )
    keys = ("lipsync_corr", "lipsync_lag_ms", "seam_ratio", "seam_ratio_no_i", "identity_drift")
    print("  ".join(f"{k}={result[k]:.3g}" for k in keys if result.get(k) is not None))
    print(f"wrote {args.out / 'eval.json'} and {args.out / 'eval.png'}")
    if args.card:
        from talkloop.pipeline.train.card import write_model_card

        if result["weights"] is None:
            raise ConfigError("--card needs trained weights (--weights DIR or installed ones)")
        print(f"wrote {write_model_card(Path(str(result['weights'])), result)}")
    return 0


def _eval_portrait(args: argparse.Namespace) -> int:
    """``talkloop eval --family portrait``: the motion net's parameters against the studio's
    exact ones on held-out clips (lip sync, prompts, seams, pauses)."""
    from talkloop.pipeline.models.portrait.evaluate import evaluate_motion
    from talkloop.pipeline.models.portrait.family import INSTALLED_WEIGHTS, installed_weights

    if args.card:
        raise ConfigError("--card is for the studio family")
    folder = args.weights or installed_weights()
    if folder is None:
        raise ConfigError(
            f"no portrait weights installed ({INSTALLED_WEIGHTS}); pass --weights DIR"
        )
    result = evaluate_motion(folder, args.out, clips=args.clips, progress=not args.quiet)
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, (dict, list))}))
    print(f"wrote {args.out / 'eval.json'} and {args.out / 'eval.png'}")
    return 0
