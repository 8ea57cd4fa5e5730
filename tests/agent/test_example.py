"""examples/agent.py drives a live session that an aiortc viewer watches over WebRTC."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rtc"))
from netns import run_in_netns  # noqa: E402
from support import on_frame_grid  # noqa: E402

pytestmark = pytest.mark.e2e


def test_example_agent_speaks_and_interrupts_through_a_live_call() -> None:
    script = Path(__file__).parent / "scenarios" / "example_call.py"
    r = run_in_netns(str(script))  # absolute: netns joins it onto its own scenario folder
    assert r["agent_rc"] == 0, r["agent_stderr"]
    assert r["errors"] == [] and r["sessions_left"] == 0
    kinds = [(e["type"], e.get("segment_id")) for e in r["events"]]
    assert kinds == [
        ("playback_started", 0),
        ("playback_finished", 0),
        ("playback_started", 1),
        ("playback_finished", 1),
    ]
    first, second = r["events"][1], r["events"][3]
    # the first line played to the end: its full length, to the millisecond
    assert not first["interrupted"] and abs(first["position_ms"] - r["durations_ms"][0]) <= 2
    # the second was cut after it started: the position is what had played, short of its
    # length (how far in is this machine's speed: the agent cuts 0.8 s of wall clock after
    # playback_started)
    assert second["interrupted"]
    assert 0 < second["position_ms"] < r["durations_ms"][1]
    # the viewer heard the speech through WebRTC and saw video, each frame a later slot of the
    # frame grid (which each line, starting early, may shift once)
    assert max(r["audio_rms"]) > 0.05
    assert r["video_frames"] > 0 and on_frame_grid(r["video_pts"], jumps=2)
