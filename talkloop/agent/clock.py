"""Clocks: where "now" comes from, and the media clock that maps samples to play-out times.

A live session paces everything it emits against one ``Clock``. ``RealClock`` is the process's
monotonic clock. ``ManualClock`` only moves when told to, so tests drive pacing step by step and
assert exact schedules instead of wall-clock thresholds.

``MediaClock`` maps driving-audio sample ``n`` to ``t0 + n / sample_rate``, where ``t0`` is the
arrival of the first driving sample plus a fixed playout delay (the time a chunk needs to be
heard, generated and published). Video frame ``j`` plays at the time of its first sample, so audio
and video leave from one clock and cannot drift apart. The clock can only jump ahead
(``MediaClock.skip``): an early reply passes over idle media that would still have played before
it, and from then on sample ``n`` plays at ``t0 + (n - skipped) / sample_rate``; the outputs'
timestamps count played time, so they stay continuous across a jump.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from typing import Protocol


class Clock(Protocol):
    """The time source of a session (seconds, monotonic)."""

    def now(self) -> float: ...

    async def sleep_until(self, t: float) -> None: ...


class RealClock:
    """``time.monotonic`` and ``asyncio.sleep``. ``now`` is one function for every instance: the
    live engine batches the chunks of sessions whose deadlines are on the same clock."""

    @staticmethod
    def now() -> float:
        return time.monotonic()

    async def sleep_until(self, t: float) -> None:
        delay = t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class ManualClock:
    """A clock that moves only on ``advance`` (tests). Sleepers wake in deadline order."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()  # ties wake in the order they went to sleep

    def now(self) -> float:
        return self.t

    async def sleep_until(self, t: float) -> None:
        if t <= self.t:
            await asyncio.sleep(0)  # still yield, like a zero real sleep
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (t, next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has come."""
        self.t += seconds
        while self._sleepers and self._sleepers[0][0] <= self.t:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)


class MediaClock:
    """One playout clock for the audio and video of a session (see the module docstring)."""

    def __init__(self, sample_rate: int, delay_s: float, clock: Clock | None = None) -> None:
        self.sample_rate = sample_rate
        self.delay_s = delay_s
        self.clock: Clock = clock or RealClock()
        self.t0: float | None = None
        self.skipped = 0  # samples passed over by ``skip``: never played

    def start(self, first_sample_at: float | None = None) -> None:
        """Anchor sample 0: it arrived at ``first_sample_at`` (default: now)."""
        if self.t0 is None:
            at = self.clock.now() if first_sample_at is None else first_sample_at
            self.t0 = at + self.delay_s

    @property
    def started(self) -> bool:
        return self.t0 is not None

    def due(self, sample: int) -> float:
        """Clock time at which ``sample`` is played."""
        if self.t0 is None:
            raise RuntimeError("MediaClock.due before start")
        return self.t0 + (sample - self.skipped) / self.sample_rate

    def sample_now(self) -> int:
        """The sample being played right now (negative before t0)."""
        if self.t0 is None:
            return -1
        return int((self.clock.now() - self.t0) * self.sample_rate) + self.skipped

    def skip(self, samples: int) -> None:
        """Jump ahead: every sample from now on plays ``samples`` sooner, and the ``samples``
        that would have played first are never played (the caller's outputs pass over them)."""
        if samples < 0:
            raise ValueError(f"a media clock only jumps ahead, not by {samples} samples")
        self.skipped += samples


class Lateness:
    """How late (s) an output handed its recent frames on, against the media clock.

    A WebRTC sender stamps RTCP reports with the time of sending, so the receiver's lip sync sees
    exactly these values: ``av_offset`` is the video's minus the audio's. A fixed window:
    nothing grows with the length of a call.
    """

    def __init__(self, window: int = 250) -> None:
        self.recent: deque[float] = deque(maxlen=window)

    def add(self, seconds: float) -> None:
        self.recent.append(seconds)

    def median_ms(self) -> float | None:
        return None if not self.recent else 1000.0 * sorted(self.recent)[len(self.recent) // 2]


def av_offset_ms(video: Lateness, audio: Lateness) -> float | None:
    """Video minus audio send offset (positive: video late)."""
    v, a = video.median_ms(), audio.median_ms()
    return None if v is None or a is None else round(v - a, 1)
