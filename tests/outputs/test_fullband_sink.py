"""FullBandSink: the inner sink gets the full-band audio of each segment's media time, tiled
without gap or overlap, and a StreamInfo at the full-band rate."""

from __future__ import annotations

import numpy as np
import pytest

from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.outputs.fullband import FullBandSink

from support import CollectSink, tone

pytestmark = pytest.mark.unit


def test_segments_map_onto_the_full_band_timeline() -> None:
    full = np.arange(48000 * 2, dtype=np.float32)  # sample i holds i: easy to check
    inner = CollectSink()
    sink = FullBandSink(inner, 48000, lambda s, n: full[s : s + n])
    sink.open(StreamInfo(64, 64, 25, 16000))
    assert inner.info == StreamInfo(64, 64, 25, 48000)
    first, frames = 0, np.zeros((3, 64, 64, 3), np.uint8)
    for k, n in enumerate([1920, 1000, 3333, 640]):  # model-rate segments of any length
        sink.write(VideoChunk(frames, 3 * k), AudioChunk(np.zeros(n, np.float32), first))
        first += n
    sink.close()
    assert inner.closed and inner.first_indices == [0, 3, 6, 9]
    assert inner.first_samples == [0, 5760, 8760, 18759]  # floor(first * 3)
    np.testing.assert_array_equal(inner.all_audio(), full[: first * 3])  # no gap, no overlap


def test_audio_no_longer_held_falls_back_to_the_model_audio() -> None:
    inner = CollectSink()
    sink = FullBandSink(inner, 48000, lambda s, n: None)
    sink.open(StreamInfo(64, 64, 25, 16000))
    model = tone(1600, 16000, hz=440, amp=0.5)
    sink.write(VideoChunk(np.zeros((2, 64, 64, 3), np.uint8), 0), AudioChunk(model, 1600))
    out = inner.audio[0]
    assert inner.first_samples == [4800] and out.shape[0] == 4800
    ideal = tone(4800, 48000, hz=440, amp=0.5)  # the same tone at 48 kHz
    assert np.abs(out[200:-200] - ideal[200:-200]).max() < 0.01


def test_chunks_made_again_pass_only_their_new_frames() -> None:
    """A live session that started a reply early makes frames again from an earlier one: the
    inner sink (a file, a KVS stream) keeps what it has and gets only the frames after them."""
    full = np.arange(48000 * 2, dtype=np.float32)
    inner = CollectSink()
    sink = FullBandSink(inner, 48000, lambda s, n: full[s : s + n])
    sink.open(StreamInfo(64, 64, 25, 16000))

    def chunk(first: int, count: int) -> tuple[VideoChunk, AudioChunk]:
        frames = np.full((count, 64, 64, 3), first, np.uint8)
        return VideoChunk(frames, first), AudioChunk(np.zeros(640 * count, np.float32), 640 * first)

    sink.write(*chunk(0, 5))
    sink.write(*chunk(5, 5))  # frames 0-9 passed
    sink.write(*chunk(5, 3))  # made again from frame 5: all already passed
    sink.write(*chunk(8, 5))  # 8-12 again: only 10-12 are new
    assert inner.first_indices == [0, 5, 10]
    assert [f.shape[0] for f in inner.frames] == [5, 5, 3]
    assert inner.first_samples == [0, 5 * 1920, 10 * 1920]  # output samples, 48 kHz
    np.testing.assert_array_equal(inner.all_audio(), full[: 13 * 1920])  # tiled, no overlap
