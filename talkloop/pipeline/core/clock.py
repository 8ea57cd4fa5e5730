"""The media clock: every timestamp derives from the driving audio's sample clock.

Frame ``j`` covers the audio samples ``[frame_start_sample(j), frame_start_sample(j + 1))``.
Boundaries are exact integers (floor of ``j * sample_rate / fps``), so for any fps and sample rate
every audio sample lies in exactly one frame interval and nothing drifts over hours. The one
rounding rule for frame counts is ``frames_for_samples``: the number of frames whose interval
starts before the end of the audio (a ceiling), so the last partial interval still gets a frame.
"""

from __future__ import annotations


def frame_start_sample(frame: int, fps: int, sample_rate: int) -> int:
    """First audio sample covered by ``frame`` (frame 0 starts at sample 0)."""
    return (frame * sample_rate) // fps


def frames_for_samples(num_samples: int, fps: int, sample_rate: int) -> int:
    """How many frames a stretch of ``num_samples`` samples is shown as (ceil rule)."""
    if num_samples <= 0:
        return 0
    return (num_samples * fps + sample_rate - 1) // sample_rate


def frame_at_sample(sample: int, fps: int, sample_rate: int) -> int:
    """The frame whose interval contains ``sample``: the last frame starting at or before it."""
    return frames_for_samples(sample + 1, fps, sample_rate) - 1
