"""Voice-agent integration: the avatar session API, the agent protocol, adapters, built-in TTS."""

from talkloop.agent.clock import ManualClock, RealClock
from talkloop.agent.frames import (
    AudioFormatError,
    AudioFrame,
    PlaybackEvent,
    PlaybackFinished,
    PlaybackStarted,
    VideoFrame,
)
from talkloop.agent.session import AvatarConfig, AvatarSession

__all__ = [
    "AudioFormatError",
    "AudioFrame",
    "AvatarConfig",
    "AvatarSession",
    "ManualClock",
    "PlaybackEvent",
    "PlaybackFinished",
    "PlaybackStarted",
    "RealClock",
    "VideoFrame",
]
