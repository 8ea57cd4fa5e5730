"""``talkloop train`` / ``eval`` take each family's own options from its spec, and refuse one
family's options given with another family, before any work starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from talkloop.pipeline.cli import build_parser
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.train.cli import cmd_eval, cmd_train

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["train", "--family", "studio", "--steps", "3"],
            "--steps is an option of --family portrait",
        ),
        (["train", "--family", "portrait", "--resume"], "--resume is an option of --family studio"),
        (["eval", "--family", "portrait", "--card"], "--card is an option of --family studio"),
    ],
)
def test_another_familys_option_is_refused(tmp_path: Path, argv, message) -> None:
    out = tmp_path / "out"
    args = build_parser().parse_args([*argv, "--out", str(out)])
    command = cmd_train if argv[0] == "train" else cmd_eval
    with pytest.raises(ConfigError, match=message):
        command(args)
    assert not out.exists()


def test_each_family_adds_its_own_options_in_its_own_group() -> None:
    args = build_parser().parse_args(
        ["train", "--out", "x", "--family", "studio", "--steps-vae", "5"]
    )
    assert args.steps_vae == 5 and args.steps is None
    assert set(args.family_options) == {"portrait", "studio"}
    dests = {name: {a.dest for a in actions} for name, actions in args.family_options.items()}
    assert "steps" in dests["portrait"] and "data" in dests["studio"]
    assert not dests["portrait"] & dests["studio"]
