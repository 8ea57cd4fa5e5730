"""LiveKit Agents: the avatar as a ``VideoGenerator`` for ``AvatarRunner`` (extra ``livekit``).

LiveKit's avatar worker reads the agent's TTS (``rtc.AudioFrame`` and ``AudioSegmentEnd``) from
an ``AudioReceiver``, pushes it into a ``VideoGenerator``, and publishes what the generator yields
through an ``AVSynchronizer``. ``AvatarRunner`` counts the audio frames it forwarded as the
playback position and reports it on ``AudioSegmentEnd`` (finished) or on ``clear_buffer``
(interrupted), so this generator yields only the agent's own audio (no idle silence) and yields
``AudioSegmentEnd`` right after a segment's last audio frame.

    avatar = AvatarSession(pipeline, reference); avatar.start()
    runner = AvatarRunner(room, audio_recv=DataStreamAudioReceiver(room),
                          video_gen=TalkloopVideoGenerator(avatar), options=avatar_options(avatar))
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from livekit import rtc
from livekit.agents.voice.avatar import AudioSegmentEnd, AvatarOptions, VideoGenerator

from talkloop.agent.frames import AudioFrame, PlaybackFinished, VideoFrame
from talkloop.agent.session import AvatarSession

SOURCE = "livekit"


def avatar_options(avatar: AvatarSession) -> AvatarOptions:
    """``AvatarOptions`` matching the session's video size, fps and audio rate."""
    info = avatar.info
    return AvatarOptions(
        video_width=info.width,
        video_height=info.height,
        video_fps=info.fps,
        audio_sample_rate=avatar.sample_rate,
        audio_channels=1,
    )


class TalkloopVideoGenerator(VideoGenerator):
    """A talkloop ``AvatarSession`` behind LiveKit's ``VideoGenerator`` interface.

    Args:
        avatar: a started session; its output must be consumed only through this generator.
    """

    def __init__(self, avatar: AvatarSession) -> None:
        self.avatar = avatar

    async def push_audio(self, frame: rtc.AudioFrame | AudioSegmentEnd) -> None:
        """Queue agent audio (any rate, mono or stereo) or end the segment.

        Waits while the session's speech queue is full (backpressure to the receiver).
        """
        if isinstance(frame, AudioSegmentEnd):
            self.avatar.end_of_segment(SOURCE)
            return
        ours = AudioFrame(bytes(frame.data), frame.sample_rate, frame.num_channels)
        await self.avatar.wait_for_room(ours.duration_s)
        self.avatar.push_audio(ours, source=SOURCE)

    def clear_buffer(self) -> None:
        """Interrupt: nothing of the queued speech is yielded after this returns."""
        self.avatar.clear_buffer()

    def __aiter__(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        async for item in self.avatar:
            if isinstance(item, VideoFrame):
                h, w = item.rgb.shape[:2]
                yield rtc.VideoFrame(w, h, rtc.VideoBufferType.RGB24, item.rgb.tobytes())
            elif isinstance(item, AudioFrame):
                if item.segment_id is not None:  # idle silence would count as played speech
                    yield rtc.AudioFrame(item.data, item.sample_rate, 1, item.samples_per_channel)
            elif isinstance(item, PlaybackFinished) and not item.interrupted:
                yield AudioSegmentEnd()
