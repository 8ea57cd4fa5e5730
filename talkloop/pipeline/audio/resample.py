"""Resampling: one streaming resampler (FFmpeg swresample through PyAV) for every audio path.

``StreamResampler`` turns a stream of pushes into float32 mono at one output rate. It keeps the
filter's state between pushes, so a stream cut into packets resamples without seams, and it
follows the input when its rate (or, for decoded frames, its sample format or channel layout)
changes mid-stream: what the old setup still holds is flushed out first, then a new one starts
(swresample refuses frames whose format changes under it).
"""

from __future__ import annotations

import av
import numpy as np

__all__ = ["StreamResampler", "resample"]

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
