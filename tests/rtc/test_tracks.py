"""The outgoing video track hands aiortc the avatar's frames as they are."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import numpy as np
import pytest

from talkloop.agent.frames import VideoFrame
from talkloop.rtc.tracks import VIDEO_CLOCK, AvatarVideoTrack

pytestmark = pytest.mark.unit


class Frames:
    """An AvatarSession's ``next_video`` over given pictures."""

    def __init__(self, pictures: list[np.ndarray]) -> None:
        self.pictures, self.index = pictures, 0

    async def next_video(self) -> VideoFrame:
        j, self.index = self.index, self.index + 1
        return VideoFrame(self.pictures[j], j, 640 * j, 16000)  # 640: a frame at 16 kHz


def test_frames_of_any_layout_go_out_with_their_pixels_and_time() -> None:
    """A published frame (its own contiguous copy), and the idle frame, which is the caller's
    avatar image and may be a view (channels reversed, every other column)."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (48, 128, 3), dtype=np.uint8)
    pictures = [base[:, :64].copy(), base[..., ::-1], base[:, ::2]]
    track = AvatarVideoTrack(Frames(pictures))  # type: ignore[arg-type]
    for k, rgb in enumerate(pictures):
        frame = asyncio.run(track.recv())
        assert np.array_equal(frame.to_ndarray(format="rgb24"), rgb)
        assert frame.time_base == Fraction(1, VIDEO_CLOCK)
        assert frame.pts == k * 640 * VIDEO_CLOCK // 16000  # 40 ms on the 90 kHz clock
