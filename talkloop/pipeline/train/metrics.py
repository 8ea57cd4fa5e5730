"""Quality figures (docs/architecture.md) computed from frames and the synthetic clips' ground truth.

Pure numpy: the evaluation produces the series, these functions turn them into numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two series; 0 where either is constant."""
    a, b = a - a.mean(), b - b.mean()
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 1e-12 else 0.0


def _at_lag(v: np.ndarray, t: np.ndarray, lag: int) -> tuple[np.ndarray, np.ndarray]:
    """One clip's centred (truth, video) pairs with the video shifted ``lag`` frames late."""
    n = min(len(v), len(t))
    v, t = v[:n] - v[:n].mean(), t[:n] - t[:n].mean()
    if lag >= 0:
        return (t[: n - lag] if lag else t), v[lag:]
    return t[-lag:], v[: n + lag]


def lag_correlations(
    video: Sequence[np.ndarray], truth: Sequence[np.ndarray], max_lag: int
) -> tuple[np.ndarray, np.ndarray]:
    """Pearson correlation of video vs truth series at every lag, pooled over clips.

    A positive lag ``L`` pairs ``truth[t]`` with ``video[t + L]``: the video is ``L`` frames late.
    Each clip's series is centred first, so clips with different offsets do not add correlation.

    Returns:
        ``(lags (2 max_lag + 1,), correlations (2 max_lag + 1,))``.
    """
    lags = np.arange(-max_lag, max_lag + 1)
    corrs = np.zeros(len(lags))
    for i, lag in enumerate(lags):
        pairs = [_at_lag(v, t, int(lag)) for v, t in zip(video, truth, strict=True)]
        corrs[i] = pearson(
            np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])
        )
    return lags, corrs


def lipsync(
    mouth_video: Sequence[np.ndarray],
    mouth_truth: Sequence[np.ndarray],
    fps: int,
    max_lag_ms: float = 200.0,
) -> dict[str, float]:
    """``lipsync_corr`` (peak correlation), ``lipsync_lag_ms`` (its lag; > 0: video late),
    ``lipsync_corr_at_0`` (correlation without any shift) and ``lipsync_corr_clip_mean`` (the
    mean of each clip's own correlation at that lag).

    The pooled figure also asks that every clip's mouth moves as much as its ground truth: a
    clip spoken with small movements but generated with large ones lowers it even when the
    timing is right. The per-clip mean sees timing only.
    """
    max_lag = int(round(max_lag_ms * fps / 1000.0))
    lags, corrs = lag_correlations(mouth_video, mouth_truth, max_lag)
    best = int(np.argmax(corrs))
    lag = int(lags[best])
    per_clip = [pearson(*_at_lag(v, t, lag)) for v, t in zip(mouth_video, mouth_truth, strict=True)]
    return {
        "lipsync_corr": float(corrs[best]),
        "lipsync_lag_ms": float(lags[best] * 1000.0 / fps),
        "lipsync_corr_at_0": float(corrs[max_lag]),
        "lipsync_corr_clip_mean": float(np.mean(per_clip)),
    }


def frame_changes(frames: np.ndarray) -> np.ndarray:
    """(T, H, W, 3) uint8 -> (T - 1,) mean absolute change between consecutive frames, in [0, 1].

    ``out[t - 1]`` is the change from frame ``t - 1`` to frame ``t``.
    """
    f = frames.astype(np.float32) / 255.0
    return np.abs(np.diff(f, axis=0)).mean(axis=(1, 2, 3))


def seam_ratio(changes: Sequence[np.ndarray], seams: Sequence[Iterable[int]]) -> float:
    """Mean frame change across chunk seams / mean change within chunks, pooled over clips.

    Args:
        changes: per clip, :func:`frame_changes` of its frames.
        seams: per clip, frame indices ``s`` where a new display segment starts (the change
            from ``s - 1`` to ``s`` crosses a seam).
    Returns:
        The ratio (1.0: seams are as smooth as the rest); NaN when there is no seam.
    """
    at, within = [], []
    for ch, ss in zip(changes, seams, strict=True):
        mask = np.zeros(len(ch), dtype=bool)
        for s in ss:
            if 1 <= s <= len(ch):
                mask[s - 1] = True
        at.append(ch[mask])
        within.append(ch[~mask])
    a, w = np.concatenate(at), np.concatenate(within)
    if a.size == 0 or w.size == 0:
        return float("nan")
    return float(a.mean() / max(float(w.mean()), 1e-9))


def drift_per_minute(seconds: np.ndarray, distance: np.ndarray) -> float:
    """Least-squares slope of distance against time, per minute of generation."""
    if len(seconds) < 2 or np.ptp(seconds) <= 0:
        return 0.0
    return float(np.polyfit(seconds / 60.0, distance, 1)[0])


def face_distance(frames: np.ndarray, reference: np.ndarray, box: np.ndarray) -> np.ndarray:
    """(T,) mean absolute RGB difference in [0, 1] to the reference inside the face ``box``."""
    h, w = reference.shape[:2]
    x0, y0 = int(max(0, np.floor(box[0]))), int(max(0, np.floor(box[1])))
    x1, y1 = int(min(w, np.ceil(box[2]))), int(min(h, np.ceil(box[3])))
    ref = reference[y0:y1, x0:x1].astype(np.float32) / 255.0
    cur = frames[:, y0:y1, x0:x1].astype(np.float32) / 255.0
    return np.abs(cur - ref[None]).mean(axis=(1, 2, 3))


def envelope(audio: np.ndarray, frames: int, fps: int, sample_rate: int) -> np.ndarray:
    """(frames,) RMS of the audio over each frame's interval."""
    out = np.zeros(frames, np.float32)
    for j in range(frames):
        a, b = j * sample_rate // fps, (j + 1) * sample_rate // fps
        seg = audio[a:b]
        out[j] = float(np.sqrt(np.mean(seg * seg))) if seg.size else 0.0
    return out
