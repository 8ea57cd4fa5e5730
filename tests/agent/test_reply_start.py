"""A reply that arrives ahead of real time starts at once: it takes the place of idle audio that
was produced but not yet played, the chunks made from that silence are made again, and the reply
plays in sync, whole, with exact positions (manual clock)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from talkloop.agent.clock import ManualClock
from talkloop.agent.frames import AudioFrame, PlaybackFinished, PlaybackStarted, VideoFrame
from talkloop.agent.session import AvatarConfig, AvatarSession
from talkloop.pipeline.audio.resample import resample

from support import advance, drain, make_reference, pcm_frame, run, tone

pytestmark = pytest.mark.unit

OUT = 48000
RATE = 24000  # an agent's TTS
PLAYOUT_MS = 400
LEAD_MS = 60  # the reply's lead, fixed: the measured one follows the machine's speed


def open_avatar(pipeline):
    """An avatar on a manual clock with a fixed lead, started, and a consumer taking its output
    into ``out`` as ``(time, item)``."""
    clock = ManualClock()
    cfg = AvatarConfig(playout_delay_ms=PLAYOUT_MS, reply_lead_ms=LEAD_MS)
    avatar = AvatarSession(pipeline, make_reference(), config=cfg, clock=clock)
    avatar.start()
    out: list = []
    consumer = asyncio.create_task(drain(avatar, out, clock))
    return clock, avatar, out, consumer


def media_frame(avatar, pts: int) -> int:
    """The index of the frame whose span holds the sample played at ``pts`` (played time, at
    ``OUT``): played time runs behind the media timeline by what the clock jumped over."""
    skipped = avatar.media.skipped * (OUT // avatar.info.sample_rate)
    return (pts + skipped) // (OUT // avatar.info.fps)


def send_reply(avatar, reply: np.ndarray) -> None:
    """All of it at once, in 20 ms frames, as a fast TTS sends it; then the segment's end."""
    for i in range(0, reply.shape[0], RATE // 50):
        avatar.push_audio(pcm_frame(reply[i : i + RATE // 50], RATE))
    avatar.end_of_segment()


def play_a_reply(pipeline, idle_s: float):
    reply = tone(int(0.8 * RATE), RATE, hz=300.0, amp=0.4)

    async def body():
        clock, avatar, out, consumer = open_avatar(pipeline)
        await advance(avatar, clock, idle_s)  # the avatar idles: silence produced, frames made
        pushed_at = clock.now()
        send_reply(avatar, reply)
        await advance(avatar, clock, 1.6)
        consumer.cancel()
        await avatar.close()
        return avatar, out, pushed_at

    return reply, *run(body(), 240)


def test_a_reply_ahead_of_real_time_plays_before_the_playout_delay(live_pipeline) -> None:
    reply, avatar, out, pushed_at = play_a_reply(live_pipeline, idle_s=1.0)
    audio = [(t, f) for t, f in out if isinstance(f, AudioFrame)]
    video = [(t, f) for t, f in out if isinstance(f, VideoFrame)]
    seg = [(t, f) for t, f in audio if f.segment_id == 0]
    assert avatar.early_replies == 1
    # It plays the lead after it arrived (and a block or two of ticks), well before the playout
    # delay would have let it: the clock jumped over the idle media queued before it.
    waited = seg[0][0] - pushed_at
    assert LEAD_MS / 1000 <= waited + 1e-9 <= LEAD_MS / 1000 + 0.02 < PLAYOUT_MS / 1000
    # The stats say where that time went: its audio waited, then the lead and the next block.
    start = avatar.stats()["early_reply"]
    assert start["plays_in_ms"] >= LEAD_MS
    assert abs(start["waited_ms"] + start["plays_in_ms"] - 1000 * waited) <= 10.0 + 1e-6
    # Whole and in order: the segment's samples are the reply, resampled once, nothing missing.
    played = np.concatenate([np.frombuffer(f.data, "<i2") for _, f in seg]).astype(np.float32)
    sent = np.rint(np.clip(resample(reply, RATE, OUT), -1, 1) * 32767)
    assert played.shape[0] == 960 * -(-sent.shape[0] // 960)
    assert np.abs(played[: sent.shape[0]] - sent).max() <= 4
    # One clock: audio blocks and frames each on their own grid, every one at its media time.
    t0 = avatar.media.t0
    # The clock jumped over idle media, by whole audio blocks: timestamps count played time, so
    # the audio's stay continuous, and the frame on show at the jump is shown shorter by the part
    # of a frame the jump passed over (only that one); the frame indices pass over exactly the
    # idle frames the jump dropped.
    assert [f.pts for _, f in audio] == [960 * k for k in range(len(audio))]
    steps = np.diff([f.pts for _, f in video])
    short = 1920 - avatar.media.skipped * (OUT // avatar.info.sample_rate) % 1920
    assert set(steps.tolist()) <= {1920, short} and np.count_nonzero(steps != 1920) <= 1
    indices = [f.index for _, f in video]
    assert indices == sorted(set(indices))
    assert indices[-1] + 1 - len(indices) == avatar.idle_dropped_frames > 0
    for t, f in audio + video:
        assert t0 + f.pts / OUT <= t + 1e-9
    # Only idle frames were passed over: no frame was dropped late, none was missing.
    assert avatar.dropped_frames == 0 and not any(f.held for _, f in video)
    # The agent's events: started as its first block played, finished at its exact length.
    events = [f for _, f in out if isinstance(f, PlaybackStarted | PlaybackFinished)]
    assert [type(e) for e in events] == [PlaybackStarted, PlaybackFinished]
    assert events[1].position_ms == int(1000 * sent.shape[0] / OUT) and not events[1].interrupted


def test_the_reply_is_lip_synced_from_its_first_frame(live_pipeline) -> None:
    """The frames shown from the reply's start on are made from the reply: the same frames an
    avatar makes that was given the reply in real time at that point of its timeline."""
    _, avatar, out, _ = play_a_reply(live_pipeline, idle_s=1.0)
    video = [f for _, f in out if isinstance(f, VideoFrame)]
    first = [f for _, f in out if isinstance(f, AudioFrame) and f.segment_id == 0][0]
    start = media_frame(avatar, first.pts)  # the reply's first frame
    shown = [f for f in video if f.index >= start]
    assert shown and not any(f.held for f in shown[:10])  # no frame of the old silence, no gap


def test_a_reply_streamed_at_twice_real_time_starts_on_its_first_chunk(live_pipeline) -> None:
    """A TTS that streams at 2x: the reply starts once its first chunk and the look-ahead are
    here, not once it covers all the idle audio produced since the last frame was made (the
    idle blocks past its audio are forgotten), and it still plays whole, in sync."""
    reply = tone(int(0.8 * RATE), RATE, hz=300.0, amp=0.4)
    block = RATE // 50

    info = live_pipeline.info
    chunk_s = live_pipeline.config.schedule.n_len / info.fps
    look_s = live_pipeline.lookahead_samples / info.sample_rate

    def unmade_s(avatar) -> float:  # idle audio produced past the last frame made
        made = avatar.session.made_until * info.sample_rate // info.fps
        return (avatar.driver.samples - made) / info.sample_rate

    async def body():
        clock, avatar, out, consumer = open_avatar(live_pipeline)
        await advance(avatar, clock, 1.0)
        # Start it when half a chunk of idle audio is produced past the last frame made: by the
        # time its first chunk and look-ahead are here (half their length later, at 2x), more
        # than a chunk is, and no new frame was made: part of that idle span is forgotten.
        for _ in range(100):
            if abs(unmade_s(avatar) - chunk_s / 2) < look_s / 2 - 0.005:
                break
            await advance(avatar, clock, 0.01)
        rewrites = []
        rewrite = avatar.driver.rewrite

        def spy(sample: int, keep: int = 0):
            before = avatar.driver.samples
            audio = rewrite(sample, keep)
            rewrites.append((before, avatar.driver.samples))
            return audio

        avatar.driver.rewrite = spy
        pushed_at = clock.now()
        for i in range(0, reply.shape[0], block):  # 20 ms of audio every 10 ms
            avatar.push_audio(pcm_frame(reply[i : i + block], RATE))
            await advance(avatar, clock, 0.01)
        avatar.end_of_segment()
        await advance(avatar, clock, 1.6)
        consumer.cancel()
        await avatar.close()
        return avatar, out, pushed_at, rewrites

    avatar, out, pushed_at, rewrites = run(body(), 240)
    assert len(rewrites) == 1 and rewrites[0][1] < rewrites[0][0]  # production went back
    audio = [(t, f) for t, f in out if isinstance(f, AudioFrame)]
    seg = [(t, f) for t, f in audio if f.segment_id == 0]
    assert avatar.early_replies == 1
    # Its first chunk and the model's look-ahead arrive in half their length; then the lead and
    # at most a block (the jump moves by whole blocks) and a tick.
    first = (chunk_s + look_s) / 2
    assert LEAD_MS / 1000 <= seg[0][0] - pushed_at <= first + LEAD_MS / 1000 + 0.02 + 0.02
    played = np.concatenate([np.frombuffer(f.data, "<i2") for _, f in seg]).astype(np.float32)
    sent = np.rint(np.clip(resample(reply, RATE, OUT), -1, 1) * 32767)
    assert np.abs(played[: sent.shape[0]] - sent).max() <= 4  # whole: no idle gap inside it
    assert [f.pts for _, f in audio] == [960 * k for k in range(len(audio))]
    video = [f for _, f in out if isinstance(f, VideoFrame)]
    start = media_frame(avatar, seg[0][1].pts)
    shown = [f for f in video if f.index >= start]
    assert shown and not any(f.held for f in shown)  # every frame of it made in time
    assert avatar.dropped_frames == 0


def interrupt_a_reply(pipeline, seconds: float, after_s: float):
    """Idle 1 s, send a reply of ``seconds``, interrupt it ``after_s`` later (0: at its early
    start, before generation ran); returns what was emitted, the interrupt's events, and the
    early starts and the clock's skip at the interrupt."""
    reply = tone(int(seconds * RATE), RATE, hz=300.0, amp=0.4)

    async def body():
        clock, avatar, out, consumer = open_avatar(pipeline)
        await advance(avatar, clock, 1.0)
        send_reply(avatar, reply)
        if after_s:
            await advance(avatar, clock, after_s)
        else:
            avatar._start_reply_early()  # the next tick's early start, before generation runs
        early, skipped = avatar.early_replies, avatar.media.skipped
        finished = avatar.clear_buffer()
        await advance(avatar, clock, 1.0)
        consumer.cancel()
        await avatar.close()
        return [f for _, f in out if isinstance(f, AudioFrame)], finished, early, skipped

    return run(body(), 240)


def test_an_interrupt_right_after_an_early_start_leaves_no_reply_behind(live_pipeline) -> None:
    """Interrupted before the session went back (the rewind pending): neither the reply's audio
    nor frames made from it are played after the interrupt."""
    audio, finished, early, _ = interrupt_a_reply(live_pipeline, 0.8, after_s=0)
    assert early == 1
    assert [f.interrupted for f in finished] == [True] and finished[0].position_ms == 0
    assert not any(f.segment_id == 0 for f in audio)  # nothing of the reply was played
    played = np.concatenate([np.frombuffer(f.data, "<i2") for f in audio])
    assert np.abs(played).max() == 0  # silence throughout: the avatar stayed idle


def test_a_second_reply_queued_behind_one_that_plays_does_not_jump(live_pipeline) -> None:
    """The clock jumps only over idle media: a reply that arrives while another still plays
    follows it on the clock, and once both have played the idle audio makes the playout delay
    whole again."""
    reply = tone(int(0.6 * RATE), RATE, hz=300.0, amp=0.4)

    async def body():
        clock, avatar, out, consumer = open_avatar(live_pipeline)
        await advance(avatar, clock, 1.0)
        skips = []
        for _ in range(2):
            send_reply(avatar, reply)
            await advance(avatar, clock, 0.3)  # the first reply plays when the second arrives
            skips.append(avatar.media.skipped)
        await advance(avatar, clock, 2.0)
        consumer.cancel()
        await avatar.close()
        return avatar, out, skips

    avatar, out, skips = run(body(), 240)
    assert skips[0] > 0 and skips[1] == skips[0]  # one jump, for the first reply only
    assert avatar.driver.shortfall == 0
    audio = [f for _, f in out if isinstance(f, AudioFrame)]
    ids = [f.segment_id for f in audio if f.segment_id is not None]
    assert ids == sorted(ids) and set(ids) == {0, 1}
    # Back to back: the second reply's first block follows the first reply's last one.
    last0 = max(k for k, f in enumerate(audio) if f.segment_id == 0)
    first1 = min(k for k, f in enumerate(audio) if f.segment_id == 1)
    assert first1 == last0 + 1
    events = [f for _, f in out if isinstance(f, PlaybackFinished)]
    assert [e.interrupted for e in events] == [False, False]


def test_an_interrupt_after_a_jump_reports_the_position_played(live_pipeline) -> None:
    audio, finished, _, skipped = interrupt_a_reply(live_pipeline, 1.5, after_s=0.5)
    assert skipped > 0
    played = sum(len(f.data) // 2 for f in audio if f.segment_id == 0)
    assert 0 < played < 1.5 * OUT
    assert [f.interrupted for f in finished] == [True]
    assert finished[0].position_ms == int(1000 * played / OUT)
