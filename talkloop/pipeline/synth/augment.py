"""Audio augmentation that keeps timing: noise, reverb, EQ, gain and speed perturbation.

Noise, reverb, EQ and gain never change the length or shift the signal (the reverb's direct path
is at delay 0), so phoneme timings stay valid. Speed perturbation changes both: it returns the
audio and the phoneme start samples scaled together, and must run before the frames are made.
"""

from __future__ import annotations

import numpy as np

from talkloop.pipeline.audio.io import resample


def speed_perturb(
    audio: np.ndarray, starts: np.ndarray, sample_rate: int, factor: float
) -> tuple[np.ndarray, np.ndarray]:
    """Play ``factor`` times faster (pitch moves with it, like a tape); timings scale by 1/factor.

    Returns:
        ``(audio, starts)`` with ``len(audio) ~= n / factor`` and ``starts ~= starts / factor``.
    """
    if not 0.5 <= factor <= 2.0:
        raise ValueError(f"speed factor must be in [0.5, 2], got {factor}")
    out = resample(audio, int(round(sample_rate * factor)), sample_rate)
    scaled = np.floor(starts.astype(np.float64) * len(out) / max(1, len(audio))).astype(np.int64)
    return out, np.minimum(scaled, len(out))


def add_noise(audio: np.ndarray, rng: np.random.Generator, snr_db: float) -> np.ndarray:
    """White, pink or brown noise (or mains hum) at ``snr_db`` below the speech power."""
    n = len(audio)
    kind = int(rng.integers(4))
    if kind == 3:
        t = np.arange(n) / 16000.0
        f0 = 50.0 if rng.random() < 0.5 else 60.0
        noise = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6.3)) / k for k in (1, 2, 3))
    else:
        spec = np.fft.rfft(rng.standard_normal(n))
        f = np.arange(len(spec)) + 1.0
        spec /= f ** (0.5 * kind)  # 0 white, 1 pink, 2 brown
        noise = np.fft.irfft(spec, n)
    p_sig = float(np.mean(audio**2)) + 1e-10
    p_noise = float(np.mean(noise**2)) + 1e-12
    return audio + noise * np.sqrt(p_sig / p_noise / 10 ** (snr_db / 10))


def reverb(audio: np.ndarray, rng: np.random.Generator, rt60: float, wet: float) -> np.ndarray:
    """Convolve with a synthetic room: direct path plus exponentially decaying noise."""
    sr = 16000
    length = int(min(rt60, 1.0) * sr)
    t = np.arange(length) / sr
    ir = rng.standard_normal(length) * np.exp(-6.9 * t / rt60)
    ir[: int(0.003 * sr)] = 0.0  # first reflections arrive after a few ms
    ir *= wet / (np.sqrt(np.sum(ir**2)) + 1e-9)
    ir[0] = 1.0
    n = len(audio) + length
    size = 1 << int(np.ceil(np.log2(n)))
    out = np.fft.irfft(np.fft.rfft(audio, size) * np.fft.rfft(ir, size), size)[: len(audio)]
    return out


def equalise(audio: np.ndarray, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """A smooth random EQ curve: tilt, a few bumps, and sometimes a telephone/laptop band."""
    spec = np.fft.rfft(audio)
    f = np.fft.rfftfreq(len(audio), 1.0 / sample_rate)
    lf = np.log2(np.maximum(f, 20.0) / 1000.0)
    db = rng.uniform(-3, 3) * lf
    for _ in range(int(rng.integers(1, 4))):
        db += rng.uniform(-8, 8) * np.exp(-0.5 * ((lf - rng.uniform(-3, 2.5)) / 0.5) ** 2)
    if rng.random() < 0.3:
        lo, hi = rng.uniform(100, 400), rng.uniform(3000, 7000)
        db -= 24 * (
            np.maximum(0, np.log2(lo / np.maximum(f, 1)))
            + np.maximum(0, np.log2(np.maximum(f, 1) / hi))
        )
    return np.fft.irfft(spec * 10 ** (np.maximum(db, -60) / 20), len(audio))


def augment(
    audio: np.ndarray, rng: np.random.Generator, sample_rate: int = 16000
) -> tuple[np.ndarray, dict[str, float]]:
    """Random EQ, reverb, noise and gain (each with some probability); length is unchanged.

    Returns:
        float32 audio in [-1, 1] of the same length, and what was applied.
    """
    x = audio.astype(np.float64)
    info: dict[str, float] = {}
    if rng.random() < 0.6:
        x = equalise(x, rng, sample_rate)
        info["eq"] = 1.0
    if rng.random() < 0.5:
        info["rt60"] = float(rng.uniform(0.15, 0.8))
        info["wet"] = float(rng.uniform(0.2, 0.9))
        x = reverb(x, rng, info["rt60"], info["wet"])
    if rng.random() < 0.6:
        info["snr_db"] = float(rng.uniform(5, 35))
        x = add_noise(x, rng, info["snr_db"])
    info["gain_db"] = float(rng.uniform(-18, 4))
    peak = float(np.max(np.abs(x))) + 1e-9
    x = x / peak * 0.9 * 10 ** (info["gain_db"] / 20)
    return np.clip(x, -1.0, 1.0).astype(np.float32), info
