"""Test helpers shared by the test modules and the scenario scripts (import: `from support import`)."""

from __future__ import annotations

import asyncio
import time

import numpy as np


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
    from talkloop.pipeline.core.config import build_config

    base = {
        "video": {"width": 64, "height": 64, "fps": 25},
        "schedule": {"first_len": 2, "n_len": 6, "i_len": 2, "ctx_len": 2},
        "sampler": {"steps": 2},
        "model": {"family": "studio", "preset": "tiny", "untrained": True, "dtype": "float32"},
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


# -- manual-clock pacing of avatar sessions (tests/agent) ---------------------------------------


async def settle(avatar, timeout: float = 20.0) -> None:
    """Let the loop run, then wait until generation has done every chunk it has audio for."""
    for _ in range(5):
        await asyncio.sleep(0)
    deadline = time.monotonic() + timeout
    while avatar.session.ready():
        if time.monotonic() > deadline:
            raise AssertionError("generation did not catch up")
        await asyncio.sleep(0.002)
    for _ in range(5):
        await asyncio.sleep(0)


async def advance(avatar, clock, seconds: float, step: float = 0.01) -> None:
    """Move the manual clock in small steps, letting generation catch up after each."""
    for _ in range(int(round(seconds / step))):
        clock.advance(step)
        await settle(avatar)
