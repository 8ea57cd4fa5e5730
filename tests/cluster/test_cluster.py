"""Calls and batch renders on a local multi-node Ray cluster (tests/cluster/scenarios/
cluster_run.py, in a private network namespace): a head without call slots and two worker nodes
of one slot and one CPU each. One cluster serves every test here (it takes ~30 s to start)."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest

from cluster_netns import run_cluster_scenario
from support import contiguous_audio, on_frame_grid

pytestmark = pytest.mark.e2e

CALL_SECONDS = 12.0


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("cluster")
    result = run_cluster_scenario(
        "cluster_run.py", "--folder", str(folder), "--seconds", str(CALL_SECONDS), timeout=560
    )
    result["folder"] = str(folder)
    (folder / "result.json").write_text(json.dumps(result))  # for a look after a failure
    return result


@pytest.fixture(scope="module")
def calls(run) -> dict:
    assert "calls_error" not in run, run.get("calls_error")
    return run["calls"]


def frames_between(page: dict, start: float, end: float) -> int:
    """How many video frames the page received between two events of the scenario (ordering
    only: no rate is judged, a loaded CI machine delays frames)."""
    t = np.array(page["video"])
    return int(((t > start) & (t < end)).sum())


def errors(log: dict) -> list[tuple[float, dict]]:
    return [(t, m) for t, m in log["msgs"] if m["type"] == "error"]


def test_two_calls_land_on_two_nodes_on_the_frame_grid_and_a_third_is_busy(calls) -> None:
    assert calls["slots_total"] == 2
    assert calls["nodes"]["a"] != calls["nodes"]["b"]
    for page in (calls["a"], calls["b"]):
        assert page["session"]["type"] == "session"
        assert not [m for _, m in errors(page) if m["code"] != "worker_lost"]
        # Both calls stream: frames kept arriving until the kill, each a later slot of the
        # 25 fps grid (the second call's agent may shift it once, starting its line early),
        # and audio never skipped a block (judged by media timestamps: the rate at which a
        # loaded machine delivers them is not this test's business).
        assert frames_between(page, calls["up_at"], calls["kill_at"]) > 0
        jumps = 1 if page is calls["b"] else 0
        assert on_frame_grid(page["video_pts"], jumps=jumps) and contiguous_audio(page["audio_pts"])
    (third,) = calls["third"]  # refused at once: one message, no session
    assert third[1]["type"] == "error" and third[1]["code"] == "busy"
    assert calls["calls_left"] == 0  # the front released every call's actor


def test_killing_a_node_ends_only_its_call_with_worker_lost(calls) -> None:
    a, b = calls["a"], calls["b"]
    kill = calls["kill_at"]
    lost = [(t, m) for t, m in errors(a) if m["code"] == "worker_lost"]
    assert lost, a["msgs"][-3:]
    # After the kill and before the pages hang up (the order of events; how soon after the
    # kill, POLL_S + LOST_AFTER_S = 5 s by design, is a wall-clock figure not judged here)
    assert kill < lost[0][0] < calls["hangup_at"]
    assert a["ended_by"] == "server"
    agent_lost = [t for t, m in calls["agent_a"]["msgs"] if m.get("code") == "worker_lost"]
    assert agent_lost and kill < agent_lost[0] < calls["hangup_at"]
    # the other call goes on, on the frame grid, until its page hangs up
    assert not errors(b), errors(b)
    assert b["ended_by"] == "page"
    assert frames_between(b, kill, calls["hangup_at"]) > 0
    assert on_frame_grid(b["video_pts"], jumps=1) and contiguous_audio(b["audio_pts"])


def test_an_agent_on_the_second_node_speaks_lip_synced(calls) -> None:
    assert calls["nodes"]["b"] != calls["nodes"]["a"]
    agent = calls["agent_b"]
    kinds = [m["type"] for _, m in agent["msgs"]]
    assert kinds[0] == "agent"
    assert "playback_started" in kinds and "playback_finished" in kinds
    page = calls["b"]  # its own microphone is silent: any speech it hears is the agent's
    t = np.array(page["audio"])
    rms = np.array(page["audio_rms"])
    assert np.median(rms[t < agent["speech_at"]]) < 0.01
    assert rms[t > agent["speech_at"]].max() > 0.05
    # The worker reports its sender's A/V offset while the speech plays (measured: its size is
    # this machine's scheduling; that audio and video leave on one clock is asserted exactly
    # on a manual clock in tests/agent/test_session.py).
    started = next(t for t, m in agent["msgs"] if m["type"] == "playback_started")
    finished = next(t for t, m in agent["msgs"] if m["type"] == "playback_finished")
    assert started < finished
    stats = [m for t, m in page["msgs"] if m["type"] == "stats" and started <= t <= finished + 1]
    assert [s["av_offset_ms"] for s in stats if s.get("av_offset_ms") is not None]


def test_a_batch_across_two_nodes_reports_the_bad_row_and_resumes(run) -> None:
    first, second = run["batch"]["runs"]
    s = first["summary"]
    assert first["rc"] == 1, first["stderr"]  # a row failed
    assert (s["ok"], s["failed"], s["skipped"]) == (5, 1, 0)
    assert first["mp4s"] == [f"clip{i}.mp4" for i in range(5)]
    (bad,) = [r for r in s["rows"] if r["status"] == "failed"]
    assert bad["row"] == 3 and bad["audio"].endswith("broken.wav")
    assert "not a readable audio" in bad["error"]
    assert "row 3 (broken.wav) failed" in first["stderr"]
    assert len(s["nodes"]) == 2  # rows ran on both worker nodes
    # Rendered rows took time; the bad row may fail within the rounding (a millisecond).
    assert all(r["seconds"] > 0 for r in s["rows"] if r["status"] == "ok")
    assert all(r["seconds"] >= 0 for r in s["rows"])
    out = Path(run["folder"]) / "out"
    for name in first["mp4s"]:  # finished files: both streams, the clip's length
        with av.open(str(out / name)) as mp4:
            assert {s.type for s in mp4.streams} == {"video", "audio"}
            assert mp4.duration / av.time_base > 1.5
    # the rerun skips the five finished mp4s and tries the bad row again
    s2 = second["summary"]
    assert (s2["ok"], s2["failed"], s2["skipped"]) == (0, 1, 5)
    assert [r["status"] for r in s2["rows"]] == ["skipped"] * 2 + ["failed"] + ["skipped"] * 3
    assert second["mp4s"] == first["mp4s"]


def test_a_separate_serve_process_places_calls_on_talkloop_worker_nodes() -> None:
    """docs/scaling.md by hand: `talkloop worker --head` (no slots), `talkloop worker --address`
    (one slot, on another address) and `talkloop serve --cluster HOST:PORT` as its own process;
    a page's call runs on the worker node and the front stops cleanly (status 0, no traceback)."""
    r = run_cluster_scenario("by_hand.py", "--seconds", "8", timeout=300)
    assert r["nodes"] == {"127.0.0.1": 0, "127.0.0.2": 1}  # only the worker can take the call
    call = r["call"]
    assert r["session"].get("type") == "session" and not call["errors"], (call, r["front_output"])
    assert call["video_frames"] > 0 and on_frame_grid(call["video_pts"]), call
    assert call["audio_frames"] > 0
    assert "Traceback" not in r["front_output"] and r["front_rc"] == 0, r["front_output"]
