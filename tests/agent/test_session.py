"""AvatarSession in-process, paced by a manual clock: speech in faster than real time, paced
frames and the same audio out, playback positions, interrupts, bad input and backpressure."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from talkloop.agent.clock import ManualClock
from talkloop.agent.frames import (
    AudioFormatError,
    AudioFrame,
    PlaybackFinished,
    PlaybackStarted,
    VideoFrame,
)
from talkloop.agent.session import AvatarConfig, AvatarSession
from talkloop.pipeline.audio.resample import resample
from talkloop.pipeline.core.engine import Engine
from talkloop.pipeline.core.errors import BusyError

from support import advance, drain, make_reference, pcm_frame, run, settle

pytestmark = pytest.mark.unit

RATE = 16000
OUT = 48000  # the rate an avatar emits


def speech_like(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """A voiced-sounding test signal (harmonics with a syllable envelope), float32 mono."""
    t = np.arange(int(seconds * rate)) / rate
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)
    x = sum(np.sin(2 * np.pi * f * t + seed) / k for k, f in enumerate((150, 300, 450), 1))
    return (0.3 * env * x).astype(np.float32)


def open_session(pipeline, **config) -> tuple[AvatarSession, ManualClock]:
    clock = ManualClock()
    cfg = AvatarConfig(playout_delay_ms=400, **config)
    return AvatarSession(pipeline, make_reference(), config=cfg, clock=clock), clock


@pytest.mark.parametrize("rate", [16000, 24000, 48000])
def test_speech_pushed_faster_than_real_time_plays_paced_and_in_sync(live_pipeline, rate) -> None:
    speech = speech_like(1.5, rate)

    async def body():
        avatar, clock = open_session(live_pipeline)
        avatar.start()
        out: list = []
        consumer = asyncio.create_task(drain(avatar, out, clock))
        # the whole utterance at once, in 20 ms frames (as a TTS faster than real time does)
        step = rate // 50
        for i in range(0, speech.shape[0], step):
            avatar.push_audio(pcm_frame(speech[i : i + step], rate))
        avatar.end_of_segment()
        pushed_at = clock.now()
        await advance(avatar, clock, 2.6)
        consumer.cancel()
        await avatar.close()
        return avatar, out, pushed_at

    avatar, out, pushed_at = run(body(), 240)
    t0 = avatar.media.t0
    audio = [(t, f) for t, f in out if isinstance(f, AudioFrame)]
    video = [(t, f) for t, f in out if isinstance(f, VideoFrame)]
    events = [f for _, f in out if isinstance(f, PlaybackStarted | PlaybackFinished)]
    # one clock, one rate: audio and video pts both count output samples (48 kHz)
    assert avatar.sample_rate == OUT and all(f.sample_rate == OUT for _, f in audio + video)
    # paced: every frame leaves at its media time (within one clock step), never early
    for t, f in audio + video:
        due = t0 + f.pts / OUT
        assert due <= t + 1e-9 < due + 0.01 + 1e-9
    assert [f.index for _, f in video] == list(range(len(video)))
    assert [f.pts for _, f in video] == [OUT // 25 * f.index for _, f in video]
    assert [f.pts for _, f in audio] == [960 * k for k in range(len(audio))]
    assert not any(f.held for _, f in video)  # generation kept up: no repeated frames
    assert avatar.overrun_frames == 0
    # the sender's A/V offset (what RTCP reports carry to a receiver's lip sync): both outputs
    # handed their frames on within one clock step of their media time, so within one step of
    # each other (the live call in tests/rtc/test_call.py measures it, never judges it)
    offset = avatar.stats()["av_offset_ms"]
    assert offset is not None and abs(offset) < 10 + 1e-6
    # the same audio comes back at full band: the segment's samples, in order, from playout;
    # at 48 kHz untouched, from other rates resampled once
    seg = [f for _, f in audio if f.segment_id == 0]
    played = np.concatenate([np.frombuffer(f.data, "<i2") for f in seg]).astype(np.float32)
    sent = np.rint(np.clip(resample(speech, rate, OUT), -1, 1) * 32767)
    assert played.shape[0] == 960 * -(-sent.shape[0] // 960)  # last block padded with silence
    worst = np.abs(played[: sent.shape[0]] - sent).max()
    assert worst <= (1 if rate == OUT else 4)  # PCM16 round trip (+ streaming vs whole filter)
    assert seg[0].pts == 960  # start() made block 0 (silence); the speech follows it
    # events: started right after the first segment frame, finished at the full length
    assert [type(e) for e in events] == [PlaybackStarted, PlaybackFinished]
    assert events[1].segment_id == 0 and not events[1].interrupted
    assert events[1].position_ms == int(1000 * sent.shape[0] / OUT)
    kinds = [type(f) for _, f in out]
    in_seg = [i for i, (_, f) in enumerate(out) if isinstance(f, AudioFrame) and f.segment_id == 0]
    first_seg, last_seg = in_seg[0], in_seg[-1]
    assert kinds[first_seg + 1] is PlaybackStarted
    assert kinds[last_seg + 1] is PlaybackFinished
    # it was pushed at once but played in real time: finished ~1.5 s of media later
    t_finished = out[last_seg + 1][0]
    assert t_finished - pushed_at == pytest.approx(0.4 + 1.5, abs=0.03)


def test_a_video_sender_that_falls_behind_skips_to_the_frame_due_now(live_pipeline) -> None:
    """An encoder slower than the frame rate (an overloaded machine) must not build up lag: each
    call returns the frame due at that moment, and the frame slots it missed are counted."""

    async def body():
        avatar, clock = open_session(live_pipeline)
        avatar.start()
        avatar.push_audio(pcm_frame(speech_like(3.0, RATE), RATE))
        await advance(avatar, clock, 0.5)
        got = []
        for _ in range(25):
            got.append((clock.now(), await avatar.next_video()))
            await advance(avatar, clock, 0.1)  # 100 ms per frame: 2.5 frame times
        await avatar.close()
        return avatar, got

    avatar, got = run(body(), 240)
    frame_s = 1 / avatar.info.fps
    late = [t - avatar.media.due(avatar.info.frame_pts(f.index)) for t, f in got]
    assert all(0 <= x < frame_s for x in late), late  # never more than a frame behind
    indices = [f.index for _, f in got]
    assert all(b - a in (2, 3) for a, b in zip(indices, indices[1:], strict=False)), indices
    assert avatar.frames_sent == len(got)
    # every frame slot from the first was either sent or counted as missed
    assert avatar.overrun_frames == indices[-1] + 1 - len(got)
    assert avatar.stats()["overrun_frames"] == avatar.overrun_frames


def test_interrupt_reports_the_played_position_and_emits_nothing_of_the_segment(
    live_pipeline,
) -> None:
    speech = speech_like(3.0, 24000)  # OpenAI Realtime rate: resampled inside

    async def body():
        avatar, clock = open_session(live_pipeline)
        avatar.start()
        out: list = []
        consumer = asyncio.create_task(drain(avatar, out, clock))
        avatar.push_audio(pcm_frame(speech, 24000), label="item_1")
        await advance(avatar, clock, 1.3)
        generated = avatar.session.state.frames_published
        cut = avatar.driver.out_index(avatar._audio_next)  # at the output rate
        n_before = len(out)
        finished = avatar.clear_buffer()
        await advance(avatar, clock, 1.2)
        consumer.cancel()
        await avatar.close()
        return avatar, out, n_before, finished, generated, cut

    avatar, out, n_before, finished, generated, cut = run(body(), 240)
    before, after = out[:n_before], out[n_before:]
    emitted = sum(
        len(f.data) // 2 for _, f in before if isinstance(f, AudioFrame) and f.segment_id == 0
    )
    assert len(finished) == 1 and finished[0].interrupted and finished[0].label == "item_1"
    # the position is what the audio output emitted, to the sample (so to the millisecond)
    assert finished[0].position_s == emitted / OUT
    assert 0.8 < finished[0].position_s < 1.0  # 1.3 s in, minus the 0.4 s playout delay
    assert any(isinstance(f, PlaybackFinished) and f.interrupted for _, f in after)
    # afterwards: no sample of the segment, only silence, and no frame made from its audio
    after_audio = [f for _, f in after if isinstance(f, AudioFrame)]
    assert after_audio and all(f.segment_id is None for f in after_audio)
    assert max(np.abs(np.frombuffer(f.data, "<i2")).max() for f in after_audio) == 0
    after_video = [f for _, f in after if isinstance(f, VideoFrame)]
    stale = [f for f in after_video if f.index < generated and f.pts >= cut]
    assert stale and all(f.held for f in stale)  # generated before the cut: withheld
    assert avatar.withheld_frames == len(stale)
    fresh = [f for f in after_video if f.index >= generated]
    assert fresh and not any(f.held for f in fresh)  # then new frames from the silence
    held_rgb = {f.rgb.tobytes() for f in stale}
    assert len(held_rgb) == 1  # a hold of the last frame that was played


def test_segment_end_after_the_audio_played_still_finishes(live_pipeline) -> None:
    """An agent that sends segment_end late (after its audio has played) still gets finished."""
    speech = speech_like(0.5, RATE)

    async def body():
        avatar, clock = open_session(live_pipeline)
        avatar.start()
        out: list = []
        consumer = asyncio.create_task(drain(avatar, out, clock))
        avatar.push_audio(pcm_frame(speech, RATE))
        await advance(avatar, clock, 1.2)
        avatar.end_of_segment()
        await advance(avatar, clock, 0.1)
        consumer.cancel()
        await avatar.close()
        return out

    events = [f for _, f in run(body(), 240) if isinstance(f, PlaybackStarted | PlaybackFinished)]
    assert [type(e) for e in events] == [PlaybackStarted, PlaybackFinished]
    # every sample that played: all but the resampler's last millisecond (16 -> 48 kHz), which
    # arrived with the late end, after the segment had finished producing
    assert 499 <= events[1].position_ms <= 500 and not events[1].interrupted


def test_bad_audio_is_rejected_with_clear_errors_and_backpressure(live_pipeline) -> None:
    async def body():
        avatar, clock = open_session(live_pipeline, max_pending_speech_s=1.0)
        errors = {}
        for name, frame in {
            "odd": AudioFrame(b"\x00\x01\x02", 16000),
            "rate": AudioFrame(b"\x00\x00", 44),
            "channels": AudioFrame(b"\x00\x00", 16000, 6),
            "stereo_odd": AudioFrame(b"\x00\x00", 16000, 2),
        }.items():
            with pytest.raises(AudioFormatError) as err:
                avatar.push_audio(frame)
            errors[name] = str(err.value)
        avatar.push_audio(
            pcm_frame(speech_like(0.8, 48000), 48000, channels=2)
        )  # stereo 48 kHz: fine
        queued = avatar.pending_s
        with pytest.raises(BusyError):
            avatar.push_audio(pcm_frame(speech_like(0.5, RATE), RATE))
        still = avatar.pending_s
        avatar.start()
        await advance(avatar, clock, 0.2)  # 0.6 s still queued: 0.5 s more does not fit
        waiter = asyncio.create_task(avatar.wait_for_room(0.5))
        await advance(avatar, clock, 0.05)
        done_early = waiter.done()
        await advance(avatar, clock, 0.1)  # queue drained in real time: it fits now
        await asyncio.wait_for(waiter, 5)
        avatar.push_audio(pcm_frame(speech_like(0.5, RATE), RATE))  # room again: accepted
        await avatar.close()
        return errors, queued, still, done_early

    errors, queued, still, done_early = run(body(), 240)
    assert "whole number" in errors["odd"] and "sample_rate 44" in errors["rate"]
    assert "mono (1) or stereo (2)" in errors["channels"]
    assert "whole number" in errors["stereo_odd"]
    assert queued == pytest.approx(0.8, abs=0.01)  # 48 kHz stereo became 0.8 s of mono
    assert still == queued  # the refused frame added nothing
    assert not done_early  # wait_for_room waited for playback to make room


def test_catch_up_bound_follows_the_measured_chunk_time(live_pipeline) -> None:
    """Chunks are skipped once no frame of them could play on time: playout - look-ahead -
    chunk time - one frame, never above max_lag_ms and never below one driving block."""
    avatar, _ = open_session(live_pipeline, max_lag_ms=1000)
    info = live_pipeline.info
    lookahead = live_pipeline.lookahead_samples / info.sample_rate
    stats = avatar.session.stats
    stats.chunk_seconds = None  # nothing measured yet: only the fixed parts count
    assert avatar.lag_budget() == pytest.approx(0.4 - lookahead - 1 / info.fps)
    stats.chunk_seconds = 0.15
    assert avatar.lag_budget() == pytest.approx(0.4 - lookahead - 0.15 - 1 / info.fps)
    stats.chunk_seconds = 5.0  # hopelessly slow: skip down to one block of backlog
    assert avatar.lag_budget() == pytest.approx(0.02)
    capped, _ = open_session(live_pipeline, max_lag_ms=100)
    capped.session.stats.chunk_seconds = 0.0
    assert capped.lag_budget() == pytest.approx(0.1)
    for a in (avatar, capped):
        run(a.close(), 240)


def test_default_playout_delay_is_two_chunks_plus_the_lookahead(live_pipeline) -> None:
    avatar = AvatarSession(live_pipeline, make_reference(), clock=ManualClock())
    info = live_pipeline.info
    chunk = live_pipeline.config.schedule.n_len / info.fps
    expected = (
        2 * chunk + live_pipeline.lookahead_samples / info.sample_rate + 0.02
    )  # one 20 ms driving block
    assert avatar.playout_s == pytest.approx(expected)
    assert avatar.stats()["playout_delay_ms"] == round(expected * 1000)
    given = AvatarSession(
        live_pipeline, make_reference(), config=AvatarConfig(playout_delay_ms=700)
    )
    assert given.playout_s == pytest.approx(0.7)
    for a in (avatar, given):
        run(a.close(), 240)


def test_a_call_that_starts_later_has_its_chunks_ready_with_the_first_calls(live_pipeline) -> None:
    # Two calls of one engine on one clock, the second started 30 ms after the first: it anchors
    # its timeline on the first one's chunk grid (a chunk earlier, with silence), so each chunk
    # of both has its audio at the same moment and the engine can run them as one batch.
    chunk_s = live_pipeline.config.schedule.n_len / live_pipeline.info.fps

    async def body():
        clock = ManualClock(5.0)
        engine = Engine()
        cfg = AvatarConfig(playout_delay_ms=400)
        first, second = (
            AvatarSession(live_pipeline, make_reference(), config=cfg, clock=clock, engine=engine)
            for _ in range(2)
        )
        first.start()
        await advance(first, clock, 0.03)
        second.start()
        received = []
        await advance(second, clock, 0.02)
        for _ in range(15):  # 300 ms, looked at in the middle of each 20 ms driving block
            await settle(first)
            received.append(
                (first.session.state.audio.received, second.session.state.audio.received)
            )
            await advance(second, clock, 0.02)
        await first.close()
        await second.close()
        return first, second, received

    first, second, received = run(body(), 120)
    assert first.driver.started_at == 5.0
    assert chunk_s > 0.03 and second.driver.started_at == pytest.approx(5.0)  # not 5.03
    assert second.media.due(0) == pytest.approx(first.media.due(0))
    assert all(a == b for a, b in received) and received[-1][0] > received[0][0], received
