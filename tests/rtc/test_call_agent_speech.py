"""An agent sends speech ahead of playback (4x real time, as a TTS agent does) into a real call
with a scripted page: the speech starts where the driving audio was when it came, or earlier
(a reply ahead of real time starts early), plays whole,
and is heard at the page for its length, all read by media timestamp (the scenario also reports
wall-clock delays and A/V offsets for a look: tests/rtc/scenarios/agent_speech.py; that speech
plays one playout delay after it is pushed is asserted on a manual clock in
tests/agent/test_session.py)."""

from __future__ import annotations

import pytest

from netns import run_in_netns
from support import contiguous_audio

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("rate", [16000, 24000])
def test_agent_speech_sent_ahead_starts_on_time_and_plays_whole(rate) -> None:
    r = run_in_netns("agent_speech.py", "--rate", str(rate), "--speech-s", "3")
    kinds = [m["type"] for _, m in r["agent_msgs"]]
    assert "playback_started" in kinds and "playback_finished" in kinds, r["agent_msgs"]
    assert kinds.index("playback_started") < kinds.index("playback_finished")
    finished = next(m for _, m in r["agent_msgs"] if m["type"] == "playback_finished")
    assert not finished["interrupted"]
    assert finished["position_s"] == pytest.approx(3.0, abs=0.01)
    assert contiguous_audio(r["audio_pts"])  # the page's audio: every block, in media order
    # The speech starts no later than the driving audio's production front of the moment its
    # first block was pushed (within the clip's quiet first 20 ms, one 20 ms block and Opus's
    # look-ahead: the suspected defect queued such speech 2-4.7 s late), and, sent ahead of
    # real time, it may start early: in idle audio already produced but not yet played, at most
    # the playout delay (480 ms for this schedule) before the front. Media time, not wall clock.
    assert -0.48 <= r["start_media_delay_s"] < 0.1, r["start_media_delay_s"]
    # heard at the page for its 3 s of media (the clip's own quiet ends aside)
    assert 2.8 < r["audible_media_s"] <= 3.05, r["audible_media_s"]


def test_an_agent_and_the_pages_microphone_take_turns() -> None:
    """The page speaks, then the agent (ahead of real time), then the page again, in one call:
    each turn is heard at the page in that order, the agent's whole, by media timestamp."""
    r = run_in_netns("agent_speech.py", "--rate", "24000", "--speech-s", "2", "--mic-turns")
    finished = next(m for _, m in r["agent_msgs"] if m["type"] == "playback_finished")
    assert not finished["interrupted"] and finished["position_s"] == pytest.approx(2.0, abs=0.01)
    assert contiguous_audio(r["audio_pts"])
    start = r["start_media_delay_s"]  # the agent's speech, from the production front
    runs = r["loud_runs"]
    before = [run for run in runs if run[1] < start]
    during = [run for run in runs if start - 0.05 <= run[0] and run[1] <= start + 2.05]
    after = [run for run in runs if run[0] > start + 2.05]
    assert before, runs  # the page's first turn came back (its own voice, before the agent's)
    # the agent's turn from its start to its end (its voice has pauses of its own)
    assert during and during[0][0] == pytest.approx(start) and during[-1][1] > start + 1.5, runs
    assert after, runs  # and the page's second turn after it
