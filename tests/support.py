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


# -- test signals ---------------------------------------------------------------------------------


def tone(n: int, rate: int, hz: float = 440.0, amp: float = 0.5, dtype=np.float32) -> np.ndarray:
    """``n`` samples at ``rate`` of a sine at ``hz`` with peak ``amp``, starting at phase 0."""
    t = np.arange(n) / rate
    return (amp * np.sin(2 * np.pi * hz * t)).astype(dtype)


def tone_pcm16(n: int, rate: int, hz: float = 440.0, amp: float = 0.5) -> np.ndarray:
    """``tone`` as little-endian 16-bit PCM (``.tobytes()`` for the wire)."""
    return (tone(n, rate, hz, amp, np.float64) * 32767).astype("<i2")


def band_share(x: np.ndarray, rate: int, lo: float, hi: float) -> float:
    """Share of the power (DC aside) of ``x`` that lies in ``[lo, hi]`` Hz."""
    spec = np.abs(np.fft.rfft(x * np.hanning(x.shape[0]))) ** 2
    freqs = np.fft.rfftfreq(x.shape[0], 1 / rate)
    return float(spec[(freqs >= lo) & (freqs <= hi)].sum() / max(spec[1:].sum(), 1e-20))


def loudest_second(x: np.ndarray, rate: int) -> np.ndarray:
    """The loudest whole second of ``x`` (on a 100 ms grid); all of ``x`` if it is shorter."""
    step = rate // 10
    energy = [float(np.sum(x[i : i + rate] ** 2)) for i in range(0, x.shape[0] - rate + 1, step)]
    start = int(np.argmax(energy)) * step if energy else 0
    return x[start : start + rate]


def psnr(a, b, peak: float = 255.0) -> float:
    """PSNR (dB) of ``a`` against ``b`` from the mean squared error over all their elements (one
    figure for a whole clip, not a mean of per-frame figures); ``peak``: the signal's range."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float(10 * np.log10(peak**2 / max(mse, 1e-12)))


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


# -- what a receiver can check without a clock ---------------------------------------------------
#
# A call's timing on a shared machine is nobody's business in a test (`talkloop bench --live`
# measures it). What is exact whatever the speed: the media timestamps a peer receives, the order
# of events, and which generated frame a received picture shows (tests/rtc/scenarios/common.py).


def on_frame_grid(video_pts: list[int], fps: int = 25, clock: int = 90000) -> bool:
    """Received RTP video timestamps: each frame a later frame slot than the one before. A paced
    sender sends each frame at its own media time; one that falls behind skips slots, and never
    sends a slot twice or off the frame grid."""
    d = np.diff(np.asarray(video_pts, dtype=np.int64))
    return len(video_pts) > 0 and bool(np.all((d > 0) & (d % (clock // fps) == 0)))


def contiguous_audio(audio_pts: list[int], block: int = 960) -> bool:
    """Received audio timestamps: every 20 ms block (960 samples at 48 kHz) from the first to the
    last, none missing, none repeated (the avatar's audio never skips, however late video is)."""
    d = np.diff(np.asarray(audio_pts, dtype=np.int64))
    return len(audio_pts) > 0 and bool(np.all(d == block))


def speech_and_pauses(
    index: list[int],
    driving_rms: list[float | None],
    loud: float = 0.02,
    quiet: float = 0.002,
    margin: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
    """Masks over ``index`` (generated frame numbers): speech, the frame's own driving audio is
    loud; pause, it and every generated frame within ``margin`` frames of it are quiet (away from
    where speech starts and ends, which a mouth anticipates and follows). ``driving_rms[k]`` is
    frame k's (None: never generated, a chunk skipped to catch up: its audio is not known and
    not held against its neighbours)."""
    rms = np.array([np.nan if v is None else v for v in driving_rms], dtype=np.float64)
    idx = np.asarray(index, dtype=np.int64)
    speech = rms[idx] > loud
    pause = np.array(
        [np.all(np.nan_to_num(rms[max(0, k - margin) : k + margin + 1]) < quiet) for k in idx],
        dtype=bool,
    )
    return speech, pause
