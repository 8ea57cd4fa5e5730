"""Non-mouth motion that goes with speech: blinks, head motion, nods, brows, smile and gaze.

Head motion is smoothed noise scaled by the style's energy, calmer in silence, with a nod (a dip
in pitch) on stressed syllables. Brows lift on some stressed syllables. Blinks are a Poisson
process. Everything is deterministic from the generator passed in.
"""

from __future__ import annotations

import numpy as np

from talkloop.pipeline.models.portrait.params import FrameParams
from talkloop.pipeline.synth.style import SMILE_RANGE, Style, smile_of_style
from talkloop.pipeline.synth.visemes import MouthTracks


def _smooth_noise(rng: np.random.Generator, n: int, sigma_frames: float) -> np.ndarray:
    """Gaussian-smoothed white noise with unit standard deviation, ``(n,)``."""
    half = int(3 * sigma_frames) + 1
    k = np.exp(-0.5 * (np.arange(-half, half + 1) / sigma_frames) ** 2)
    x = np.convolve(rng.standard_normal(n + 2 * half), k, mode="valid")[:n]
    return x / (np.sqrt((k**2).sum()) + 1e-9)


def _pulse(n: int, centre: float, width: float) -> np.ndarray:
    j = np.arange(n)
    return np.exp(-0.5 * ((j - centre) / width) ** 2)


def _follow(x: np.ndarray, alpha: float) -> np.ndarray:
    """One-pole smoothing (attack/decay of activity)."""
    y = np.empty_like(x)
    acc = float(x[0]) if len(x) else 0.0
    for i, v in enumerate(x):
        acc += alpha * (float(v) - acc)
        y[i] = acc
    return y


def blink_track(rng: np.random.Generator, n: int, fps: int, rate_hz: float) -> np.ndarray:
    """Blinks (close ~60 ms, open ~120 ms) at ``rate_hz`` on average, some of them double."""
    out = np.zeros(n, np.float32)
    t = rng.exponential(1.0 / rate_hz) * 0.5
    while t * fps < n:
        for start in [t] + ([t + 0.3] if rng.random() < 0.12 else []):
            c = start * fps
            j = np.arange(n)
            close = np.clip(1.0 - (c - j) / (0.06 * fps), 0.0, 1.0) * (j <= c)
            reopen = np.clip(1.0 - (j - c) / (0.12 * fps), 0.0, 1.0) * (j > c)
            out = np.maximum(out, (close + reopen).astype(np.float32))
        t += max(0.6, rng.exponential(1.0 / rate_hz))
    return out


def motion_params(
    mouth: MouthTracks, stress_frames: np.ndarray, style: Style, fps: int, rng: np.random.Generator
) -> FrameParams:
    """Combine mouth tracks with style-driven face and head motion.

    Args:
        mouth: per-frame mouth tracks and speech activity.
        stress_frames: frame indices of stressed syllables (nods, brow raises).
        style: smile, energy, brows, gaze in [0, 1].
        fps: frame rate (sets the time scale of motion).

    Returns:
        Every field of ``FrameParams``.
    """
    n = len(mouth.mouth_open)
    p = FrameParams.neutral(n)
    for name in ("mouth_open", "mouth_width", "mouth_round", "teeth", "tongue", "jaw"):
        p[name] = getattr(mouth, name)
    active = _follow(mouth.speaking.astype(np.float32), 4.0 / fps)  # ~0.25 s attack/decay
    amp = (0.25 + 0.75 * active) * (0.3 + 1.2 * style.energy)
    sec = float(fps)
    yaw = 0.06 * _smooth_noise(rng, n, 0.8 * sec) + 0.02 * _smooth_noise(rng, n, 0.25 * sec)
    pitch = 0.03 * _smooth_noise(rng, n, 0.6 * sec)
    roll = 0.025 * _smooth_noise(rng, n, 0.9 * sec)
    brow = np.full(n, (style.brows - 0.5) * 0.3, np.float32)
    for f in stress_frames:
        # Nods: the head dips a little after the stressed vowel starts and comes back.
        pitch += 0.035 * (0.4 + style.energy) * _pulse(n, f + 0.05 * fps, 0.09 * fps)
        if rng.random() < 0.15 + 0.6 * style.brows:
            brow += 0.6 * (0.3 + style.brows) * _pulse(n, f, 0.12 * fps)
    p["yaw"] = np.clip(yaw * amp, -0.3, 0.3)
    p["pitch"] = np.clip(pitch * amp, -0.25, 0.25)
    p["roll"] = np.clip(roll * amp, -0.2, 0.2)
    p["tx"] = np.clip(0.015 * _smooth_noise(rng, n, 1.2 * sec) * amp, -0.06, 0.06)
    p["ty"] = np.clip(0.01 * _smooth_noise(rng, n, 1.0 * sec) * amp, -0.04, 0.04)
    p["brow_raise"] = np.clip(brow + 0.08 * _smooth_noise(rng, n, 0.7 * sec), -1.0, 1.0)
    smile = smile_of_style(style.smile) + 0.1 * _smooth_noise(rng, n, 1.5 * sec)
    p["smile"] = np.clip(smile, *SMILE_RANGE)
    p["blink"] = blink_track(rng, n, fps, 0.2 + 0.15 * active.mean())
    p["gaze_x"], p["gaze_y"] = _gaze(rng, n, fps, style.gaze)
    return p


def _gaze(rng: np.random.Generator, n: int, fps: int, wander: float) -> tuple[np.ndarray, ...]:
    """Fixations joined by quick saccades; ``wander`` sets how far and how often eyes move."""
    gx, gy = np.zeros(n, np.float32), np.zeros(n, np.float32)
    j, x, y = 0, 0.0, 0.0
    while j < n:
        hold = int(fps * rng.uniform(0.6, 3.0) * (1.3 - wander))
        gx[j : j + max(1, hold)] = x
        gy[j : j + max(1, hold)] = y
        j += max(1, hold)
        if rng.random() < 0.3 + 0.5 * wander:
            x = float(np.clip(rng.normal(0, 0.15 + 0.6 * wander), -1, 1))
            y = float(np.clip(rng.normal(0, 0.1 + 0.3 * wander), -1, 1))
        else:
            x, y = 0.0, 0.0
    # Saccades take about two frames.
    k = np.array([0.25, 0.5, 0.25])
    return np.convolve(gx, k, mode="same"), np.convolve(gy, k, mode="same")
