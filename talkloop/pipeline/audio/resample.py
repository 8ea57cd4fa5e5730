"""Resampling: one streaming resampler (FFmpeg swresample through PyAV) for every audio path.

``StreamResampler`` turns a stream of pushes into float32 mono at one output rate. It keeps the
filter's state between pushes, so a stream cut into packets resamples without seams, and it
follows the input when its rate (or, for decoded frames, its sample format or channel layout)
changes mid-stream: what the old setup still holds is flushed out first, then a new one starts
(swresample refuses frames whose format changes under it).

``FrameConverter`` runs one ``StreamResampler`` on decoded frames off the thread that receives
them (a call's event loop): that thread only queues each frame; a worker thread converts it.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import av
import numpy as np

__all__ = ["FrameConverter", "StreamResampler", "resample"]

_EMPTY = np.zeros(0, np.float32)


class StreamResampler:
    """Streaming resampler to ``rate`` Hz, float32 mono out.

    Args:
        rate: the output rate in Hz.
    """

    def __init__(self, rate: int) -> None:
        if rate <= 0:
            raise ValueError(f"sample rate must be positive, got {rate}")
        self.rate = rate
        self.from_rate: int | None = None  # the rate of the input being resampled now
        self._swr: av.AudioResampler | None = None
        self._setup: tuple[str, str, int] | None = None

    def push(self, mono: np.ndarray, rate: int) -> np.ndarray:
        """Float mono samples at ``rate`` in, the resampled samples that are ready out.

        At the output rate the samples pass through unchanged (after whatever an earlier rate
        left in the filter).
        """
        if rate <= 0:
            raise ValueError(f"sample rate must be positive, got {rate}")
        x = np.ascontiguousarray(mono, dtype=np.float32).reshape(-1)
        head = self._switch(("flt", "mono", rate))
        if rate == self.rate or x.shape[0] == 0:
            out = x.copy()
        else:
            if self._swr is None:
                self._swr = av.AudioResampler(format="flt", layout="mono", rate=self.rate)
            frame = av.AudioFrame.from_ndarray(x[None, :], format="flt", layout="mono")
            frame.sample_rate = rate
            out = _mono(self._swr.resample(frame))
        return np.concatenate([head, out]) if head.size else out

    def push_frame(self, frame: av.AudioFrame) -> np.ndarray:
        """A decoded PyAV frame (any sample format and layout) in; channels are averaged.

        The mean of the channels never leaves ``[-1, 1]``; FFmpeg's own mono downmix sums them at
        -3 dB each, which pushes a full-scale stereo signal to +3 dB and clips it.
        """
        head = self._switch((frame.format.name, frame.layout.name, frame.sample_rate))
        if self._swr is None:
            # Keep the source layout (layout=None) and average in _mono.
            self._swr = av.AudioResampler(format="fltp", layout=None, rate=self.rate)
        frame.pts = None  # timestamps are not needed, and gaps in them make swr insert silence
        out = _mono(self._swr.resample(frame))
        return np.concatenate([head, out]) if head.size else out

    def flush(self) -> np.ndarray:
        """What the filter still holds (the end of the stream); the next push starts afresh."""
        swr, self._swr, self._setup, self.from_rate = self._swr, None, None, None
        return _mono(swr.resample(None)) if swr is not None else _EMPTY.copy()

    def _switch(self, setup: tuple[str, str, int]) -> np.ndarray:
        """Flush the filter when the input's setup changes; returns what it held."""
        if setup == self._setup:
            return _EMPTY
        tail = self.flush()
        self._setup, self.from_rate = setup, setup[2]
        return tail


class FrameConverter:
    """Decoded frames in (cheap: queued), float32 mono at ``rate`` out, converted on a worker
    thread in the order they were put.

    ``put`` never converts. ``take`` returns every frame put before it, converted, each with its
    tag; a frame the worker has not reached yet is converted by ``take``'s caller, so nothing put
    is ever late for a ``take``, and the samples are exactly those one ``StreamResampler`` gives
    for the same frames pushed one by one (it is one, used one frame at a time, in order).

    Args:
        rate: the output rate in Hz.
        name: the worker thread's name.
        max_held: converted frames kept for ``take`` at most; older ones are dropped (a caller
            that stopped taking cannot make them pile up).
    """

    def __init__(self, rate: int, name: str = "convert", max_held: int = 250) -> None:
        self.resampler = StreamResampler(rate)
        self.name = name
        self.max_held = max_held
        self.dropped = 0  # converted frames dropped by max_held
        self._todo: deque[tuple[av.AudioFrame, Any]] = deque()
        self._done: deque[tuple[np.ndarray, Any]] = deque()
        self._cond = threading.Condition()  # guards the two queues (held briefly)
        self._convert = threading.Lock()  # the resampler: one frame at a time, in order
        self._thread: threading.Thread | None = None
        self._closed = False

    def put(self, frame: av.AudioFrame, tag: Any = None) -> None:
        """Queue ``frame`` (with ``tag``, e.g. its arrival time) for conversion."""
        with self._cond:
            if self._closed:
                return
            self._todo.append((frame, tag))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def take(self) -> list[tuple[np.ndarray, Any]]:
        """Every frame put so far and not taken yet, converted: ``(samples, tag)`` in order."""
        with self._convert:  # waits for the frame the worker is converting, if any
            while self._convert_next():
                pass
            with self._cond:
                out = list(self._done)
                self._done.clear()
        return out

    def close(self) -> None:
        """Stop the worker; frames not taken are dropped."""
        with self._cond:
            self._closed = True
            self._todo.clear()
            self._done.clear()
            self._cond.notify_all()

    def _convert_next(self) -> bool:
        """(``_convert`` held) Convert the oldest queued frame; False when there is none."""
        with self._cond:
            if not self._todo:
                return False
            frame, tag = self._todo.popleft()
        samples = self.resampler.push_frame(frame)
        with self._cond:
            if not self._closed:
                self._done.append((samples, tag))
                while len(self._done) > self.max_held:
                    self._done.popleft()
                    self.dropped += 1
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._todo and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            with self._convert:
                self._convert_next()


def _mono(frames: list[av.AudioFrame]) -> np.ndarray:
    """Resampled frames (packed mono, or planar with any number of channels) as one mono array."""
    if not frames:
        return _EMPTY.copy()
    parts = []
    for f in frames:
        planes = f.to_ndarray()  # (channels, samples) planar, or (1, samples) packed mono
        parts.append(planes[0] if planes.shape[0] == 1 else planes.mean(axis=0, dtype=np.float32))
    return np.concatenate(parts).astype(np.float32, copy=False)


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Resample one whole float32 mono buffer (flushed at the end).

    For a live stream use one ``StreamResampler``: resampling it chunk by chunk with this adds
    small seams at chunk boundaries.

    Returns:
        ``(round(n * to_rate / from_rate),)`` float32 (within a sample of it).
    """
    if from_rate <= 0 or to_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {from_rate} -> {to_rate}")
    x = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
    if from_rate == to_rate or x.shape[0] == 0:
        return x.copy()
    res = StreamResampler(to_rate)
    out = res.push(x, from_rate)
    tail = res.flush()
    return np.concatenate([out, tail]) if tail.size else out
