"""Voice-agent integration: the avatar session API, the agent protocol, adapters, built-in TTS."""

from agent.clock import ManualClock, RealClock
from agent.frames import (
    AudioFormatError,
    AudioFrame,
    PlaybackEvent,
    PlaybackFinished,
    PlaybackStarted,
    VideoFrame,
)
from agent.session import AvatarConfig, AvatarSession

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
