"""The live frame queue: a bounded, thread-safe hand-off from the generator to a live track.

The pipeline writes segments; a live consumer (a WebRTC track, a KVS producer) takes one frame
at a time, each with exactly the driving audio its interval covers, so it can send both in step.

Two policies for a full queue:

- ``block``: the producer waits (optionally with a timeout). Nothing is lost; for offline use,
  where generation may run ahead of a slow consumer without harm.
- ``drop_oldest``: the oldest unsent frame is dropped to make room. Live viewers prefer a skipped
  frame to growing latency. Only its *video* is dropped: its audio is prepended to the next frame
  in the queue (or to the incoming one), so the audio a consumer receives is the complete input,
  without gaps; that frame then carries more than one frame interval of audio, and its
  ``audio_first_sample`` is earlier than its ``pts``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

from talkloop.pipeline.core.errors import BusyError, ConfigError, SessionClosedError
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk

__all__ = ["FrameQueueSink", "LiveFrame", "QueuePolicy"]

QueuePolicy = Literal["block", "drop_oldest"]


@dataclass
class LiveFrame:
    """One display frame and the audio to play with it.

    ``rgb`` is ``(H, W, 3)`` uint8, owned by this record (a copy, not a view into the segment).
    ``audio`` is float32 mono starting at sample ``audio_first_sample``: normally the frame's own
    interval ``[pts, info.frame_pts(index + 1))``, plus the audio of any frames dropped just
    before it.
    """

    index: int
    pts: int  # in audio samples (time base 1 / sample_rate)
    rgb: np.ndarray
    audio: np.ndarray
    audio_first_sample: int
    epoch: int = 0  # the audio epoch it was generated in (VideoChunk.epoch)


class FrameQueueSink:
    """A bounded per-frame queue that implements the Sink protocol on the producer side.

    Args:
        maxsize_frames: frames the queue holds at most.
        policy: ``"block"`` or ``"drop_oldest"`` (module docstring).
        put_timeout: with ``block``, how long ``write`` waits for room per frame before raising
            ``BusyError``; None waits indefinitely.

    Counters (read any time): ``frames_in`` (frames written), ``frames_out`` (frames returned by
    ``get``), ``dropped_frames``, ``max_depth`` (deepest the queue has been). At all times
    ``frames_in == frames_out + dropped_frames + depth`` (until ``abort`` discards the queue).
    """

    def __init__(
        self,
        maxsize_frames: int,
        policy: QueuePolicy = "block",
        *,
        put_timeout: float | None = None,
    ) -> None:
        if maxsize_frames < 1:
            raise ConfigError(f"FrameQueueSink maxsize_frames must be >= 1, got {maxsize_frames}")
        if policy not in ("block", "drop_oldest"):
            raise ConfigError(
                f"FrameQueueSink policy must be 'block' or 'drop_oldest', got {policy!r}"
            )
        if put_timeout is not None and put_timeout < 0:
            raise ConfigError(f"FrameQueueSink put_timeout must be >= 0, got {put_timeout}")
        self.maxsize_frames = maxsize_frames
        self.policy: QueuePolicy = policy
        self.put_timeout = put_timeout
        self.info: StreamInfo | None = None
        self.frames_in = 0
        self.frames_out = 0
        self.dropped_frames = 0
        self.max_depth = 0
        self._items: deque[LiveFrame] = deque()
        # One lock, two conditions: producers wait for room, consumers for items. Both are
        # notified on close/abort so nobody sleeps through the end of the stream.
        self._lock = threading.Lock()
        self._not_full = threading.Condition(self._lock)
        self._not_empty = threading.Condition(self._lock)
        self._closed = False

    # -- Sink protocol (producer side) -----------------------------------------------------------

    def open(self, info: StreamInfo) -> None:
        """Remember the stream's frame size, fps and sample rate."""
        with self._lock:
            if self._closed:
                raise SessionClosedError("FrameQueueSink is closed; it cannot be reopened")
            self.info = info

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        """Split a segment into frames and queue them, applying the full-queue policy.

        The audio of frame ``j`` is the part of ``audio`` inside ``[frame_pts(j),
        frame_pts(j + 1))``; audio before the first frame's interval goes to the first frame and
        audio after the last frame's interval to the last, so every written sample is delivered.

        Raises:
            BusyError: ``block`` policy and no room within ``put_timeout``.
            SessionClosedError: the queue was closed or aborted.
        """
        info = self.info
        if info is None:
            raise SessionClosedError("FrameQueueSink.write before open")
        n = len(video)
        if n == 0:
            return
        samples = np.asarray(audio.samples, dtype=np.float32).reshape(-1)
        a0 = audio.first_sample
        a_end = a0 + samples.shape[0]
        for i in range(n):
            j = video.first_index + i
            start = a0 if i == 0 else max(a0, info.frame_pts(j))
            end = a_end if i == n - 1 else min(a_end, info.frame_pts(j + 1))
            end = max(start, end)
            item = LiveFrame(
                index=j,
                pts=info.frame_pts(j),
                # Copies: a view would keep the whole segment alive until its last frame is
                # consumed or dropped (the Sink contract: do not hold the arrays given).
                rgb=np.array(video.frames[i], dtype=np.uint8, copy=True),
                audio=samples[start - a0 : end - a0].copy(),
                audio_first_sample=start,
                epoch=video.epoch,
            )
            self._put(item)

    def close(self) -> None:
        """End of stream: consumers drain what is queued, then ``get`` returns None."""
        with self._lock:
            self._closed = True
            self._not_empty.notify_all()
            self._not_full.notify_all()

    def abort(self) -> None:
        """Discard what is queued and close; a blocked producer gets SessionClosedError."""
        with self._lock:
            self._closed = True
            self._items.clear()
            self._not_empty.notify_all()
            self._not_full.notify_all()

    # -- consumer side -----------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> LiveFrame | None:
        """Next frame in display order; None once the queue is closed and drained.

        Raises:
            TimeoutError: nothing arrived within ``timeout`` seconds (the stream is still open).
        """
        with self._not_empty:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._items:
                if self._closed:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"no frame within {timeout} s")
                self._not_empty.wait(remaining)
            item = self._items.popleft()
            self.frames_out += 1
            self._not_full.notify()
            return item

    @property
    def depth(self) -> int:
        """Frames queued now."""
        with self._lock:
            return len(self._items)

    @property
    def closed(self) -> bool:
        """True after ``close`` or ``abort``."""
        return self._closed

    # -- internals ---------------------------------------------------------------------------------

    def _put(self, item: LiveFrame) -> None:
        with self._not_full:
            if self._closed:
                raise SessionClosedError("FrameQueueSink is closed; no more frames accepted")
            if self.policy == "block":
                deadline = None if self.put_timeout is None else time.monotonic() + self.put_timeout
                while len(self._items) >= self.maxsize_frames and not self._closed:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise BusyError(
                            f"FrameQueueSink full ({self.maxsize_frames} frames) for "
                            f"{self.put_timeout} s: the consumer is not keeping up"
                        )
                    self._not_full.wait(remaining)
                if self._closed:
                    # Closed while we waited (abort from the consumer side): stop the producer.
                    raise SessionClosedError("FrameQueueSink was closed while a write waited")
            else:
                while len(self._items) >= self.maxsize_frames:
                    self._drop_oldest(item)
            self._items.append(item)
            self.frames_in += 1
            self.max_depth = max(self.max_depth, len(self._items))
            self._not_empty.notify()

    def _drop_oldest(self, incoming: LiveFrame) -> None:
        # Caller holds the lock. The dropped frame's audio moves to its successor (the next
        # queued frame, or the incoming one when it was the only one) so the audio stays gapless.
        dropped = self._items.popleft()
        self.dropped_frames += 1
        nxt = self._items[0] if self._items else incoming
        nxt.audio = np.concatenate([dropped.audio, nxt.audio])
        nxt.audio_first_sample = dropped.audio_first_sample
