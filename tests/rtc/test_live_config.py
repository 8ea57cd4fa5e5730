"""What a live call's config adds to the command line's (talkloop.rtc.app.live_config_dict)."""

from __future__ import annotations

import os

import pytest

from talkloop.pipeline.args import config_from_args
from talkloop.pipeline.cli import build_parser
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.core.errors import ConfigError
from talkloop.rtc.app import live_config_dict

pytestmark = pytest.mark.unit


def _live(argv: list[str]):
    args = build_parser().parse_args(["serve", *argv])
    base = config_from_args(args).model_dump(mode="json")
    base.pop("schedule")
    return build_config(**live_config_dict(base))


def test_live_calls_render_in_a_worker_process_per_core_unless_told() -> None:
    assert _live([]).model.render_processes == len(os.sched_getaffinity(0))
    assert _live(["--render-processes", "0"]).model.render_processes == 0
    assert _live(["--render-processes", "3"]).model.render_processes == 3


def test_a_render_keeps_rendering_on_its_own_thread() -> None:
    args = build_parser().parse_args(["render", "--audio", "a.wav", "--out", "o.mp4"])
    assert config_from_args(args).model.render_processes is None  # phases() take it as 0


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ConfigError, match="model.render_processes: .*greater than or equal to 0"):
        _live(["--render-processes", "-1"])
