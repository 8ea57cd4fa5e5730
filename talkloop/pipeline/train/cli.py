"""``talkloop train`` and ``talkloop eval``: argument parsing only; the work is elsewhere."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from talkloop.pipeline.args import add_model_args, add_video_args
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.spec import DEFAULT_FAMILY, family_names, get_spec, specs


class _Recorded:
    """An argument group that remembers the arguments added to it."""

    def __init__(self, group: argparse._ArgumentGroup) -> None:
        self.group = group
        self.actions: list[argparse.Action] = []

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = self.group.add_argument(*args, **kwargs)
        self.actions.append(action)
        return action


def _add_family_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Each family's own options of ``command`` (its spec's ``cli_args``), one group per family;
    the parsed namespace remembers whose they are, so that :func:`_check_family_options` can
    refuse one family's options given with another family."""
    owned: dict[str, list[argparse.Action]] = {}
    for name, fam in specs().items():
        if fam.cli_args is None:
            continue
        group = _Recorded(parser.add_argument_group(f"--family {name}"))
        _function(fam.cli_args)(command, group)
        owned[name] = group.actions
    parser.set_defaults(family_options=owned)


def _check_family_options(args: argparse.Namespace) -> None:
    for name, actions in args.family_options.items():
        for action in actions:
            if name != args.family and getattr(args, action.dest) != action.default:
                raise ConfigError(
                    f"{action.option_strings[0]} is an option of --family {name}, "
                    f"not of --family {args.family}"
                )


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``train``: the options every family takes, then each family's own."""
    t = sub.add_parser("train", help="train a model family on synthetic talking faces")
    t.add_argument("--out", type=Path, required=True, help="weights + checkpoint folder")
    t.add_argument(
        "--family",
        choices=family_names(),
        default=DEFAULT_FAMILY,
        help="the family to train: "
        + "; ".join(f"{name}: {fam.summary}" for name, fam in specs().items()),
    )
    t.add_argument("--clips", type=int, help="training clips to generate (the family's default)")
    t.add_argument("--minutes", type=float, help="wall-clock budget for the training phases")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_family_options(t, "train")


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``eval`` (model options come from the shared model arguments)."""
    e = sub.add_parser("eval", help="score weights on held-out clips (JSON + PNG)")
    e.add_argument("--out", type=Path, required=True, help="folder for eval.json and eval.png")
    e.add_argument("--clips", type=int, default=4, help="test clips for lip sync and seams")
    e.add_argument("--minutes", type=float, default=1.0, help="length of the drift generation")
    e.add_argument("--quiet", action="store_true", help="no progress output")
    add_video_args(e)
    add_model_args(e)
    _add_family_options(e, "eval")


def _function(target: str):
    """The function a spec names as ``module:function``."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _family_command(args: argparse.Namespace, role: str):
    """The family's ``module:function`` for ``role`` (``trainer`` or ``evaluator``)."""
    target = getattr(get_spec(args.family), role)
    if target is None:
        verb = "trained" if role == "trainer" else "evaluated"
        raise ConfigError(f"the {args.family} family cannot be {verb} with talkloop")
    _check_family_options(args)
    return _function(target)


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
