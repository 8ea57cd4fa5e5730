"""The sink contract: where published frames and their driving audio go."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk


@runtime_checkable
class Sink(Protocol):
    """A consumer of published media, in display order.

    The pipeline calls ``open`` once, then ``write`` for each published segment (frames plus the
    audio samples those frames cover), then exactly one of ``close`` (the stream ended or was
    interrupted: finalise what was produced) or ``abort`` (an error: leave nothing half-written).
    ``write`` must not hold on to the arrays it is given beyond what it needs (rolling memory).
    """

    def open(self, info: StreamInfo) -> None: ...

    def write(self, video: VideoChunk, audio: AudioChunk) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...
