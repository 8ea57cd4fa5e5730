"""Seeded blinks: a property of the frame number, at the studio's rate, fully closing."""

from __future__ import annotations

import numpy as np
import pytest

from talkloop.pipeline.models.portrait.blinks import blink_track

pytestmark = pytest.mark.unit

FPS = 25


def test_a_frame_blinks_the_same_however_the_stream_is_cut() -> None:
    whole = blink_track(7, 0, 1000, FPS)
    cuts = [0, 2, 5, 29, 30, 301, 777, 1000]
    pieces = [blink_track(7, a, b - a, FPS) for a, b in zip(cuts, cuts[1:], strict=False)]
    assert np.array_equal(np.concatenate(pieces), whole)


def test_about_one_blink_every_four_seconds_each_closing_fully() -> None:
    track = blink_track(3, 0, 10 * 60 * FPS, FPS)  # ten minutes
    shut = track > 0.5
    blinks = int(np.count_nonzero(shut[1:] & ~shut[:-1]))
    assert 0.2 <= blinks / 600 <= 0.3
    starts = np.flatnonzero(shut[1:] & ~shut[:-1]) + 1
    assert all(track[s : s + 4].max() == 1.0 for s in starts)  # each one closes the eyes fully
    assert np.mean(track > 0.5) < 0.05  # eyes open most of the time
    assert track.min() == 0.0 and track.max() == 1.0


def test_seeds_differ() -> None:
    assert not np.array_equal(blink_track(1, 0, 2000, FPS), blink_track(2, 0, 2000, FPS))
