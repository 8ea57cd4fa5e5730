"""MediaClock: one playout clock for the audio and video tracks of a live session.

Driving-audio sample ``n`` is played at ``t0 + n / sample_rate`` and video frame ``j`` at the time
of its first sample. ``t0`` is the arrival of the first driving sample plus a fixed playout delay
(the time a chunk needs to be heard, generated and published), so both tracks leave from one
clock and the browser's RTCP-based lip sync has nothing to correct.
"""

from __future__ import annotations

import time


class MediaClock:
    def __init__(self, sample_rate: int, delay_s: float) -> None:
        self.sample_rate = sample_rate
        self.delay_s = delay_s
        self.t0: float | None = None

    def start(self, first_sample_at: float | None = None) -> None:
        """Anchor sample 0: it arrived at ``first_sample_at`` (default: now)."""
        if self.t0 is None:
            self.t0 = (
                time.monotonic() if first_sample_at is None else first_sample_at
            ) + self.delay_s

    @property
    def started(self) -> bool:
        return self.t0 is not None

    def due(self, sample: int) -> float:
        """Monotonic time at which ``sample`` is played."""
        if self.t0 is None:
            raise RuntimeError("MediaClock.due before start")
        return self.t0 + sample / self.sample_rate

    def sample_now(self) -> int:
        """The sample being played right now (negative before t0)."""
        if self.t0 is None:
            return -1
        return int((time.monotonic() - self.t0) * self.sample_rate)
