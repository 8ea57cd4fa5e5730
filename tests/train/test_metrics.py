"""The evaluation figures on series whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from talkloop.pipeline.train.metrics import (
    drift_per_minute,
    face_distance,
    frame_changes,
    lipsync,
    seam_ratio,
)

pytestmark = pytest.mark.unit


def test_lipsync_finds_the_lag_of_a_late_video() -> None:
    rng = np.random.default_rng(0)
    truth = [np.convolve(rng.random(200), np.ones(3) / 3, mode="same") for _ in range(3)]
    late = [np.concatenate([np.zeros(2), t[:-2]]) for t in truth]  # video 2 frames late
    out = lipsync(late, truth, fps=25)
    assert out["lipsync_lag_ms"] == pytest.approx(80.0)
    assert out["lipsync_corr"] > 0.95 > out["lipsync_corr_at_0"]


def test_lipsync_of_unrelated_mouth_is_low() -> None:
    rng = np.random.default_rng(1)
    truth = [rng.random(300)]
    out = lipsync([rng.random(300)], truth, fps=25)
    assert out["lipsync_corr"] < 0.3


def test_pooled_lipsync_counts_amplitude_per_clip_and_the_clip_mean_does_not() -> None:
    rng = np.random.default_rng(2)
    truth = [rng.random(200) for _ in range(2)]
    # Right timing, but the first clip moves 4x too little and the second 4x too much.
    video = [truth[0] * 0.25, truth[1] * 4.0]
    out = lipsync(video, truth, fps=25)
    assert out["lipsync_corr_clip_mean"] == pytest.approx(1.0)
    assert out["lipsync_corr"] < 0.9


def test_seam_ratio_sees_a_jump_at_seams_only() -> None:
    frames = np.zeros((30, 8, 8, 3), np.uint8)
    frames[:, :, :, 0] = (np.arange(30) * 2)[:, None, None]  # smooth: red changes 2/255 a frame
    smooth = frame_changes(frames)
    assert seam_ratio([smooth], [[10, 20]]) == pytest.approx(1.0)
    jumpy = frames.copy()
    jumpy[10:] += 6  # a 6/255 jump entering frame 10
    changes = frame_changes(jumpy)
    # Seam change (2 + 6 + 6 + 6) / 3 against 2 / 3 within (red moves; the jump hits all channels).
    assert seam_ratio([changes], [[10]]) == pytest.approx(10.0, rel=0.01)
    assert seam_ratio([changes], [[20]]) < 1.0  # the jump is not at that seam


def test_drift_is_the_slope_per_minute() -> None:
    secs = np.arange(0, 120, 0.04)
    dist = 0.1 + 0.02 * secs / 60.0
    assert drift_per_minute(secs, dist) == pytest.approx(0.02)


def test_face_distance_only_counts_the_box() -> None:
    ref = np.zeros((16, 16, 3), np.uint8)
    frames = np.zeros((2, 16, 16, 3), np.uint8)
    frames[1, :4] = 255  # outside the box
    frames[1, 8:, 8:] = 255  # fills the box
    d = face_distance(frames, ref, np.array([8, 8, 16, 16], np.float32))
    assert d[0] == 0.0 and d[1] == pytest.approx(1.0)
