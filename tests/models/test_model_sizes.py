"""A size the weights were not made for runs, with one warning that says so and what to use."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import talkloop.pipeline.models.sizes as sizes
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.models import registry
from talkloop.pipeline.models.sizes import native_sizes, size_warning, warn_unless_native_size

pytestmark = pytest.mark.unit


def config(size: int | tuple[int, int], **model):
    w, h = (size, size) if isinstance(size, int) else size
    return build_config(video={"width": w, "height": h}, model={"family": "studio", **model})


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch) -> None:
    monkeypatch.setattr(sizes, "_warned", set())


def test_studio_weights_are_native_at_256_only() -> None:
    assert native_sizes(config(256)) == ((256, 256),)  # the shipped folder's train_summary.json
    assert size_warning(config(256)) is None
    message = size_warning(config(512))
    assert message.startswith("--size 512x512: the studio weights were made for 256x256 only")
    assert "use --size 256x256" in message
    assert size_warning(config((320, 256))) is not None


def test_random_weights_get_no_warning() -> None:
    assert native_sizes(config(512, untrained=True)) == ()
    assert size_warning(config(512, untrained=True)) is None


def test_a_weights_folder_is_judged_by_its_own_training_size(tmp_path: Path) -> None:
    (tmp_path / "train_summary.json").write_text(json.dumps({"recipe": {"size": 128}}))
    assert native_sizes(config(128, weights=tmp_path)) == ((128, 128),)
    assert size_warning(config(128, weights=tmp_path)) is None
    assert "made for 128x128 only" in size_warning(config(256, weights=tmp_path))
    # without a summary: the family's declared sizes
    (tmp_path / "train_summary.json").unlink()
    assert native_sizes(config(256, weights=tmp_path)) == ((256, 256),)


def test_each_family_declares_its_own_sizes() -> None:
    portrait = registry.family("portrait").NATIVE_SIZES
    assert native_sizes(config(512, family="portrait")) == tuple(portrait)
    assert size_warning(config(768, family="portrait")) is None
    assert "the portrait weights were made for 512x512" in size_warning(
        config(640, family="portrait")
    )


def test_loading_a_model_warns_once(monkeypatch, caplog) -> None:
    studio = registry.family("studio")
    monkeypatch.setattr(studio, "load_modules", lambda cfg: {})  # the check, not the networks
    with caplog.at_level(logging.WARNING, logger="talkloop.model"):
        registry.load_modules(config(512))
        registry.load_modules(config(512))
        registry.load_modules(config(256))
        warn_unless_native_size(config(512))
    assert [r.getMessage()[:15] for r in caplog.records] == ["--size 512x512:"]


@pytest.mark.parametrize("command", ["render", "serve", "bench"])
def test_help_says_what_other_sizes_give(capsys, command: str) -> None:
    from talkloop.pipeline.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the weights were not trained for them: expect a degraded, less animated face" in text
