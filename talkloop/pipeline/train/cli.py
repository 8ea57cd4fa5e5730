"""``talkloop train`` and ``talkloop eval``: argument parsing only; the work is elsewhere."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.spec import DEFAULT_FAMILY, family_names, get_spec


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``train``."""
    t = sub.add_parser("train", help="train a model family on synthetic talking faces")
    t.add_argument("--out", type=Path, required=True, help="weights + checkpoint folder")
    t.add_argument(
        "--family",
        choices=family_names(),
        default=DEFAULT_FAMILY,
        help="the family to train (studio: every network on rendered clips; portrait: the "
        "motion generator only)",
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
    from talkloop.pipeline.args import add_model_args, add_video_args

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


def _family_command(args: argparse.Namespace, role: str):
    """The family's ``module:function`` for ``role`` (``trainer`` or ``evaluator``)."""
    target = getattr(get_spec(args.family), role)
    if target is None:
        verb = "trained" if role == "trainer" else "evaluated"
        raise ConfigError(f"the {args.family} family cannot be {verb} with talkloop")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def cmd_train(args: argparse.Namespace) -> int:
    """Run ``talkloop train``: the family's own trainer."""
    return _family_command(args, "trainer")(args)


def cmd_eval(args: argparse.Namespace) -> int:
    """Run ``talkloop eval``: the family's own evaluation."""
    if args.clips < 1:
        raise ConfigError(f"--clips must be >= 1, got {args.clips}")
    if args.minutes <= 0:
        raise ConfigError(f"--minutes must be > 0, got {args.minutes}")
    return _family_command(args, "evaluator")(args)
