"""The Pipecat adapter against the real pipecat-ai package, run with its own test utility
(``pipecat.tests.utils.run_test``: a real Pipeline and PipelineWorker around the processor)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pipecat.tests.utils", reason="pipecat-ai is not installed")
from pipecat.frames.frames import (  # noqa: E402
    InterruptionFrame,
    OutputImageRawFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.tests.utils import SleepFrame, run_test  # noqa: E402

from talkloop.agent.adapters.pipecat import TalkloopAvatarProcessor  # noqa: E402
from talkloop.agent.frames import PlaybackFinished  # noqa: E402
from talkloop.agent.session import AvatarConfig, AvatarSession  # noqa: E402

from support import make_reference, tone_pcm16  # noqa: E402

pytestmark = pytest.mark.e2e


def tts_frames(seconds: float, rate: int = 24000) -> list[TTSAudioRawFrame]:
    pcm = tone_pcm16(int(seconds * rate), rate, hz=220, amp=0.3)
    step = rate // 50
    return [
        TTSAudioRawFrame(audio=pcm[i : i + step].tobytes(), sample_rate=rate, num_channels=1)
        for i in range(0, pcm.shape[0], step)
    ]


def test_pipecat_processor_returns_images_and_retimed_audio_and_interrupts(live_pipeline) -> None:
    avatar = AvatarSession(
        live_pipeline, make_reference(), config=AvatarConfig(playout_delay_ms=300)
    )
    finished: list[PlaybackFinished] = []
    avatar.listeners.append(lambda e: finished.append(e) if isinstance(e, PlaybackFinished) else 0)
    frames = [
        TTSStartedFrame(),
        *tts_frames(0.6),
        TTSStoppedFrame(),
        SleepFrame(sleep=1.5),
        TTSStartedFrame(),
        *tts_frames(3.0),
        SleepFrame(sleep=1.0),
        InterruptionFrame(),
        SleepFrame(sleep=0.6),
    ]
    down, _ = asyncio.run(
        asyncio.wait_for(run_test(TalkloopAvatarProcessor(avatar), frames_to_send=frames), 120)
    )
    kinds = [type(f) for f in down]
    images = [f for f in down if isinstance(f, OutputImageRawFrame)]
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    # video: RGB images of the avatar, with increasing timestamps (paced by the session)
    assert len(images) > 25 and images[0].format == "RGB" and images[0].size == (64, 64)
    assert all(b.pts > a.pts for a, b in zip(images, images[1:], strict=False))
    # the TTS frames did not pass through: what comes out is the session's re-timed audio
    assert all(f.sample_rate == avatar.sample_rate for f in audio)
    assert not finished[0].interrupted and finished[0].position_ms == 600
    # cut short of its 3 s: where exactly depends on how fast this machine ran the 1 s sleep's
    # worth of pipeline; the accounting below is exact whatever it was
    assert finished[1].interrupted and 0 <= finished[1].position_s < 3.0
    out_s = sum(len(f.audio) // 2 for f in audio) / avatar.sample_rate
    assert out_s == pytest.approx(0.6 + finished[1].position_s, abs=0.021)
    # nothing of the interrupted segment comes after the interruption
    cut = kinds.index(InterruptionFrame)
    assert TTSAudioRawFrame not in kinds[cut + 1 :]
    assert OutputImageRawFrame in kinds[cut + 1 :]  # the video goes on (idle)
    assert avatar.closed  # EndFrame closed the session
