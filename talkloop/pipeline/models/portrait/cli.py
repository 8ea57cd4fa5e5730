"""``talkloop train`` and ``talkloop eval`` for the portrait family (the spec's trainer and evaluator)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from talkloop.pipeline.args import config_from_args
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.portrait.evaluate import evaluate_motion
from talkloop.pipeline.models.portrait.family import INSTALLED_WEIGHTS, installed_weights
from talkloop.pipeline.models.portrait.pixel_eval import (
    DEFAULT_PROMPTS,
    TABLE_HEADER,
    evaluate_pixels,
    row_line,
    sweep_line,
)
from talkloop.pipeline.models.portrait.train import MotionTrainConfig, train_motion


def add_args(command: str, group) -> None:
    """The portrait family's own options of ``talkloop train`` and ``talkloop eval``."""
    if command == "train":
        group.add_argument("--steps", type=int, help="motion generator steps")
        group.add_argument(
            "--festival-share",
            type=float,
            help="share of training clips said by a Festival diphone voice (a recorded "
            "speaker's) instead of espeak-ng; needs `apt-get install festival festvox-kdlpc16k`",
        )
        return
    if command == "eval":
        group.add_argument(
            "--photos",
            type=Path,
            action="append",
            help="photos (files or folders; repeatable): render every photo x --audio file x "
            "--prompt as `talkloop render` does and score the frames read back by the face "
            "models (instead of the motion parameters)",
        )
        group.add_argument(
            "--audio",
            type=Path,
            action="append",
            help="audio files or folders for --photos (repeatable); NAME.lab phone times or a "
            "NAME.txt transcript next to a file give its bilabials",
        )
        group.add_argument(
            "--prompt",
            action="append",
            help=f"style prompt for --photos (repeatable; default: {' and '.join(DEFAULT_PROMPTS)})",
        )
        group.add_argument(
            "--live", action="store_true", help="with --photos: also the live schedule"
        )


def train(args: argparse.Namespace) -> int:
    """``talkloop train --family portrait``: the motion generator on synthetic clips' exact
    motion parameters."""
    updates: dict[str, object] = {"seed": args.seed}
    for flag, value, low in (("steps", args.steps, 0), ("clips", args.clips, 1)):
        if value is not None:
            if value < low:
                raise ConfigError(f"--{flag} must be >= {low}, got {value}")
            updates[flag] = value
    if args.festival_share is not None:
        if not 0.0 <= args.festival_share <= 1.0:
            raise ConfigError(f"--festival-share must be in [0, 1], got {args.festival_share}")
        updates["festival_share"] = args.festival_share
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
    exact ones on held-out clips (lip sync, prompts, seams, pauses); with ``--photos``, the
    rendered frames of real photos and audio (``pixel_eval.py``)."""

    if args.photos or args.audio:
        return _evaluate_pixels(args)
    if args.prompt or args.live:
        raise ConfigError("--prompt and --live belong to the pixel evaluation: give --photos")
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


def _evaluate_pixels(args: argparse.Namespace) -> int:
    if not args.photos or not args.audio:
        raise ConfigError("the pixel evaluation needs both --photos and --audio")
    result = evaluate_pixels(
        config_from_args(args),
        args.photos,
        args.audio,
        args.out,
        prompts=args.prompt or DEFAULT_PROMPTS,
        live=args.live,
        progress=not args.quiet,
    )
    print(TABLE_HEADER)
    for row in result["clips"]:
        print(row_line(row))
    for name, photo in result["photos"].items():
        if "opening_by_parameter" in photo:
            print(sweep_line(name, photo))
    sheets = len(result["clips"])
    print(f"wrote {args.out / 'eval.json'}, {sheets} contact sheets in {args.out / 'sheets'}")
    return 0
