"""Pipecat: the avatar as a frame processor (extra ``pipecat``).

Place it after the TTS service. TTS audio frames are taken out of the pipeline and become the
avatar's speech; the processor pushes downstream, paced in real time, ``OutputImageRawFrame``s
(the avatar's video) and ``TTSAudioRawFrame``s (the same speech, re-timed to line up with the
video), for any output transport with ``video_out_enabled``. ``TTSStoppedFrame`` ends a segment;
``InterruptionFrame`` (and ``UserStartedSpeakingFrame``) clears all unplayed speech at once.

    avatar = AvatarSession(pipeline, reference)
    Pipeline([transport.input(), stt, llm, tts, TalkloopAvatarProcessor(avatar), transport.output()])
"""

from __future__ import annotations

import asyncio

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    OutputImageRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from talkloop.agent.frames import AudioFrame, VideoFrame
from talkloop.agent.session import AvatarSession

SOURCE = "pipecat"


class TalkloopAvatarProcessor(FrameProcessor):
    """A talkloop ``AvatarSession`` as a Pipecat processor (see the module docstring).

    Args:
        avatar: a session, started with the pipeline (``StartFrame``) and closed with it.
        idle_audio: also push the silence between segments (a continuous audio track).
    """

    def __init__(self, avatar: AvatarSession, idle_audio: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.avatar = avatar
        self.idle_audio = idle_audio
        self._output: asyncio.Task | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            await self.push_frame(frame, direction)
            self.avatar.start()
            self._output = self.create_task(self._push_output())
        elif isinstance(frame, TTSAudioRawFrame) and direction == FrameDirection.DOWNSTREAM:
            audio = AudioFrame(bytes(frame.audio), frame.sample_rate, frame.num_channels)
            await self.avatar.wait_for_room(audio.duration_s)  # backpressure on the TTS
            self.avatar.push_audio(audio, label=frame.context_id, source=SOURCE)
        elif isinstance(frame, TTSStoppedFrame):
            self.avatar.end_of_segment(SOURCE)
            await self.push_frame(frame, direction)
        elif isinstance(frame, InterruptionFrame | UserStartedSpeakingFrame):
            self.avatar.clear_buffer()
            await self.push_frame(frame, direction)
        elif isinstance(frame, EndFrame | CancelFrame):
            await self._stop()
            await self.push_frame(frame, direction)
        else:
            await self.push_frame(frame, direction)

    async def cleanup(self) -> None:
        await super().cleanup()
        await self._stop()

    async def _stop(self) -> None:
        if self._output is not None:
            await self.cancel_task(self._output)
            self._output = None
        await self.avatar.close()

    async def _push_output(self) -> None:
        async for item in self.avatar:
            if isinstance(item, VideoFrame):
                h, w = item.rgb.shape[:2]
                image = OutputImageRawFrame(image=item.rgb.tobytes(), size=(w, h), format="RGB")
                image.pts = int(item.timestamp_s * 1e9)
                await self.push_frame(image)
            elif isinstance(item, AudioFrame) and (item.segment_id is not None or self.idle_audio):
                audio = TTSAudioRawFrame(
                    audio=item.data, sample_rate=item.sample_rate, num_channels=1
                )
                audio.pts = int(item.pts / item.sample_rate * 1e9)
                await self.push_frame(audio)
