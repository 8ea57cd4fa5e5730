"""``talkloop train`` and ``talkloop eval`` for the portrait family (the spec's trainer and evaluator)."""

from __future__ import annotations

import argparse
import json

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.portrait.evaluate import evaluate_motion
from talkloop.pipeline.models.portrait.family import INSTALLED_WEIGHTS, installed_weights
from talkloop.pipeline.models.portrait.train import MotionTrainConfig, train_motion


def add_args(command: str, group) -> None:
    """The portrait family's own options of ``talkloop train`` (``eval`` has none)."""
    if command == "train":
        group.add_argument("--steps", type=int, help="motion generator steps")


def train(args: argparse.Namespace) -> int:
    """``talkloop train --family portrait``: the motion generator on synthetic clips' exact
    motion parameters."""
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


def evaluate_cli(args: argparse.Namespace) -> int:
    """``talkloop eval --family portrait``: the motion net's parameters against the synthetic clips'
    exact ones on held-out clips (lip sync, prompts, seams, pauses)."""

    folder = args.weights or installed_weights()
    if folder is None:
        raise ConfigError(
            f"no portrait weights installed ({INSTALLED_WEIGHTS}); pass --weights DIR"
        )
    result = evaluate_motion(
        folder,
        args.out,
        clips=args.clips,
        seed=args.seed,
        progress=not args.quiet,
        dtype=args.dtype,
    )
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, (dict, list))}))
    print(f"wrote {args.out / 'eval.json'} and {args.out / 'eval.png'}")
    return 0
