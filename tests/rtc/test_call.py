"""Real WebRTC calls (aiortc client <-> talkloop server) in a private network namespace."""

from __future__ import annotations

import numpy as np
import pytest

from netns import run_in_netns

pytestmark = pytest.mark.e2e


def test_call_streams_paced_video_and_aligned_audio() -> None:
    r = run_in_netns("call.py", "--seconds", "8")
    assert r["errors"] == []
    assert r["codec"] == "H264"  # preferred over VP8
    assert r["video_frames"] >= 24 * 6
    assert r["fps"] >= 24
    # audio never stops: ~50 frames of 20 ms per second
    assert r["audio_frames"] >= 45 * 6
    # the avatar's audio is the driving audio: speech comes back (not only silence)
    rms = np.array(r["audio_rms"])
    assert rms.max() > 0.05 and np.median(rms[:10]) < 0.01
    # Audio and video leave on one clock: the sender's offset (what RTCP reports carry to the
    # receiver's lip sync) is small, and stays put.
    sent = [s["av_offset_ms"] for s in r["stats"] if s.get("av_offset_ms") is not None]
    assert sent and max(abs(x) for x in sent) <= 40
    # At the aiortc client the offset includes its receive buffers (audio waits for 4 packets,
    # video for one frame), a constant: it must not drift.
    off = np.array(r["av_offsets_ms"][25:])
    assert abs(np.median(off)) <= 120
    half = len(off) // 2
    assert abs(np.median(off[half:]) - np.median(off[:half])) <= 20
    # every frame carries the arrival time of its audio: glass to glass is measured
    g2g = np.array(r["glass_to_glass_ms"][25:])
    assert 0 < np.median(g2g) < 2000
    assert r["sessions_left"] == 0


def test_twenty_calls_free_everything_they_held() -> None:
    r = run_in_netns("cycles.py", "--cycles", "20")
    assert r["sessions_left"] == 0
    assert r["tracked"] == 21 and r["alive_calls"] == 0  # every Call was collected
    assert r["threads"] == r["base_threads"]  # no session thread survives (pool workers aside)
    rss = np.array(r["rss_mb"])
    # memory returns near the baseline after the first calls' allocator step (seen 30-71 MB on
    # this 2-core VM); the leak check is the next line
    assert rss[-1] - r["base_rss_mb"] < 100
    # no steady growth: the last calls sit where calls 5-10 sat (the allocator steps, then holds)
    assert np.median(rss[-5:]) - np.median(rss[5:10]) < 20


def test_interrupt_silences_speech_at_once() -> None:
    r = run_in_netns("behaviour.py", "--case", "interrupt")
    assert r["errors"] == []
    assert r["rms_before"] > 0.05  # the avatar was speaking
    assert r["audio_frames_after"] > 50  # audio continues (silence), no gap
    assert r["rms_after_max"] < 0.01  # and it is silent within 0.3 s of the interrupt
    assert r["speech_events"][:2] == ["started", "interrupted"]
    assert r["speech_pending_after"] == 0


def test_falling_behind_drops_video_never_audio_and_recovers() -> None:
    r = run_in_netns("behaviour.py", "--case", "slow")
    assert r["errors"] == []
    # audio: continuous, real time, no stutter while generation was too slow
    assert r["audio_frames"] >= 0.95 * r["audio_span_s"] * 50
    # Arrival gaps: every 20 ms block arrived (the count above), none held back long. On this
    # 2-core VM scheduling alone gives arrival gaps of 60-240 ms now and then (seen with and
    # without the throttle, client in its own process); a receiver's jitter buffer covers that.
    assert r["max_audio_gap_ms"] < 300
    # video: late frames were counted (repeated), the call went on
    assert r["late_frames"] + r["dropped_frames"] > 0
    assert r["video_frames"] >= 24 * 10
    # lag does not grow: after recovery, latency is back near where it started
    assert r["latency_late_ms"] <= r["latency_early_ms"] + 80


def test_mouth_moves_with_speech_and_rests_in_silence() -> None:
    from talkloop.pipeline.models.studio.family import installed_weights

    if installed_weights() is None:
        pytest.skip("needs the trained default weights (issue 3): random weights draw no mouth")
    r = run_in_netns("mouth.py", timeout=600)
    late = (r["late_frames"] or 0) / max(r["frames_sent"] or 0, 1)  # None: no stats came
    if late > 0.5:
        # Speed is the bench's business (talkloop bench --live), not this test's. Where the
        # server falls far behind (a VM whose host is busy: seen with both cores taken by
        # another job, 96 % late), the client sees stale speech frames in the silence and the
        # mouth cannot be judged. On CI's 2-core AVX2 machine the call keeps up (seen: 0 late
        # frames at in-server rtf 0.58), and the assertions still held with a busy loop taking
        # 90 % or all of one core (rtf 0.95-0.97, up to 13 % late).
        pytest.skip(
            f"the server fell behind in this call ({late:.0%} of frames late, in-server rtf "
            f"{r['rtf']}): this machine is too busy right now to judge the mouth"
        )
    assert r["speech_frames"] > 50 and r["silence_frames"] > 50  # both phases reached the client
    # Mouth opening read from the received frames (0 closed, ~1 wide open): it opens and moves
    # with speech (seen: mean 0.25, std 0.13) and stays closed in silence (median 0.06).
    assert r["speech_open_mean"] > 2.5 * r["silence_open_mean"]
    assert r["speech_open_std"] > 0.08
    assert r["silence_open_median"] < 0.12
