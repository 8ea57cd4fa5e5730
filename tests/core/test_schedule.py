"""The N/I chunk timeline: execution order, display order, anchors, frame/sample coverage."""

from __future__ import annotations

import pytest

from talkloop.pipeline.core.clock import frame_at_sample, frame_start_sample, frames_for_samples
from talkloop.pipeline.core.config import ScheduleConfig
from talkloop.pipeline.core.schedule import IChunk, NChunk, Timeline

pytestmark = pytest.mark.unit

CFG = ScheduleConfig(first_len=4, n_len=10, i_len=3, ctx_len=2)


def frames_for_n_chunks(count: int, cfg: ScheduleConfig = CFG) -> int:
    return cfg.first_len + (count - 1) * cfg.n_len


def label(job: NChunk | IChunk) -> str:
    return f"{job.kind}{job.index}"


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, ["N0"]),
        (2, ["N0", "N1", "I0"]),
        (3, ["N0", "N1", "I0", "N2", "I1"]),
    ],
)
def test_execution_order_small(count: int, expected: list[str]) -> None:
    order = Timeline(CFG).execution_order(frames_for_n_chunks(count))
    assert [label(j) for j in order] == expected


def test_execution_order_50_chunks() -> None:
    order = [label(j) for j in Timeline(CFG).execution_order(frames_for_n_chunks(50))]
    expected = ["N0", "N1", "I0"] + [x for k in range(2, 50) for x in (f"N{k}", f"I{k - 1}")]
    assert order == expected
    # I(k) runs only after N(k) and N(k+1) are complete.
    for pos, name in enumerate(order):
        if name.startswith("I"):
            k = int(name[1:])
            assert order.index(f"N{k}") < pos and order.index(f"N{k + 1}") < pos


@pytest.mark.parametrize("count", [1, 2, 3, 50])
def test_display_order_covers_every_frame_once(count: int) -> None:
    total = frames_for_n_chunks(count)
    segments = Timeline(CFG).display_order(total)
    shown = [f for s in segments for f in range(s.start, s.stop)]
    assert shown == list(range(total))
    # Display order: N0 | I0 interior, N1[i:] | I1 interior, N2[i:] | ...
    names = [f"{s.source.kind}{s.source.index}" for s in segments]
    assert names == ["N0"] + [x for k in range(1, count) for x in (f"I{k - 1}", f"N{k}")]


@pytest.mark.parametrize("count", [2, 3, 50])
def test_anchor_frames_displayed_once_and_from_n_chunks(count: int) -> None:
    tl = Timeline(CFG)
    total = frames_for_n_chunks(count)
    segments = tl.display_order(total)
    source_of = {f: s.source for s in segments for f in range(s.start, s.stop)}
    for job in tl.execution_order(total):
        if isinstance(job, IChunk):
            near, far = job.anchors
            assert job.stop - job.start == CFG.i_len
            # The near anchor is N(k)'s last frame, the far anchor frame i_len of N(k+1);
            # both are shown once, from their N chunk: the I chunk's predictions are discarded.
            assert source_of[near] == tl.n_chunk(job.index, total)
            assert source_of[far] == tl.n_chunk(job.index + 1, total)
            assert far == tl.n_start(job.index + 1) + CFG.i_len


def test_short_final_chunk_shrinks_interior() -> None:
    tl = Timeline(CFG)
    for tail in range(1, CFG.n_len + 1):
        total = CFG.first_len + tail  # N1 has `tail` frames
        shown = [f for s in tl.display_order(total) for f in range(s.start, s.stop)]
        assert shown == list(range(total))
        i = tl.i_chunk(tl.n_chunk(1, total))
        if tail == 1:
            assert i is None  # nothing between the anchors
        else:
            assert i.length == min(CFG.i_len, tail - 1) and i.stop < total


@pytest.mark.parametrize("total", [1, 2, 3])
def test_audio_shorter_than_first_chunk(total: int) -> None:
    tl = Timeline(CFG)
    assert [label(j) for j in tl.execution_order(total)] == ["N0"]
    assert tl.n_chunk(0, total).length == total


@pytest.mark.parametrize(("fps", "rate"), [(25, 16000), (30, 16000), (24, 44100), (29, 22050)])
def test_every_sample_in_exactly_one_frame_interval(fps: int, rate: int) -> None:
    for n in [1, 2, rate // fps - 1, rate // fps, rate // fps + 1, rate, 3 * rate + 7]:
        frames = frames_for_samples(n, fps, rate)
        starts = [frame_start_sample(j, fps, rate) for j in range(frames + 1)]
        assert starts[0] == 0
        assert all(a < b for a, b in zip(starts, starts[1:], strict=False))
        assert starts[-2] < n <= starts[-1]  # the last frame covers the last sample, no extra frame
        for s in (0, n // 2, n - 1):
            j = frame_at_sample(s, fps, rate)
            assert starts[j] <= s < starts[j + 1]
        # one rounding rule: frames = ceil(duration * fps)
        assert frames == -(-n * fps // rate)


def test_invalid_schedule_is_rejected_with_reason() -> None:
    with pytest.raises(ValueError, match="n_len >= i_len"):
        ScheduleConfig(first_len=4, n_len=3, i_len=3)
    with pytest.raises(ValueError, match="ctx_len"):
        ScheduleConfig(first_len=2, n_len=10, ctx_len=3)
