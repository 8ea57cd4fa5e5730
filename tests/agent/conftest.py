"""Fixtures of the agent tests: a tiny pipeline with the live chunk schedule."""

from __future__ import annotations

import pytest

from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.models.registry import build_pipeline
from talkloop.rtc.app import live_config_dict

from support import tiny_config


@pytest.fixture(scope="module")
def live_pipeline(tiny_modules) -> Pipeline:
    base = tiny_config().model_dump(mode="json")
    base.pop("schedule")
    return build_pipeline(build_config(**live_config_dict(base)), tiny_modules)
