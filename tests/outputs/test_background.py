"""BackgroundSink: hands segments to another thread, in order, with errors brought back."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.outputs.background import BackgroundSink

from support import CollectSink

pytestmark = pytest.mark.unit
INFO = StreamInfo(64, 64, 25, 16000)


def segment(i: int) -> tuple[VideoChunk, AudioChunk]:
    return VideoChunk(np.full((2, 64, 64, 3), i, np.uint8), 2 * i), AudioChunk(
        np.zeros(1280, np.float32), 1280 * i
    )


def test_writes_arrive_in_order_on_another_thread_and_close_waits() -> None:
    threads = set()

    class Slow(CollectSink):
        def write(self, video, audio) -> None:
            threads.add(threading.get_ident())
            time.sleep(0.01)
            super().write(video, audio)

    inner = Slow()
    sink = BackgroundSink(inner, max_pending=2)
    sink.open(INFO)
    for i in range(10):
        sink.write(*segment(i))
    sink.close()
    assert inner.first_indices == [2 * i for i in range(10)]
    assert inner.closed and threading.get_ident() not in threads


def test_backpressure_bounds_the_queue() -> None:
    gate = threading.Event()

    class Blocked(CollectSink):
        def write(self, video, audio) -> None:
            gate.wait()
            super().write(video, audio)

    sink = BackgroundSink(Blocked(), max_pending=2)
    sink.open(INFO)
    done = []

    def produce() -> None:
        for i in range(6):
            sink.write(*segment(i))
            done.append(i)

    t = threading.Thread(target=produce)
    t.start()
    time.sleep(0.2)
    assert len(done) <= 3  # one being written + two queued
    gate.set()
    t.join()
    sink.close()
    assert done == list(range(6))


def test_inner_error_is_raised_to_the_producer_and_inner_aborted() -> None:
    class Broken(CollectSink):
        def write(self, video, audio) -> None:
            raise OSError("disk full")

    inner = Broken()
    sink = BackgroundSink(inner)
    sink.open(INFO)
    sink.write(*segment(0))
    with pytest.raises(OSError, match="disk full"):
        for i in range(1, 50):
            sink.write(*segment(i))
            time.sleep(0.005)
    assert inner.aborted and not inner.closed


def test_abort_discards() -> None:
    inner = CollectSink()
    sink = BackgroundSink(inner)
    sink.open(INFO)
    sink.write(*segment(0))
    sink.abort()
    assert inner.aborted and not inner.closed
