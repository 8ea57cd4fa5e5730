"""The avatar's audio leaves a real call at full band: a 10 kHz tone fed in at 48 kHz (the
browser's Opus microphone) or at 24 kHz (agent speech) is heard back at 10 kHz. (That sound and
lips share one clock at these rates is asserted exactly, on a manual clock, in
tests/agent/test_session_fullband.py; tests/rtc/test_call.py checks the call's A/V offset.)"""

from __future__ import annotations

import pytest

from netns import run_in_netns

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("source", ["mic", "agent"])
def test_a_10khz_tone_comes_back_through_the_call(source) -> None:
    r = run_in_netns("fullband.py", "--source", source)
    assert r["errors"] == []
    assert r["audio_rate"] == 48000  # what the client's Opus decoder gives
    assert r["rms"] > 0.05  # the tone was played back...
    # ...at 10 kHz: most of the loudest second's power lies within 300 Hz of it (a 16 kHz
    # output would have filtered it out and left only codec noise)
    assert r["tone_share"] > 0.5, r["tone_share"]
    assert r["calls_left"] == 0
