"""AudioDriver: microphone backlog is worked off in quiet stretches, never in speech."""

from __future__ import annotations

import numpy as np
import pytest

from talkloop.agent.clock import ManualClock, MediaClock
from talkloop.agent.driver import AudioDriver

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
