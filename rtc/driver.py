"""AudioDriver: the live session's driving audio, produced on a real-time clock.

Every block (20 ms) the driver takes microphone audio that has arrived (or silence when none has)
and mixes in text-to-speech audio, then hands the block to the pipeline (which generates the
frames for it) and to the playout buffer (which the audio track sends, delayed by the clock's
playout delay). The pipeline therefore always has audio to work on: when nobody speaks it gets
silence and the avatar idles; it never waits and the video never freezes.

Microphone and "say" text combine like this: while text-to-speech audio is playing, the
microphone is ducked (ignored), so the avatar lip-syncs the speech it was asked to say; the
microphone drives it again as soon as the speech ends.

Everything here is cheap (array copies of a few hundred samples) and runs on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from rtc.clock import MediaClock


class PlayoutBuffer:
    """The last ``capacity`` driving samples, addressed by absolute sample index."""

    def __init__(self, capacity: int) -> None:
        self.data = np.zeros(capacity, dtype=np.float32)
        self.capacity = capacity
        self.end = 0  # one past the last sample written

    def append(self, samples: np.ndarray) -> None:
        n = samples.shape[0]
        idx = (np.arange(self.end, self.end + n)) % self.capacity
        self.data[idx] = samples
        self.end += n

    def read(self, start: int, count: int) -> np.ndarray:
        """Samples ``[start, start + count)``; zeros for what is not (or no longer) held."""
        out = np.zeros(count, dtype=np.float32)
        lo, hi = max(start, self.end - self.capacity, 0), min(start + count, self.end)
        if hi > lo:
            out[lo - start : hi - start] = self.data[np.arange(lo, hi) % self.capacity]
        return out

    def silence_from(self, start: int) -> None:
        """Zero everything written from ``start`` on (an interrupt)."""
        lo = max(start, self.end - self.capacity, 0)
        if self.end > lo:
            self.data[np.arange(lo, self.end) % self.capacity] = 0.0


class AudioDriver:
    """Produces the driving audio in real time. See the module docstring.

    Args:
        push: hands a block of driving audio to the pipeline (must not block).
        clock: the session's playout clock; started when the first block is produced.
        sample_rate: the pipeline's rate.
        block: samples per tick.
        max_mic_backlog_s: microphone audio older than this is dropped, so a burst of late
            packets cannot add lasting latency.
        playout_s: how much driving audio the playout buffer keeps (more than the delay).
        max_tts_s: text-to-speech audio queued at most.
    """

    def __init__(
        self,
        push: Callable[[np.ndarray], None],
        clock: MediaClock,
        sample_rate: int,
        block: int = 320,
        max_mic_backlog_s: float = 0.2,
        playout_s: float = 4.0,
        max_tts_s: float = 120.0,
    ) -> None:
        self.push = push
        self.clock = clock
        self.rate = sample_rate
        self.block = block
        self.max_mic = int(max_mic_backlog_s * sample_rate)
        self.max_tts = int(max_tts_s * sample_rate)
        self.playout = PlayoutBuffer(int(playout_s * sample_rate))
        self._mic: deque[tuple[np.ndarray, float]] = deque()  # (samples, arrival time)
        self._mic_len = 0
        self._tts: deque[np.ndarray] = deque()
        self._tts_len = 0
        self.samples = 0  # driving samples produced so far
        self.started_at: float | None = None
        # Arrival time of the audio in each block, for latency stamps: a fixed ring, by block.
        self._arrivals = np.zeros(self.playout.capacity // block + 1, dtype=np.float64)
        self.mic_dropped_samples = 0
        self.tts_dropped_samples = 0
        self.on_speech: Callable[[str], None] | None = None  # "started" / "finished"
        self._speaking = False

    # -- inputs (event loop) ----------------------------------------------------------------------

    def add_mic(self, samples: np.ndarray, arrived_at: float | None = None) -> None:
        self._mic.append((samples.astype(np.float32, copy=False), arrived_at or time.monotonic()))
        self._mic_len += samples.shape[0]
        while self._mic_len - self._mic[0][0].shape[0] >= self.max_mic:
            old, _ = self._mic.popleft()  # too much backlog: the oldest audio goes
            self._mic_len -= old.shape[0]
            self.mic_dropped_samples += old.shape[0]

    def say(self, samples: np.ndarray) -> bool:
        """Queue speech; False (nothing queued) if it would exceed ``max_tts_s``."""
        if self._tts_len + samples.shape[0] > self.max_tts:
            self.tts_dropped_samples += samples.shape[0]
            return False
        if samples.shape[0]:
            self._tts.append(samples.astype(np.float32, copy=False))
            self._tts_len += samples.shape[0]
        return True

    def interrupt(self) -> int:
        """Drop queued speech and silence produced-but-unplayed audio. Returns samples dropped."""
        dropped = self._tts_len
        self._tts.clear()
        self._tts_len = 0
        self.playout.silence_from(max(self.clock.sample_now(), 0))
        if self._speaking:
            self._speaking = False
            if self.on_speech:
                self.on_speech("interrupted")
        return dropped

    @property
    def tts_pending_s(self) -> float:
        return self._tts_len / self.rate

    # -- the clock ---------------------------------------------------------------------------------

    def arrival_of(self, sample: int) -> float | None:
        """When the audio at driving ``sample`` arrived (mic) or was produced (silence, TTS)."""
        if sample < 0 or sample >= self.samples or sample < self.samples - self.playout.capacity:
            return None
        return float(self._arrivals[(sample // self.block) % self._arrivals.shape[0]])

    def produce_due(self, now: float | None = None) -> int:
        """Produce every block whose time has come. Returns the number of blocks produced."""
        now = time.monotonic() if now is None else now
        if self.started_at is None:
            self.started_at = now
            self.clock.start(now)
        due = int((now - self.started_at) * self.rate) // self.block + 1
        made = 0
        while self.samples // self.block < due:
            self._produce_block(now)
            made += 1
        return made

    def _produce_block(self, now: float) -> None:
        n = self.block
        tts = self._take(self._tts, n, "_tts_len")
        mic, arrived = self._take_mic(n)
        if tts is not None:
            block = tts  # the microphone is ducked while speech plays (module docstring)
            if not self._speaking:
                self._speaking = True
                if self.on_speech:
                    self.on_speech("started")
        else:
            block = mic if mic is not None else np.zeros(n, dtype=np.float32)
            if self._speaking:
                self._speaking = False
                if self.on_speech:
                    self.on_speech("finished")
        self._arrivals[(self.samples // n) % self._arrivals.shape[0]] = arrived or now
        self.playout.append(block)
        self.samples += n
        self.push(block)

    def _take(self, queue: deque[np.ndarray], n: int, length_attr: str) -> np.ndarray | None:
        if not queue:
            return None
        out = np.zeros(n, dtype=np.float32)
        got = 0
        while queue and got < n:
            head = queue[0]
            k = min(n - got, head.shape[0])
            out[got : got + k] = head[:k]
            got += k
            if k == head.shape[0]:
                queue.popleft()
            else:
                queue[0] = head[k:]
        setattr(self, length_attr, getattr(self, length_attr) - got)
        return out

    def _take_mic(self, n: int) -> tuple[np.ndarray | None, float | None]:
        if not self._mic:
            return None, None
        arrived = self._mic[0][1]
        out = np.zeros(n, dtype=np.float32)
        got = 0
        while self._mic and got < n:
            head, t = self._mic[0]
            k = min(n - got, head.shape[0])
            out[got : got + k] = head[:k]
            got += k
            if k == head.shape[0]:
                self._mic.popleft()
            else:
                self._mic[0] = (head[k:], t)
        self._mic_len -= got
        return out, arrived

    async def run(self, tick_s: float = 0.02) -> None:
        """Produce blocks until cancelled, on absolute tick times (no drift)."""
        start = time.monotonic()
        k = 0
        while True:
            self.produce_due()
            k += 1
            await asyncio.sleep(max(0.0, start + k * tick_s - time.monotonic()))
