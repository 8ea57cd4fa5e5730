"""BackgroundSink: runs another sink's work (encoding, muxing, network) on its own thread.

Generation hands a segment over and goes on with the next chunk while the segment is encoded;
a bounded hand-over queue applies backpressure, so a slow sink slows generation down instead of
letting segments pile up in memory.
"""

from __future__ import annotations

import queue
import threading

from talkloop.pipeline.core.errors import SessionClosedError
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.outputs.sink import Sink

_STOP = object()


class BackgroundSink:
    """Wraps ``inner`` so that ``write`` returns as soon as the segment is queued.

    Args:
        inner: the sink that does the work.
        max_pending: segments queued at most; ``write`` blocks while the queue is full.

    An exception raised by ``inner`` on the worker thread is re-raised by the next ``write`` or
    by ``close``; the inner sink is then aborted.
    """

    def __init__(self, inner: Sink, max_pending: int = 2) -> None:
        self.inner = inner
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def open(self, info: StreamInfo) -> None:
        self.inner.open(info)
        self._thread = threading.Thread(
            target=self._work, name=f"sink-{type(self.inner).__name__}", daemon=True
        )
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None:
                continue  # drain: the producer learns of the error on its next call
            try:
                self.inner.write(*item)
            except BaseException as err:  # handed to the producer thread
                self._error = err

    def _raise_pending(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            self._stop()
            self.inner.abort()
            raise err

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        if self._thread is None:
            raise SessionClosedError("BackgroundSink is not open")
        self._raise_pending()
        self._queue.put((video, audio))

    def _stop(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        """Wait for queued segments, then close the inner sink."""
        self._stop()
        if self._error is not None:
            self._raise_pending()
        self.inner.close()

    def abort(self) -> None:
        self._error = self._error or SessionClosedError("aborted")
        self._stop()
        self._error = None
        self.inner.abort()
