"""Hot-path records: plain dataclasses that carry media between stages and sinks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from talkloop.pipeline.core.clock import frame_start_sample


@dataclass(frozen=True)
class StreamInfo:
    """What a sink needs to know before the first frame."""

    width: int
    height: int
    fps: int
    sample_rate: int

    def frame_pts(self, frame: int) -> int:
        """Timestamp of ``frame`` in audio samples (time base ``1 / sample_rate``)."""
        return frame_start_sample(frame, self.fps, self.sample_rate)


@dataclass
class VideoChunk:
    """Consecutive display frames ``first_index .. first_index + len(frames) - 1``.

    ``frames`` is ``(T, H, W, 3)`` uint8 RGB. ``epoch`` is the session's audio epoch when the
    chunk's audio was read (it grows at each interrupt): live outputs use it to withhold frames
    generated from audio that was interrupted before it was played.
    """

    frames: np.ndarray
    first_index: int
    epoch: int = 0

    def __len__(self) -> int:
        return int(self.frames.shape[0])


@dataclass
class AudioChunk:
    """Consecutive driving-audio samples starting at ``first_sample``: ``(n,)`` float32 mono."""

    samples: np.ndarray
    first_sample: int

    def __len__(self) -> int:
        return int(self.samples.shape[0])
