"""AudioReader: a file's audio, decoded as it is asked for, in order, at one rate.

``load_audio`` decodes a whole file at the model's rate; a render also needs the same file at full
band for its mp4 (``talkloop/pipeline/outputs/fullband.py``), which at 48 kHz is three times the size. This
reader decodes only as far as the ranges it is asked for and drops what was read, so it holds a
few decoded frames, not the file.
"""

from __future__ import annotations

import os

import av
import numpy as np

from talkloop.pipeline.audio.resample import StreamResampler

__all__ = ["AudioReader"]


class AudioReader:
    """Sequential reads of a file's first audio stream, float32 mono at ``sample_rate``.

    Args:
        path: an audio or video file that ``load_audio`` has already read (errors there name
            the problem; here they would surface mid-render).
        sample_rate: the rate to deliver, in Hz.
    """

    def __init__(self, path: str | os.PathLike[str], sample_rate: int) -> None:
        self.rate = sample_rate
        self._container = av.open(str(path), mode="r")
        stream = self._container.streams.audio[0]
        self._frames = self._container.decode(stream)
        self._resampler: StreamResampler | None = StreamResampler(sample_rate)
        self._buf = np.zeros(0, np.float32)
        self._base = 0  # the sample index of _buf[0]

    def read(self, start: int, count: int) -> np.ndarray:
        """Samples ``[start, start + count)``; zeros past the end of the file.

        Raises:
            ValueError: ``start`` is before what an earlier read already went past.
        """
        if start < self._base:
            raise ValueError(
                f"AudioReader reads in order: sample {start} was asked for after {self._base}"
            )
        while self._base + self._buf.shape[0] < start + count and self._resampler is not None:
            self._decode_more()
        lo = start - self._base
        out = np.zeros(count, np.float32)
        got = self._buf[lo : lo + count]
        out[: got.shape[0]] = got
        self._buf = self._buf[lo + count :].copy()  # what was read is never read again
        self._base = start + count
        return np.clip(out, -1.0, 1.0)  # lossy decoders overshoot full scale slightly

    def close(self) -> None:
        self._resampler = None
        self._container.close()

    def _decode_more(self) -> None:
        assert self._resampler is not None
        frame = next(self._frames, None)
        if frame is None:
            more = self._resampler.flush()
            self._resampler = None
            self._container.close()
        else:
            more = self._resampler.push_frame(frame)
        if more.size:
            self._buf = np.concatenate([self._buf, more])
