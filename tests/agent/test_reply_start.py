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


def play_a_reply(pipeline, idle_s: float):
    reply = tone(int(0.8 * RATE), RATE, hz=300.0, amp=0.4)

    async def body():
        clock = ManualClock()
        avatar = AvatarSession(
            pipeline,
            make_reference(),
            config=AvatarConfig(playout_delay_ms=PLAYOUT_MS, reply_lead_ms=LEAD_MS),
            clock=clock,
        )
        avatar.start()
        out: list = []

        consumer = asyncio.create_task(drain(avatar, out, clock))
        await advance(avatar, clock, idle_s)  # the avatar idles: silence produced, frames made
        pushed_at = clock.now()
        for i in range(0, reply.shape[0], RATE // 50):  # all at once, as a fast TTS sends it
            avatar.push_audio(pcm_frame(reply[i : i + RATE // 50], RATE))
        avatar.end_of_segment()
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
    # It plays well before the playout delay would have let it: at the first chunk start at
    # least the lead from now (so within one chunk of the live schedule after the lead).
    waited = seg[0][0] - pushed_at
    chunk_s = live_pipeline.config.schedule.n_len / 25
    assert LEAD_MS / 1000 <= waited + 1e-9 <= LEAD_MS / 1000 + chunk_s + 0.02 < PLAYOUT_MS / 1000
    # Whole and in order: the segment's samples are the reply, resampled once, nothing missing.
    played = np.concatenate([np.frombuffer(f.data, "<i2") for _, f in seg]).astype(np.float32)
    sent = np.rint(np.clip(resample(reply, RATE, OUT), -1, 1) * 32767)
    assert played.shape[0] == 960 * -(-sent.shape[0] // 960)
    assert np.abs(played[: sent.shape[0]] - sent).max() <= 4
    # One clock: audio blocks and frames each on their own grid, every one at its media time.
    t0 = avatar.media.t0
    assert [f.pts for _, f in audio] == [960 * k for k in range(len(audio))]
    assert [f.index for _, f in video] == list(range(len(video)))
    for t, f in audio + video:
        assert t0 + f.pts / OUT <= t + 1e-9
    # The frames made from the silence the reply replaced were withheld, not shown.
    assert avatar.withheld_frames > 0
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
    start = first.pts // (OUT // 25)  # the reply's first frame
    shown = [f for f in video if f.index >= start]
    assert shown and not any(f.held for f in shown[:10])  # no frame of the old silence, no gap


def test_an_interrupt_right_after_an_early_start_leaves_no_reply_behind(live_pipeline) -> None:
    """Interrupted before the session went back (the rewind pending): neither the reply's audio
    nor frames made from it are played after the interrupt."""
    reply = tone(int(0.8 * RATE), RATE, hz=300.0, amp=0.4)

    async def body():
        clock = ManualClock()
        cfg = AvatarConfig(playout_delay_ms=PLAYOUT_MS, reply_lead_ms=LEAD_MS)
        avatar = AvatarSession(live_pipeline, make_reference(), config=cfg, clock=clock)
        avatar.start()
        out: list = []

        consumer = asyncio.create_task(drain(avatar, out, clock))
        await advance(avatar, clock, 1.0)
        for i in range(0, reply.shape[0], RATE // 50):
            avatar.push_audio(pcm_frame(reply[i : i + RATE // 50], RATE))
        avatar.end_of_segment()
        avatar._start_reply_early()  # the next tick's early start, before generation runs
        assert avatar.early_replies == 1
        finished = avatar.clear_buffer()
        await advance(avatar, clock, 1.0)
        consumer.cancel()
        await avatar.close()
        return out, finished

    out, finished = run(body(), 240)
    assert [f.interrupted for f in finished] == [True] and finished[0].position_ms == 0
    audio = [f for _, f in out if isinstance(f, AudioFrame)]
    assert not any(f.segment_id == 0 for f in audio)  # nothing of the reply was played
    played = np.concatenate([np.frombuffer(f.data, "<i2") for f in audio])
    assert np.abs(played).max() == 0  # silence throughout: the avatar stayed idle
