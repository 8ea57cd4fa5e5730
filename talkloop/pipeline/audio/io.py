"""Audio files in and out: decode any common file to float32 mono, write WAV.

Everything the pipeline consumes is float32 mono in ``[-1, 1]`` at the model's sample rate.
Decoding goes through PyAV (FFmpeg), so wav, flac, mp3, ogg/opus, m4a/aac and the audio track of
a video file all take the same path.
"""

from __future__ import annotations

import os
import wave
from pathlib import Path

import av
import av.error
import numpy as np

from talkloop.pipeline.audio.pcm import float_to_pcm16, pcm16_to_float
from talkloop.pipeline.audio.resample import StreamResampler, resample
from talkloop.pipeline.core.errors import InputError

__all__ = [
    "check_audio_file",
    "load_audio",
    "resample",
    "pcm16_to_float",
    "float_to_pcm16",
    "write_wav",
]

# Decoders may report rates and durations a little off (VBR mp3 without a Xing header); the
# preallocated buffer is grown if the estimate was short, so this only trims reallocations.
_ESTIMATE_SLACK = 1.02


def load_audio(path: str | os.PathLike[str], sample_rate: int) -> np.ndarray:
    """Decode the first audio stream of ``path`` to float32 mono at ``sample_rate``.

    Channels are averaged (equal weights). FFmpeg's own mono downmix sums channels at -3 dB each,
    which pushes a full-scale stereo file to +3 dB and clips it; the mean never leaves [-1, 1].

    Args:
        path: an audio file or a video file with an audio track.
        sample_rate: the rate to resample to, in Hz.

    Returns:
        ``(n,)`` float32 samples in ``[-1, 1]``, ``n > 0``.

    Raises:
        InputError: the file is missing, a directory, not audio, corrupt, or holds no samples.
    """
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    p, container = _open_audio(path)
    with container:
        stream = container.streams.audio[0]
        try:
            samples = _decode_mono(container, stream, sample_rate, _estimate(container, stream))
        except av.error.FFmpegError as exc:
            raise InputError(f"corrupt audio data in {p}: {_reason(exc)}") from exc
    if samples.shape[0] == 0:
        raise InputError(f"audio stream in {p} decodes to zero samples (empty or corrupt)")
    return samples


def check_audio_file(path: str | os.PathLike[str]) -> Path:
    """What :func:`load_audio` checks, cheaply: the file is there, readable and audio, and its
    first packets decode to samples. Milliseconds whatever the file's length, so callers run it
    before loading any model; ``load_audio`` still decodes (and checks) the whole stream.

    Raises:
        InputError: as :func:`load_audio`.
    """
    p, container = _open_audio(path)
    with container:
        stream = container.streams.audio[0]
        try:
            for frame in container.decode(stream):
                if frame.samples:
                    return p
        except av.error.FFmpegError as exc:
            raise InputError(f"corrupt audio data in {p}: {_reason(exc)}") from exc
    raise InputError(f"audio stream in {p} decodes to zero samples (empty or corrupt)")


def _open_audio(path: str | os.PathLike[str]) -> tuple[Path, av.container.InputContainer]:
    """``path`` opened, with at least one audio stream; the caller closes the container."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"audio file not found: {p} (check the path)")
    if p.is_dir():
        raise InputError(f"audio path is a directory, not a file: {p}")
    if p.stat().st_size == 0:
        raise InputError(f"audio file is empty (0 bytes): {p}")
    if not os.access(p, os.R_OK):
        raise InputError(f"cannot read audio file {p}: permission denied")
    try:
        container = av.open(str(p), mode="r")
    except av.error.FFmpegError as exc:
        raise InputError(
            f"not a readable audio or video file: {p} ({_reason(exc)}); "
            "use wav, flac, mp3, ogg, m4a or a video with an audio track"
        ) from exc
    except OSError as exc:
        raise InputError(f"cannot read audio file {p}: {exc.strerror or exc}") from exc
    if not container.streams.audio:
        kinds = ", ".join(sorted({s.type for s in container.streams})) or "no streams"
        container.close()
        raise InputError(f"no audio stream in {p} (it contains: {kinds})")
    return p, container


def _reason(exc: BaseException) -> str:
    # FFmpegError's str() repeats the file name; strerror is the short cause.
    return getattr(exc, "strerror", None) or str(exc)


def _estimate(container: av.container.InputContainer, stream: av.AudioStream) -> float:
    """Best guess of the duration in seconds (0 when the container does not say)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return 0.0


def _decode_mono(
    container: av.container.InputContainer,
    stream: av.AudioStream,
    sample_rate: int,
    est_seconds: float,
) -> np.ndarray:
    # One growable buffer instead of a list of chunks plus a final concatenate: the peak is the
    # decoded audio itself, not twice it (an hour at 16 kHz is 230 MB of float32).
    buf = np.empty(int(est_seconds * sample_rate * _ESTIMATE_SLACK) + 4096, dtype=np.float32)
    n = 0
    # Follows format changes mid-stream (chained ogg, HE-AAC switching) and averages channels.
    resampler = StreamResampler(sample_rate)

    def append(mono: np.ndarray) -> None:
        nonlocal buf, n
        if n + mono.shape[0] > buf.shape[0]:
            buf.resize(max(n + mono.shape[0], int(buf.shape[0] * 1.5)), refcheck=False)
        buf[n : n + mono.shape[0]] = mono
        n += mono.shape[0]

    for frame in container.decode(stream):
        append(resampler.push_frame(frame))
    append(resampler.flush())
    buf.resize(n, refcheck=False)  # realloc shrink, usually in place
    np.clip(buf, -1.0, 1.0, out=buf)  # lossy decoders overshoot full scale slightly
    return buf


def write_wav(path: str | os.PathLike[str], samples: np.ndarray, sample_rate: int) -> None:
    """Write float samples as a PCM16 WAV file.

    Args:
        path: output file.
        samples: ``(n,)`` mono or ``(n, channels)`` float in ``[-1, 1]`` (clipped).
        sample_rate: in Hz.
    """
    x = np.asarray(samples)
    channels = 1 if x.ndim == 1 else int(x.shape[1])
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(float_to_pcm16(x).astype("<i2").tobytes())
