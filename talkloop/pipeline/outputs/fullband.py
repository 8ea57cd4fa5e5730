"""FullBandSink: a sink that gets the full-band audio of the frames it is given.

The pipeline publishes each segment's frames with the driving audio it generated them from, at
the model's rate (16 kHz: nothing above 8 kHz). What a listener should hear is the audio before
it was resampled for the model (a live session plays it out at 48 kHz). This wrapper hands the
inner sink that audio in place of the model's: the same stretch of media time, read from
``read`` at ``rate``, and a ``StreamInfo`` that says ``rate``. Video timestamps follow the info's
rate, so the inner sink keeps sound and picture on one clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from talkloop.pipeline.audio.resample import resample
from talkloop.pipeline.core.clock import frame_start_sample
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.outputs.sink import Sink


class FullBandSink:
    """Passes ``inner`` each segment with its audio taken from ``read`` at ``rate``.

    Args:
        inner: the sink to feed (an Mp4Sink, a KvsSink, ...).
        rate: the rate of the audio ``read`` returns.
        read: ``(first_sample, count) -> (count,) float32``, samples at ``rate`` counted from
            the stream's start, or None when they are no longer held (the segment's own audio
            is then resampled instead); called from the thread that publishes (the generation
            thread).
        release: called once the inner sink is closed or aborted (e.g. closes the file ``read``
            decodes).
    """

    def __init__(
        self,
        inner: Sink,
        rate: int,
        read: Callable[[int, int], np.ndarray | None],
        release: Callable[[], None] | None = None,
    ) -> None:
        self.inner, self.rate, self.read, self.release = inner, rate, read, release
        self._model_rate = self._fps = 0
        self._next_frame = 0  # the first frame the inner sink has not had

    def open(self, info: StreamInfo) -> None:
        self._model_rate, self._fps = info.sample_rate, info.fps
        self.inner.open(replace(info, sample_rate=self.rate))

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        # A live session that starts a reply early makes chunks again from an earlier frame:
        # what the inner sink already has stays (a file or stream cannot take it back), only
        # the frames after it pass.
        skip = self._next_frame - video.first_index
        if skip >= len(video):
            return
        if skip > 0:
            cut = frame_start_sample(video.first_index + skip, self._fps, self._model_rate)
            audio = AudioChunk(audio.samples[cut - audio.first_sample :], cut)
            video = VideoChunk(video.frames[skip:], video.first_index + skip, video.epoch)
        self._next_frame = video.first_index + len(video)
        if len(audio):
            # Sample k at the model rate is sample k * rate / model_rate here; floors of the
            # segment's two ends, so consecutive segments tile the output without gap or overlap.
            start = audio.first_sample * self.rate // self._model_rate
            end = (audio.first_sample + len(audio)) * self.rate // self._model_rate
            full = self.read(start, end - start)
            if full is None:  # published long after it played: the model's audio, resampled
                full = resample(audio.samples, self._model_rate, self.rate)
                full = np.pad(full, (0, max(0, end - start - full.shape[0])))[: end - start]
            audio = AudioChunk(full, start)
        self.inner.write(video, audio)

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self._release()

    def abort(self) -> None:
        try:
            self.inner.abort()
        finally:
            self._release()

    def _release(self) -> None:
        release, self.release = self.release, None
        if release is not None:
            release()
