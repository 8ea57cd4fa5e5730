"""Full-band audio out of an AvatarSession: the output runs at 48 kHz whatever the source's rate,
the model still reads 16 kHz, and both stay on one clock; mirrors get the full-band audio too."""

from __future__ import annotations

import asyncio

import av
import numpy as np
import pytest

from talkloop.agent.clock import ManualClock
from talkloop.agent.frames import AudioFrame, VideoFrame
from talkloop.agent.session import AvatarConfig, AvatarSession
from talkloop.pipeline.outputs.mp4 import Mp4Sink

from support import advance, band_share, drain, loudest_second, make_reference, tone

pytestmark = pytest.mark.unit

OUT = 48000


def speak(pipeline, source: np.ndarray, rate: int, seconds: float, mirrors=(), tap=None):
    """Push ``source`` (at ``rate``) as one segment; return (avatar, emitted items, model feed)."""

    async def body():
        clock = ManualClock()
        avatar = AvatarSession(
            pipeline,
            make_reference(),
            config=AvatarConfig(playout_delay_ms=400),
            clock=clock,
            mirrors=mirrors,
        )
        fed: list[np.ndarray] = []
        push = avatar.driver.push

        def record(block: np.ndarray) -> None:  # what the model reads
            fed.append(block.copy())
            push(block)

        avatar.driver.push = record
        avatar.start()
        out: list = []
        consumer = asyncio.create_task(drain(avatar, out))
        step = rate // 50
        for i in range(0, source.shape[0], step):
            avatar.push_audio(AudioFrame.from_float(source[i : i + step], rate))
        avatar.end_of_segment()
        await advance(avatar, clock, seconds)
        consumer.cancel()
        await avatar.close()
        return avatar, out, np.concatenate(fed)

    return asyncio.run(asyncio.wait_for(body(), 240))


def output_audio(out: list) -> np.ndarray:
    frames = [f for f in out if isinstance(f, AudioFrame)]
    assert [f.pts for f in frames] == [960 * k for k in range(len(frames))]  # contiguous
    return np.concatenate([f.to_mono_float() for f in frames])


def test_a_12khz_tone_at_48khz_leaves_with_its_energy(live_pipeline) -> None:
    avatar, out, fed = speak(live_pipeline, tone(OUT, OUT, hz=12000, amp=0.3), OUT, 1.8)
    audio = output_audio(out)
    assert avatar.sample_rate == OUT
    assert all(f.sample_rate == OUT for f in out if isinstance(f, AudioFrame))
    heard = loudest_second(audio, OUT)
    assert np.sqrt(np.mean(heard**2)) > 0.2  # the tone's level (0.3 peak: 0.21 rms)
    assert band_share(heard, OUT, 11900, 12100) > 0.99  # all of it at 12 kHz
    # the model still reads 16 kHz, where 12 kHz does not exist: it gets (almost) silence
    assert avatar.model_rate == 16000
    assert np.sqrt(np.mean(fed**2)) < 0.01


@pytest.mark.parametrize("rate", [48000, 24000])
def test_sound_and_lips_stay_on_one_clock(live_pipeline, rate) -> None:
    """The sound that plays at a media time is the sound the model made that time's frame from:
    a tone burst's onset sits at the same media time in the output (48 kHz) and in what the
    model read (16 kHz), and every frame's pts points at that one timeline."""
    burst = np.concatenate(
        [np.zeros(rate // 2, np.float32), tone(rate // 2, rate, hz=1000, amp=0.5)]
    )
    avatar, out, fed = speak(live_pipeline, burst, rate, 1.8)
    audio = output_audio(out)
    heard_s = int(np.argmax(np.abs(audio) > 0.1)) / OUT
    modelled_s = int(np.argmax(np.abs(fed) > 0.1)) / avatar.model_rate
    assert heard_s > 0.5  # the burst came after block 0 and the half second of silence
    assert abs(heard_s - modelled_s) <= 0.001  # within the resampler's filter: 1 ms
    video = [f for f in out if isinstance(f, VideoFrame)]
    info = live_pipeline.info
    assert video and all(f.pts * info.sample_rate == info.frame_pts(f.index) * OUT for f in video)


def test_a_mirror_records_the_full_band_audio_in_sync(live_pipeline, tmp_path) -> None:
    path = tmp_path / "mirror.mp4"
    speech = tone(24000, 24000, hz=10000, amp=0.3)
    speak(live_pipeline, speech, 24000, 1.8, mirrors=[Mp4Sink(path)])
    with av.open(str(path)) as c:
        a, v = c.streams.audio[0], c.streams.video[0]
        rate = a.codec_context.sample_rate
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(v)]
        c.seek(0)
        audio = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(a)])
    assert rate == OUT
    heard = loudest_second(audio, OUT)
    assert band_share(heard, OUT, 9900, 10100) > 0.9  # AAC kept the 10 kHz tone
    # one clock: the mirror's audio covers its video (within one AAC frame and the encoder's
    # priming), as the pipeline published them together
    video_s, audio_s = len(frames) / live_pipeline.info.fps, audio.shape[0] / OUT
    assert abs(audio_s - video_s) < 0.05
