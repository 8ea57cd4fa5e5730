"""The LiveKit adapter against the real livekit-agents package: its agent-side QueueAudioOutput
sends TTS, its AvatarRunner drives our VideoGenerator and reports playback back to the agent.

AvatarRunner publishes into a LiveKit room; no LiveKit server runs here, so the room is the one
stand-in (it says "connected" and publishing is skipped). Everything else is LiveKit's own code:
AudioFrame, AudioSegmentEnd, AVSynchronizer, the native AudioSource and VideoSource.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

lk = pytest.importorskip("livekit.agents.voice.avatar", reason="livekit-agents is not installed")
from livekit import rtc  # noqa: E402

from talkloop.agent.adapters.livekit import TalkloopVideoGenerator, avatar_options  # noqa: E402
from talkloop.agent.frames import PlaybackFinished  # noqa: E402
from talkloop.agent.session import AvatarConfig, AvatarSession  # noqa: E402

from support import make_reference, tone_pcm16  # noqa: E402

pytestmark = pytest.mark.e2e


class _Room:
    """Stands in for a connected rtc.Room (no LiveKit server here)."""

    def on(self, *args) -> None: ...

    def off(self, *args) -> None: ...

    def isconnected(self) -> bool:
        return True


class _Runner(lk.AvatarRunner):
    """LiveKit's AvatarRunner, minus publishing tracks into a room; records what it pushes."""

    pushed: list

    async def _publish_track(self) -> None:
        self._video_publication = object()  # type: ignore[assignment]


async def speak(output, pcm: np.ndarray, rate: int) -> None:
    step = rate // 50
    for i in range(0, pcm.shape[0], step):
        chunk = pcm[i : i + step]
        await output.capture_frame(rtc.AudioFrame(chunk.tobytes(), rate, 1, chunk.shape[0]))


def test_livekit_runner_plays_segments_and_interrupts(live_pipeline) -> None:
    async def body():
        avatar = AvatarSession(
            live_pipeline, make_reference(), config=AvatarConfig(playout_delay_ms=300)
        )
        avatar.start()
        ours: list[PlaybackFinished] = []
        avatar.listeners.append(lambda e: ours.append(e) if isinstance(e, PlaybackFinished) else 0)
        output = lk.QueueAudioOutput(sample_rate=24000)
        finished: list = []
        output.on("playback_finished", finished.append)
        runner = _Runner(
            _Room(),
            audio_recv=output,
            video_gen=TalkloopVideoGenerator(avatar),
            options=avatar_options(avatar),
        )
        pushed: list = []
        real_push = runner.av_sync.push

        async def record(frame, *a, **kw):
            pushed.append(type(frame).__name__)
            return await real_push(frame, *a, **kw)

        runner.av_sync.push = record  # type: ignore[method-assign]
        await runner.start()
        short = tone_pcm16(14400, 24000, hz=220, amp=0.3)  # 0.6 s
        await speak(output, short, 24000)  # faster than real time
        output.flush()
        for _ in range(100):
            if finished:
                break
            await asyncio.sleep(0.05)
        await speak(output, tone_pcm16(72000, 24000, hz=220, amp=0.3), 24000)  # 3 s
        output.flush()
        await asyncio.sleep(1.0)
        output.clear_buffer()  # the agent was interrupted
        for _ in range(100):
            if len(finished) == 2:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        frames_after = pushed.count("AudioFrame")
        await asyncio.sleep(0.3)
        frames_later = pushed.count("AudioFrame")
        await runner.aclose()
        await avatar.close()
        return finished, ours, pushed, frames_after, frames_later

    finished, ours, pushed, frames_after, frames_later = asyncio.run(asyncio.wait_for(body(), 120))
    assert len(finished) == 2
    first, second = finished
    assert not first.interrupted and first.playback_position == pytest.approx(0.6, abs=0.021)
    # cut short of its 3 s (where exactly is this machine's speed; the next check is exact)
    assert second.interrupted and 0 <= second.playback_position < 3.0
    # what LiveKit counted as forwarded is what our session says it emitted (within a frame)
    assert ours[1].interrupted
    assert abs(second.playback_position - ours[1].position_s) <= 1 / 25
    assert "VideoFrame" in pushed and "AudioFrame" in pushed
    assert frames_later == frames_after  # nothing of the interrupted segment after the clear
