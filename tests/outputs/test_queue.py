"""FrameQueueSink: per-frame split, block and drop_oldest policies, counters, gapless audio."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from talkloop.pipeline.core.errors import BusyError, ConfigError, SessionClosedError
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.outputs.queue import FrameQueueSink, LiveFrame
from talkloop.pipeline.outputs.sink import Sink

pytestmark = pytest.mark.unit

INFO = StreamInfo(width=8, height=6, fps=24, sample_rate=16000)  # 666/667-sample frames


def segment(first: int, count: int, audio: np.ndarray) -> tuple[VideoChunk, AudioChunk]:
    """Frames whose pixels hold their index, and the slice of ``audio`` they cover."""
    frames = np.empty((count, INFO.height, INFO.width, 3), np.uint8)
    for i in range(count):
        frames[i] = (first + i) % 256
    a0, a1 = INFO.frame_pts(first), INFO.frame_pts(first + count)
    return VideoChunk(frames, first), AudioChunk(audio[a0:a1], a0)


def ramp(num_frames: int) -> np.ndarray:
    """Audio whose value is its sample index (exactly representable), to check placement."""
    return np.arange(INFO.frame_pts(num_frames), dtype=np.float32)


def drain(q: FrameQueueSink) -> list[LiveFrame]:
    out = []
    while (item := q.get(timeout=5)) is not None:
        out.append(item)
    return out


def test_write_splits_segments_into_frames_with_their_audio():
    q = FrameQueueSink(100, "block")
    assert isinstance(q, Sink)
    q.open(INFO)
    audio = ramp(10)
    q.write(*segment(0, 4, audio))
    q.write(*segment(4, 6, audio))
    q.close()
    items = drain(q)
    assert [f.index for f in items] == list(range(10))
    for f in items:
        assert f.pts == INFO.frame_pts(f.index) == f.audio_first_sample
        assert f.rgb.shape == (6, 8, 3) and f.rgb.dtype == np.uint8 and f.rgb[0, 0, 0] == f.index
        assert f.audio.dtype == np.float32
        expected = np.arange(INFO.frame_pts(f.index), INFO.frame_pts(f.index + 1))
        np.testing.assert_array_equal(f.audio, expected)
    assert q.get() is None  # closed and drained, again and again
    assert (q.frames_in, q.frames_out, q.dropped_frames, q.max_depth) == (10, 10, 0, 10)


def test_frames_are_copies_not_views_of_the_segment():
    q = FrameQueueSink(10)
    q.open(INFO)
    video, audio = segment(0, 3, ramp(3))
    q.write(video, audio)
    video.frames[:] = 255
    audio.samples[:] = -1
    item = q.get()
    assert item is not None and item.rgb.base is None and item.rgb[0, 0, 0] == 0
    assert item.audio[0] == 0


def test_trailing_audio_goes_to_the_last_frame():
    q = FrameQueueSink(10)
    q.open(INFO)
    audio = np.ones(INFO.frame_pts(2) + 100, np.float32)  # 100 samples past frame 1's interval
    q.write(VideoChunk(np.zeros((2, 6, 8, 3), np.uint8), 0), AudioChunk(audio, 0))
    q.close()
    items = drain(q)
    assert items[1].audio.shape[0] == INFO.frame_pts(2) - INFO.frame_pts(1) + 100
    assert sum(f.audio.shape[0] for f in items) == audio.shape[0]


def test_drop_oldest_keeps_newest_frames_and_moves_audio_forward():
    q = FrameQueueSink(3, "drop_oldest")
    q.open(INFO)
    audio = ramp(10)
    for j in range(10):
        q.write(*segment(j, 1, audio))  # nobody consumes: 7 frames are dropped
    q.close()
    items = drain(q)
    assert [f.index for f in items] == [7, 8, 9]
    assert (q.frames_in, q.frames_out, q.dropped_frames, q.max_depth) == (10, 3, 7, 3)
    # Frame 7 carries the audio of dropped frames 0..6 ahead of its own: no gap, no reorder.
    assert items[0].audio_first_sample == 0 and items[0].pts == INFO.frame_pts(7)
    np.testing.assert_array_equal(np.concatenate([f.audio for f in items]), audio)


def test_drop_oldest_with_room_for_one_frame():
    q = FrameQueueSink(1, "drop_oldest")
    q.open(INFO)
    audio = ramp(5)
    q.write(*segment(0, 5, audio))
    q.close()
    items = drain(q)
    assert [f.index for f in items] == [4] and q.dropped_frames == 4
    np.testing.assert_array_equal(items[0].audio, audio)


def test_block_waits_for_the_consumer_and_loses_nothing():
    q = FrameQueueSink(2, "block")
    q.open(INFO)
    audio = ramp(50)
    got: list[LiveFrame] = []
    consumer = threading.Thread(target=lambda: got.extend(drain(q)))
    consumer.start()
    for k in range(0, 50, 5):
        q.write(*segment(k, 5, audio))  # 5 frames into a queue of 2: must wait for get()
    q.close()
    consumer.join(timeout=10)
    assert not consumer.is_alive()
    assert [f.index for f in got] == list(range(50))
    assert q.dropped_frames == 0 and q.max_depth <= 2 and q.frames_out == 50
    np.testing.assert_array_equal(np.concatenate([f.audio for f in got]), audio)


def test_block_times_out_with_busy_error():
    q = FrameQueueSink(2, "block", put_timeout=0.05)
    q.open(INFO)
    audio = ramp(3)
    with pytest.raises(BusyError, match="not keeping up"):
        q.write(*segment(0, 3, audio))
    assert q.frames_in == 2 and q.depth == 2


def test_abort_releases_a_blocked_producer_and_discards_frames():
    q = FrameQueueSink(1, "block")
    q.open(INFO)
    audio = ramp(3)
    q.write(*segment(0, 1, audio))
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            q.write(*segment(1, 2, audio))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    producer.join(timeout=0.2)
    assert producer.is_alive()  # blocked on the full queue
    q.abort()
    producer.join(timeout=5)
    assert not producer.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], SessionClosedError)
    assert q.get(timeout=1) is None and q.depth == 0


def test_get_times_out_while_open_and_returns_none_after_close():
    q = FrameQueueSink(4)
    q.open(INFO)
    with pytest.raises(TimeoutError):
        q.get(timeout=0.01)
    waiter_result: list[object] = []
    waiter = threading.Thread(target=lambda: waiter_result.append(q.get()))
    waiter.start()
    q.close()
    waiter.join(timeout=5)
    assert waiter_result == [None]
    with pytest.raises(SessionClosedError):
        q.write(*segment(0, 1, ramp(1)))


def test_threads_under_drops_deliver_all_audio_in_order():
    q = FrameQueueSink(4, "drop_oldest")
    q.open(INFO)
    audio = np.random.default_rng(0).standard_normal(INFO.frame_pts(600)).astype(np.float32)
    got: list[LiveFrame] = []
    go = threading.Event()

    def consume() -> None:
        go.wait(10)  # a stalled consumer (a slow network) for the first half: forces drops
        while (item := q.get(timeout=10)) is not None:
            got.append(item)

    consumer = threading.Thread(target=consume)
    consumer.start()
    for k in range(0, 600, 3):
        if k == 300:
            go.set()
        q.write(*segment(k, 3, audio))
    q.close()
    consumer.join(timeout=20)
    assert not consumer.is_alive()
    assert q.frames_in == 600 == q.frames_out + q.dropped_frames
    assert q.dropped_frames >= 300 - 4
    assert len(got) == q.frames_out and q.max_depth <= 4
    indices = [f.index for f in got]
    assert indices == sorted(indices) and indices[-1] == 599
    # The audio is the whole input, in order, even though frames were dropped.
    np.testing.assert_array_equal(np.concatenate([f.audio for f in got]), audio)
    for a, b in zip(got, got[1:], strict=False):
        assert b.audio_first_sample == a.audio_first_sample + a.audio.shape[0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"maxsize_frames": 0},
        {"maxsize_frames": 2, "policy": "drop_newest"},
        {"maxsize_frames": 2, "put_timeout": -1},
    ],
)
def test_bad_settings(kwargs):
    with pytest.raises(ConfigError):
        FrameQueueSink(**kwargs)
