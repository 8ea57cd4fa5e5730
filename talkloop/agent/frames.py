"""The records an avatar session takes and gives: audio frames, video frames, playback events.

Hot-path data, so plain dataclasses. Audio is PCM16 little-endian, interleaved when stereo: the
format every voice-agent framework already speaks (LiveKit ``rtc.AudioFrame``, Pipecat
``AudioRawFrame``, OpenAI Realtime ``audio/pcm``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from talkloop.pipeline.audio.pcm import float_to_pcm16, pcm16_to_float
from talkloop.pipeline.core.errors import InputError

# The rates voice stacks produce (telephony to broadcast quality); anything else is most likely a mistake
# in the declaration (bytes per second, kHz instead of Hz), so it is rejected with that hint.
SUPPORTED_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


class AudioFormatError(InputError):
    """Audio whose declared format does not fit its bytes (rate, channels, length)."""

    session_fatal = False


@dataclass
class AudioFrame:
    """A chunk of PCM16 audio.

    Attributes:
        data: little-endian int16 samples, channels interleaved.
        sample_rate: Hz, one of ``SUPPORTED_RATES``.
        num_channels: 1 or 2.
        pts: output only: the first sample's index on the session's media clock (at the
            session's output rate, ``sample_rate``); None on input.
        segment_id: output only: the speech segment this audio belongs to (None for idle
            silence or microphone audio).
    """

    data: bytes
    sample_rate: int
    num_channels: int = 1
    pts: int | None = None
    segment_id: int | None = None

    @property
    def samples_per_channel(self) -> int:
        return len(self.data) // (2 * max(1, self.num_channels))

    @property
    def duration_s(self) -> float:
        return self.samples_per_channel / self.sample_rate

    def check(self) -> None:
        """Raise AudioFormatError naming what is wrong with the declaration or the bytes."""
        if not isinstance(self.sample_rate, int) or self.sample_rate not in SUPPORTED_RATES:
            raise AudioFormatError(
                f"unsupported sample_rate {self.sample_rate!r}: declare the PCM rate in Hz, "
                f"one of {', '.join(map(str, SUPPORTED_RATES))}"
            )
        if self.num_channels not in (1, 2):
            raise AudioFormatError(
                f"unsupported num_channels {self.num_channels!r}: send mono (1) or stereo (2)"
            )
        if len(self.data) % (2 * self.num_channels):
            raise AudioFormatError(
                f"audio of {len(self.data)} bytes is not a whole number of "
                f"{self.num_channels}-channel PCM16 samples ({2 * self.num_channels} bytes each)"
            )

    def to_mono_float(self) -> np.ndarray:
        """Float32 mono in [-1, 1): channels averaged (the mean never clips)."""
        pcm = pcm16_to_float(self.data)
        if self.num_channels == 2:
            pcm = pcm.reshape(-1, 2).mean(axis=1, dtype=np.float32)
        return pcm

    @classmethod
    def from_float(
        cls, samples: np.ndarray, sample_rate: int, pts: int | None = None, segment_id=None
    ) -> AudioFrame:
        """Mono float samples to a PCM16 frame (clipped, rounded)."""
        data = float_to_pcm16(samples).astype("<i2").tobytes()
        return cls(data, sample_rate, 1, pts, segment_id)


@dataclass
class VideoFrame:
    """One output video frame.

    Attributes:
        rgb: (H, W, 3) uint8.
        index: the frame number on the session's timeline (frame ``j`` shows the audio samples
            ``[pts, pts of j + 1)``).
        pts: the first sample of the frame's audio interval, at the session's output rate.
        sample_rate: the rate ``pts`` counts in (the session's output rate, as for audio).
        held: True when this is a repeat of the previous frame (the frame for ``index`` was not
            ready in time, or was made from audio that was interrupted before it played).
    """

    rgb: np.ndarray
    index: int
    pts: int
    sample_rate: int
    held: bool = False

    @property
    def timestamp_s(self) -> float:
        return self.pts / self.sample_rate


@dataclass
class PlaybackStarted:
    """The first sample of a segment was emitted."""

    segment_id: int
    label: str | None = None


@dataclass
class PlaybackFinished:
    """A segment ended: all of it played, or ``interrupted`` after ``position_s`` of it.

    ``position_s`` counts the segment's own samples that were emitted (silence the session put in
    because audio arrived late is not counted), so an agent can truncate its transcript there
    (OpenAI Realtime ``conversation.item.truncate`` with ``audio_end_ms = position_ms``).
    """

    segment_id: int
    position_s: float
    interrupted: bool
    label: str | None = None

    @property
    def position_ms(self) -> int:
        # Floor: OpenAI rejects an audio_end_ms beyond what the item holds.
        return int(self.position_s * 1000 + 1e-6)


PlaybackEvent = PlaybackStarted | PlaybackFinished
