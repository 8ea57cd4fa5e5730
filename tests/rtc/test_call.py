"""Real WebRTC calls (aiortc client <-> talkloop server) in a private network namespace."""

from __future__ import annotations

import numpy as np
import pytest

from netns import run_in_netns
from support import contiguous_audio, on_frame_grid, speech_and_pauses

pytestmark = pytest.mark.e2e


def test_call_streams_paced_video_and_aligned_audio() -> None:
    """What the peer receives, judged by media timestamps and content, never by arrival times:
    how fast this machine is (fps, A/V offsets, glass to glass) is `talkloop bench --live`'s
    business. That audio and video leave on one clock, each at its media time, is asserted
    exactly on a manual clock (tests/agent/test_session.py)."""
    r = run_in_netns("call.py", "--seconds", "8")
    assert r["errors"] == []
    assert r["codec"] == "H264"  # preferred over VP8
    # frames arrive and decode, at the session's size
    assert r["video_frames"] > 0 and r["frame_shape"] == [128, 128, 3]
    # paced on the media clock: every frame a later slot of the 25 fps grid (a late sender
    # skips slots, never sends one twice)
    assert on_frame_grid(r["video_pts"])
    # audio never stops: every 20 ms block, none missing, at the Opus rate
    assert r["audio_rate"] == 48000 and contiguous_audio(r["audio_pts"])
    # the avatar's audio is the driving audio: speech comes back (not only silence). The
    # audio track starts at media time 0, before the microphone's first half second of silence
    # can have been played: its first blocks are quiet whenever the peer connected.
    rms = np.array(r["audio_rms"])
    assert rms.max() > 0.05 and np.median(rms[:10]) < 0.01
    # every frame made from speech carries the arrival time of its audio (the latency stamp):
    # read back, and never before that arrival (a frame is made after its audio came)
    g2g = np.array(r["glass_to_glass_ms"])
    assert g2g.size > 0 and np.all(g2g < 2**31)  # unsigned ms: "negative" reads as huge
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
    """By media position: everything from the server's cut on (the next sample its audio output
    was to emit when the interrupt came) is silence, however late it arrived (from the block
    after the cut's: Opus's 6.5 ms look-ahead carries the end of the speech into that one)."""
    r = run_in_netns("behaviour.py", "--case", "interrupt")
    assert r["errors"] == [] and r["cut"] > 0
    assert contiguous_audio(r["audio_pts"])  # audio continues (silence), no gap
    assert r["rms_before"] > 0.05  # the avatar was speaking in the second before the cut
    assert r["audio_frames_after"] >= 50  # at least a second of the call after the cut...
    assert r["rms_after_max"] < 0.01  # ...and all of it silent
    assert r["speech_events"][:2] == ["started", "interrupted"]
    assert r["speech_pending_after"] == 0


def test_falling_behind_drops_video_never_audio_and_recovers() -> None:
    """Generating media seconds 3-6 takes 2.5x real time (a throttle by frame index). Judged by
    media timestamps and frame numbers, not by arrival times or latencies."""
    r = run_in_netns("behaviour.py", "--case", "slow")
    assert r["errors"] == []
    # audio: never skipped, every 20 ms block from first to last, while video was late
    assert contiguous_audio(r["audio_pts"])
    # video: late frames were counted (repeated or dropped), the call went on on the frame grid
    assert r["late_frames"] + r["dropped_frames"] > 0
    assert on_frame_grid(r["video_pts"])
    # Which frame each received picture shows: a frame on time shows its own slot's number, a
    # repeat an older one. slot - number is smallest (the same) for every frame shown on time.
    slots = (np.array(r["video_pts"]) - r["video_pts"][0]) // 3600
    shown = [(s, k) for s, k in zip(slots, r["numbers"], strict=True) if k is not None]
    lag = np.array([s - k for s, k in shown])
    number = np.array([k for _, k in shown])
    start, stop = r["throttled"]
    assert (lag[(number >= start) & (number < stop)] > lag.min()).any()  # it fell behind...
    assert (lag[number >= stop] == lag.min()).any()  # ...and frames made after are on time again


@pytest.fixture(scope="module")
def mouth_call() -> dict:
    from talkloop.pipeline.models.studio.family import installed_weights

    if installed_weights() is None:  # a stripped install, not a slow machine
        pytest.skip("needs the trained studio weights: random weights draw no mouth")
    return run_in_netns("mouth.py", timeout=600)


def test_a_studio_call_delivers_numbered_frames(mouth_call) -> None:
    """The smoke half of the mouth call: frames arrive, decode, and show generated frames."""
    r = mouth_call
    assert r["errors"] == [] and r["codec"] == "H264"
    assert r["video_frames"] > 0 and r["frame_shape"] == [256, 256, 3]
    assert len(r["index"]) > 0 and r["sessions_left"] == 0


def test_mouth_moves_with_speech_and_rests_in_silence(mouth_call) -> None:
    """Judged by media position: each received frame against the driving audio of the
    generated frame it shows. A server that falls behind repeats and skips frames; the frames
    that do arrive are still judged against their own audio, so lateness neither fails nor
    skips this (speed is `talkloop bench --live`'s business)."""
    r = mouth_call
    opening = np.array(r["opening"])  # readout: 0 closed, ~1 wide open
    speech, silence = speech_and_pauses(r["index"], r["driving_rms"])
    # Both phases reached the client (the scenario repeats its plan until 50 of each did; seen:
    # 82 and 132 in one round, 0 late frames at in-server rtf 0.69).
    assert speech.sum() >= 50 and silence.sum() >= 50
    # It opens and moves with speech (seen: mean 0.32, std 0.19) and stays closed in silence
    # (median 0.03).
    assert opening[speech].mean() > 2.5 * opening[silence].mean()
    assert opening[speech].std() > 0.08
    assert np.median(opening[silence]) < 0.12
