"""The outgoing WebRTC tracks: video frames and driving audio, paced by one MediaClock."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from fractions import Fraction

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.audio.io import float_to_pcm16
from pipeline.core.records import StreamInfo
from pipeline.outputs.queue import FrameQueueSink, LiveFrame
from rtc.clock import MediaClock
from rtc.driver import PlayoutBuffer

VIDEO_CLOCK = 90000  # RTP video clock rate


class Lateness:
    """How late (s) a track handed its recent frames to the sender, against the clock.

    The sender stamps RTCP reports with the time of sending, so the receiver's lip sync sees
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
    """Video minus audio send offset at the sender (positive: video late)."""
    v, a = video.median_ms(), audio.median_ms()
    return None if v is None or a is None else round(v - a, 1)


async def _wait_started(clock: MediaClock, ended: Callable[[], bool]) -> None:
    while not clock.started:
        if ended():
            raise MediaStreamError
        await asyncio.sleep(0.005)


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


class AvatarAudioTrack(MediaStreamTrack):
    """Sends the driving audio, ``clock.delay_s`` after it was produced, with no gaps."""

    kind = "audio"

    def __init__(self, playout: PlayoutBuffer, clock: MediaClock, block: int = 320) -> None:
        super().__init__()
        self.playout, self.clock, self.block = playout, clock, block
        self.next_sample = 0
        self.lateness = Lateness()

    async def recv(self) -> av.AudioFrame:
        await _wait_started(self.clock, lambda: self.readyState != "live")
        if self.readyState != "live":
            raise MediaStreamError
        n = self.next_sample
        await _sleep_until(self.clock.due(n))
        self.lateness.add(time.monotonic() - self.clock.due(n))
        pcm = float_to_pcm16(self.playout.read(n, self.block))
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.clock.sample_rate
        frame.pts = n
        frame.time_base = Fraction(1, self.clock.sample_rate)
        self.next_sample = n + self.block
        return frame


class AvatarVideoTrack(MediaStreamTrack):
    """Sends frame ``j`` at the time of its first audio sample.

    A frame that is not ready when due is replaced by the previous one (counted in
    ``late_frames``); a frame that arrives after its time is dropped (``dropped_frames``). So
    slow generation costs video frames, never audio, and the lag cannot grow.

    Args:
        frames: the pipeline's live frame queue.
        clock: the session's playout clock.
        info: stream geometry and rates.
        stamp: optional ``(rgb, frame_index) -> rgb`` applied before sending (latency tests).
    """

    kind = "video"

    def __init__(
        self,
        frames: FrameQueueSink,
        clock: MediaClock,
        info: StreamInfo,
        idle_frame: np.ndarray,
        stamp: Callable[[np.ndarray, int], np.ndarray] | None = None,
    ) -> None:
        super().__init__()
        self.frames, self.clock, self.info, self.stamp = frames, clock, info, stamp
        self.next_frame = 0
        self.last = idle_frame
        self._pending: LiveFrame | None = None
        self.frames_sent = self.late_frames = self.dropped_frames = 0
        self.lateness = Lateness()

    def _take(self, j: int) -> LiveFrame | None:
        """The frame for index ``j`` if it is here; drops frames older than ``j``."""
        while True:
            if self._pending is None:
                try:
                    self._pending = self.frames.get(timeout=0)
                except TimeoutError:
                    return None
                if self._pending is None:  # the queue was closed
                    return None
            if self._pending.index < j:
                self._pending = None
                self.dropped_frames += 1
                continue
            if self._pending.index == j:
                frame, self._pending = self._pending, None
                return frame
            return None  # a future frame: keep it for later

    async def recv(self) -> av.VideoFrame:
        await _wait_started(self.clock, lambda: self.readyState != "live")
        if self.readyState != "live":
            raise MediaStreamError
        j = self.next_frame
        pts = self.info.frame_pts(j)
        await _sleep_until(self.clock.due(pts))
        self.lateness.add(time.monotonic() - self.clock.due(pts))
        live = self._take(j)
        if live is None:
            self.late_frames += 1
        else:
            self.last = live.rgb
        rgb = self.last if self.stamp is None else self.stamp(self.last, j)
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        frame.pts = pts * VIDEO_CLOCK // self.info.sample_rate
        frame.time_base = Fraction(1, VIDEO_CLOCK)
        self.next_frame = j + 1
        self.frames_sent += 1
        return frame


STAMP_BITS = 32


def stamp_bits(rgb: np.ndarray, value: int) -> np.ndarray:
    """Paint ``value`` (32 bits, MSB first) as two rows of 16 black/white blocks at the top."""
    out = rgb.copy()
    h, w = out.shape[:2]
    bw, bh = w // 16, max(8, min(16, h // 16))
    for bit in range(STAMP_BITS):
        row, col = divmod(bit, 16)
        on = (value >> (STAMP_BITS - 1 - bit)) & 1
        out[row * bh : (row + 1) * bh, col * bw : (col + 1) * bw] = 255 if on else 0
    return out


def read_stamp(rgb: np.ndarray) -> int:
    """Inverse of ``stamp_bits`` on a decoded (lossy) frame."""
    h, w = rgb.shape[:2]
    bw, bh = w // 16, max(8, min(16, h // 16))
    value = 0
    for bit in range(STAMP_BITS):
        row, col = divmod(bit, 16)
        my, mx = bh // 4, bw // 4  # read the block's centre: its edges blur in the codec
        block = rgb[row * bh + my : (row + 1) * bh - my, col * bw + mx : (col + 1) * bw - mx]
        value = (value << 1) | int(block.mean() > 127)
    return value
