"""AudioDriver: microphone backlog is worked off in quiet stretches, never in speech; a skip of the
media clock leaves production short until speech or idle audio makes it up."""

from __future__ import annotations

import numpy as np
import pytest

from talkloop.agent.clock import ManualClock, MediaClock
from talkloop.agent.driver import AudioDriver, PlayoutBuffer

from support import tone

pytestmark = pytest.mark.unit

RATE, BLOCK = 16000, 320


def make_driver() -> tuple[AudioDriver, list[np.ndarray], ManualClock]:
    pushed: list[np.ndarray] = []
    clock = ManualClock()
    driver = AudioDriver(pushed.append, MediaClock(RATE, 0.4, clock), RATE, block=BLOCK)
    return driver, pushed, clock


def test_quiet_backlog_is_dropped_so_speech_after_it_plays_at_once() -> None:
    driver, pushed, clock = make_driver()
    for _ in range(6):  # 120 ms of near-silence queued ahead of the speech
        driver.add_mic(np.full(BLOCK, 1e-4, np.float32), arrived_at=0.0)
    speech = tone(2 * BLOCK, RATE, hz=220, amp=0.2)
    driver.add_mic(speech[:BLOCK], arrived_at=0.0)
    driver.add_mic(speech[BLOCK:], arrived_at=0.0)
    driver.produce_due(clock.now())
    assert len(pushed) == 1
    np.testing.assert_array_equal(pushed[0], speech[:BLOCK])  # the speech, not the silence
    assert driver.mic_trimmed_samples == 6 * BLOCK
    assert driver.mic_backlog_samples == BLOCK  # one block waits for the next tick


def test_speech_backlog_is_never_trimmed() -> None:
    driver, pushed, clock = make_driver()
    speech = tone(5 * BLOCK, RATE, hz=220, amp=0.2)
    for k in range(5):
        driver.add_mic(speech[k * BLOCK : (k + 1) * BLOCK], arrived_at=0.0)
    for k in range(5):
        clock.advance(BLOCK / RATE if k else 0.0)
        driver.produce_due(clock.now())
    np.testing.assert_array_equal(np.concatenate(pushed), speech)  # every sample, in order
    assert driver.mic_trimmed_samples == 0


def test_a_skip_plays_sooner_and_production_makes_up_the_shortfall() -> None:
    driver, pushed, clock = make_driver()
    driver.produce_due(clock.now())
    clock.advance(0.1)
    driver.produce_due(clock.now())
    made = driver.samples
    due = driver.clock.due(made)
    with pytest.raises(ValueError, match="whole number of blocks"):
        driver.skip(BLOCK // 2)
    with pytest.raises(ValueError, match="only jumps ahead"):
        driver.clock.skip(-BLOCK)
    driver.skip(4 * BLOCK)
    assert driver.clock.due(made) == pytest.approx(due - 4 * BLOCK / RATE)
    assert driver.clock.sample_now() == pytest.approx((0.1 - 0.4) * RATE + 4 * BLOCK, abs=1)
    # Nothing queued: idle audio fills the shortfall at the next tick.
    driver.produce_due(clock.now())
    assert driver.shortfall == 0 and driver.samples == made + 4 * BLOCK

    # Speech queued but still open and short of a block: production waits for it, short.
    driver.skip(2 * BLOCK)
    out_block = driver.out_block
    driver.push_speech(np.zeros(out_block // 2, np.float32) + 0.1)
    before = driver.samples
    driver.produce_due(clock.now())
    assert driver.samples == before and driver.shortfall == 2 * BLOCK
    driver.push_speech(np.zeros(3 * out_block, np.float32) + 0.1)
    driver.produce_due(clock.now())  # speech that is here goes at once
    assert driver.shortfall == 0 and driver.samples == before + 2 * BLOCK


def test_a_reply_shorter_than_the_idle_span_forgets_the_idle_blocks_past_it() -> None:
    """``rewrite`` from a sample with less speech queued than was produced since: the reply's
    whole blocks take the idle blocks' place (``keep`` samples stay queued), production goes back
    to where they end, and the reply's audio still to come fills the span at once."""
    driver, pushed, clock = make_driver()
    for _ in range(10):  # 200 ms of idle audio produced
        driver.produce_due(clock.now())
        clock.advance(BLOCK / RATE)
    start, produced = 2 * BLOCK, driver.samples
    reply = tone(9 * BLOCK, RATE, hz=220, amp=0.2)  # 180 ms: short of the span + what stays
    driver.push_speech(reply[: 5 * BLOCK + BLOCK // 2])
    driver.hold = True  # the avatar holds a reply it may start early
    out = driver.rewrite(start, keep=BLOCK)
    np.testing.assert_array_equal(out, reply[: 4 * BLOCK])  # whole blocks; a block+ stays queued
    assert driver.samples == start + 4 * BLOCK
    assert driver.shortfall == produced - driver.samples  # the idle blocks past it: forgotten
    np.testing.assert_array_equal(driver.playout.read(start, 4 * BLOCK), reply[: 4 * BLOCK])
    assert driver.playout.end == driver.samples  # the next block is written where it ended
    assert driver.segment_of(start) == driver.segment_of(start + 4 * BLOCK - 1) == 0
    driver.hold = False
    driver.push_speech(reply[5 * BLOCK + BLOCK // 2 :], source="")
    driver.end_segment()
    driver.produce_due(clock.now())  # what arrived goes at once, up to the clock
    np.testing.assert_array_equal(
        driver.playout.read(start, 9 * BLOCK), reply
    )  # the reply, whole, with no idle block inside it
    assert driver.samples >= start + 9 * BLOCK and driver.shortfall < produced - start - 4 * BLOCK


def test_playout_buffer_holds_the_last_capacity_samples_across_its_wrap() -> None:
    """Every operation against a plain record of all samples, with runs that cross the ring's
    end, runs longer than the ring, and reads of samples no longer or not yet held (a
    truncation forgets the ``capacity`` samples before the forgotten ones: their slots)."""
    capacity = 37
    buf = PlayoutBuffer(capacity)
    rng = np.random.default_rng(3)
    truth = np.zeros(0, np.float32)
    low = 0  # a truncation forgets the samples whose slots the forgotten ones took

    def held(start: int, count: int) -> np.ndarray:
        out = np.zeros(count, np.float32)
        lo, hi = max(start, low, len(truth) - capacity), min(start + count, len(truth))
        if hi > lo:
            out[lo - start : hi - start] = truth[lo:hi]
        return out

    for step in range(400):
        op = step % 5
        if op in (0, 1):  # append a run, now and then longer than the ring
            n = int(rng.integers(0, 3 * capacity if step % 45 == 0 else 20))
            run = rng.standard_normal(n).astype(np.float32)
            buf.append(run)
            truth = np.concatenate([truth, run])
        elif op == 2 and len(truth) > buf.held_from:  # overwrite a held run
            start = int(rng.integers(buf.held_from, len(truth)))
            run = rng.standard_normal(int(rng.integers(0, len(truth) - start + 1)))
            buf.write(start, run.astype(np.float32))
            truth[start : start + len(run)] = run
        elif op == 3 and step % 20 == 3:  # forget a tail, or silence it
            cut = int(rng.integers(buf.held_from, len(truth) + 1))
            if step % 40 == 3:
                buf.truncate(cut)
                low = max(low, len(truth) - capacity)
                truth = truth[:cut]
            else:
                buf.silence_from(cut)
                truth[cut:] = 0.0
        start = int(rng.integers(max(len(truth) - 2 * capacity, 0), len(truth) + 10))
        count = int(rng.integers(0, 2 * capacity))
        np.testing.assert_array_equal(buf.read(start, count), held(start, count))
        assert (buf.end, buf.held_from) == (len(truth), max(low, len(truth) - capacity))
    with pytest.raises(ValueError, match="not all held"):
        buf.write(buf.held_from - 1, np.zeros(2, np.float32))
