"""Fixtures for the studio network tests: tiny configs, and the real text encoder loaded once."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from talkloop.pipeline.models.shared.text_encoder import TextEncoder, TextEncoderConfig
from talkloop.pipeline.models.studio.family import StudioConfig


@pytest.fixture
def tiny() -> StudioConfig:
    return StudioConfig.tiny()


@pytest.fixture(scope="session")
def text_encoder() -> TextEncoder:
    enc = TextEncoder(TextEncoderConfig())
    enc.load()  # ~5 s, once per test session
    return enc


def _randomise(net: nn.Module, std: float = 0.1, seed: int = 0) -> nn.Module:
    """Overwrite every parameter with noise so zero-initialised branches carry signal.

    adaLN-Zero and zero-init output layers make an untrained network ignore its inputs; wiring
    tests need every path live.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return net


@pytest.fixture
def randomise():
    """The :func:`_randomise` helper, as a fixture (tests/ is not a package)."""
    return _randomise
