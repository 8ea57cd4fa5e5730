"""The mp4 file sink: H.264 + AAC, muxed as frames arrive, renamed into place when done.

Timestamps come from the driving audio's sample clock (``talkloop.pipeline.core.clock``): both streams use
the time base ``1 / sample_rate``, video frame ``j`` sits at ``info.frame_pts(j)`` and audio sample
``i`` at ``i``. Video pts are exact sample positions, so audio and video cannot drift apart.

The file is a fragmented mp4 (one fragment per keyframe, every 2 s) written under a hidden
temporary name next to the target. A process killed mid-render leaves that temporary file
playable up to its last complete fragment (a kill within the first fragment leaves no playable
data); ``close`` renames it onto ``path`` atomically, so a file at ``path`` is always complete,
and ``abort`` deletes it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from talkloop.pipeline.core.errors import ConfigError, InputError, SessionClosedError
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk

__all__ = ["Mp4Sink", "X264_PRESETS"]

X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
)

# frag_keyframe: cut a fragment at every keyframe, so a hard kill loses at most one GOP (plus the
# encoder's lookahead). default_base_moof: offsets relative to each moof (what MSE expects).
# AAC priming: the encoder emits 1024 samples of priming before sample 0 (first packet pts -1024).
# Only an edit list lets players drop it and still start both tracks at 0. FFmpeg's fragmented
# mode avoids edit lists by default and shifts every track by +1024 instead (video then starts
# late and the priming is played), and with empty_moov the moov is written before the first
# packet, too early to know the edit. delay_moov writes the moov with the first fragment, when
# the first timestamps are known, and use_editlist=1 forces the edit list.
# flush_packets=1: hand every finished fragment to the OS at once rather than when FFmpeg's 32 KB
# I/O buffer fills, or a killed process leaves nothing of a low-bitrate render on disk.
_MUX_OPTIONS = {
    "movflags": "frag_keyframe+delay_moov+default_base_moof",
    "use_editlist": "1",
    "flush_packets": "1",
}
_KEYFRAME_SECONDS = 2


class Mp4Sink:
    """Writes published frames and their audio to an mp4 file, incrementally.

    Args:
        path: the final file. Its directory must exist and be writable.
        crf: x264 constant rate factor, 0 (lossless) .. 51 (worst).
        preset: x264 speed preset, one of ``X264_PRESETS``.
        audio_bitrate: AAC bit rate in bit/s.

    Memory is bounded: each packet is muxed as soon as the encoder emits it, and at most one
    AAC frame (1024 samples) of audio waits between writes.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        crf: int = 23,
        preset: str = "veryfast",
        audio_bitrate: int = 96000,
    ) -> None:
        if not 0 <= crf <= 51:
            raise ConfigError(f"Mp4Sink crf must be in 0..51, got {crf}")
        if preset not in X264_PRESETS:
            raise ConfigError(f"Mp4Sink preset {preset!r} is not one of {', '.join(X264_PRESETS)}")
        if audio_bitrate <= 0:
            raise ConfigError(f"Mp4Sink audio_bitrate must be positive, got {audio_bitrate}")
        self.path = Path(path)
        self.crf = crf
        self.preset = preset
        self.audio_bitrate = audio_bitrate
        self.info: StreamInfo | None = None
        self.temp_path: Path | None = None
        self.frames_written = 0
        self.samples_written = 0
        self._container: av.container.OutputContainer | None = None
        self._video: av.VideoStream | None = None
        self._audio: av.AudioStream | None = None
        self._pending = np.zeros(0, dtype=np.float32)  # < aac frame_size samples, see _encode_audio
        self._audio_frame_size = 1024
        self._frames_muxed = 0
        self._audio_pts = 0  # samples handed to the AAC encoder (samples_written minus pending)
        self._done = False

    # -- Sink protocol -------------------------------------------------------------------------

    def open(self, info: StreamInfo) -> None:
        """Create the temporary file and set up both encoders.

        Raises:
            InputError: odd or non-positive frame size, or the output directory is missing or
                not writable.
        """
        if self._container is not None or self._done:
            raise SessionClosedError(f"Mp4Sink for {self.path} was already opened")
        if info.width <= 0 or info.height <= 0 or info.width % 2 or info.height % 2:
            raise InputError(
                f"mp4 frame size must be positive and even for yuv420p, got "
                f"{info.width}x{info.height} (crop or pad to even dimensions)"
            )
        if info.fps <= 0 or info.sample_rate <= 0:
            raise InputError(f"mp4 needs positive fps and sample rate, got {info}")
        directory = self.path.parent
        if not directory.is_dir():
            raise InputError(f"output directory does not exist: {directory} (for {self.path})")
        try:
            temp = _reserve_temp(self.path)
        except OSError as exc:
            raise InputError(
                f"cannot write to output directory {directory} (for {self.path}): "
                f"{exc.strerror or exc}"
            ) from exc
        self.temp_path = Path(temp)
        self.info = info
        try:
            self._setup(info)
        except BaseException:
            self._discard()
            raise

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        """Encode and mux one segment; frames and samples must continue where the last ended."""
        if self._container is None or self.info is None:
            raise SessionClosedError(f"Mp4Sink for {self.path} is not open")
        info = self.info
        frames = video.frames
        if len(video) and (frames.ndim != 4 or frames.shape[1:] != (info.height, info.width, 3)):
            raise ValueError(
                f"Mp4Sink expects frames (T, {info.height}, {info.width}, 3), got {frames.shape}"
            )
        if frames.dtype != np.uint8:
            raise ValueError(f"Mp4Sink expects uint8 RGB frames, got {frames.dtype}")
        if len(video) and video.first_index != self.frames_written:
            raise ValueError(
                f"Mp4Sink expected frame {self.frames_written} next, got {video.first_index}"
            )
        if len(audio) and audio.first_sample != self.samples_written:
            raise ValueError(
                f"Mp4Sink expected audio sample {self.samples_written} next, "
                f"got {audio.first_sample}"
            )
        for i in range(len(video)):
            self._encode_video(frames[i])
        if len(audio):
            self._encode_audio(np.asarray(audio.samples, dtype=np.float32).reshape(-1))
            self.samples_written += len(audio)

    def close(self) -> None:
        """Flush both encoders, finalise the file and rename it onto ``path``.

        With no frames written there is nothing to play: the temporary file is removed and no
        file is created at ``path``.
        """
        if self._container is None:
            return  # never opened, or already closed/aborted: nothing to finalise
        try:
            self._flush()
            self._container.close()
            self._container = None
            if self.frames_written == 0:
                self._discard()
                return
            assert self.temp_path is not None
            os.replace(self.temp_path, self.path)
            self.temp_path = None
        except BaseException:
            self._discard()
            raise
        finally:
            self._done = True

    def abort(self) -> None:
        """Stop without finalising and delete the temporary file; ``path`` is left untouched."""
        self._discard()
        self._done = True

    # -- internals -----------------------------------------------------------------------------

    def _setup(self, info: StreamInfo) -> None:
        assert self.temp_path is not None
        tb = Fraction(1, info.sample_rate)
        container = av.open(str(self.temp_path), mode="w", format="mp4", options=_MUX_OPTIONS)
        self._container = container
        v = container.add_stream(
            "libx264",
            rate=info.fps,
            options={
                "crf": str(self.crf),
                "preset": self.preset,
                # No B-frames: packets leave in display order with dts == pts, so the first
                # video packet is at 0 with no composition offset, and latency stays one frame.
                "bf": "0",
            },
        )
        v.width = info.width
        v.height = info.height
        v.pix_fmt = "yuv420p"
        v.time_base = tb
        v.codec_context.time_base = tb
        v.codec_context.gop_size = _KEYFRAME_SECONDS * info.fps
        a = container.add_stream("aac", rate=info.sample_rate, layout="mono")
        a.bit_rate = self.audio_bitrate
        a.time_base = tb
        a.codec_context.time_base = tb
        container.start_encoding()
        self._video, self._audio = v, a
        self._audio_frame_size = a.codec_context.frame_size or 1024

    def _encode_video(self, rgb: np.ndarray) -> None:
        assert self._video is not None and self._container is not None and self.info is not None
        j = self.frames_written
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame = frame.reformat(format="yuv420p")
        frame.pts = self.info.frame_pts(j)
        frame.time_base = self._video.codec_context.time_base
        self._mux_video(self._video.encode(frame))
        self.frames_written += 1

    def _mux_video(self, packets: list[av.Packet]) -> None:
        assert self._container is not None and self.info is not None
        for packet in packets:
            # Without B-frames packets leave in frame order. Durations differ by a sample when
            # sample_rate / fps is not an integer (16000 / 24); set each from the clock so the
            # track ends exactly at frame_pts(frames_written).
            j = self._frames_muxed
            packet.duration = self.info.frame_pts(j + 1) - self.info.frame_pts(j)
            self._container.mux(packet)
            self._frames_muxed += 1

    def _encode_audio(self, samples: np.ndarray) -> None:
        # The AAC encoder takes exactly frame_size samples per frame (except the last), so the
        # remainder waits here until the next write: at most frame_size - 1 samples.
        data = np.concatenate([self._pending, samples]) if self._pending.size else samples
        size = self._audio_frame_size
        full = (data.shape[0] // size) * size
        for start in range(0, full, size):
            self._send_audio(data[start : start + size])
        self._pending = data[full:].copy()

    def _send_audio(self, block: np.ndarray) -> None:
        assert self._audio is not None and self._container is not None
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(block, dtype=np.float32)[None, :], format="fltp", layout="mono"
        )
        frame.sample_rate = self._audio.codec_context.sample_rate
        frame.pts = self._audio_pts
        frame.time_base = self._audio.codec_context.time_base
        for packet in self._audio.encode(frame):
            self._container.mux(packet)
        self._audio_pts += block.shape[0]

    def _flush(self) -> None:
        assert self._video is not None and self._audio is not None
        assert self._container is not None
        if self._pending.size:
            self._send_audio(self._pending)  # a short last frame is allowed by the aac encoder
            self._pending = np.zeros(0, dtype=np.float32)
        self._mux_video(self._video.encode(None))
        for packet in self._audio.encode(None):
            self._container.mux(packet)

    def _discard(self) -> None:
        container, self._container = self._container, None
        if container is not None:
            # The file is deleted next, so an error finishing it (a full disk) is moot here.
            with contextlib.suppress(Exception):
                container.close()
        if self.temp_path is not None:
            self.temp_path.unlink(missing_ok=True)
            self.temp_path = None


def _reserve_temp(path: Path) -> Path:
    """Create an empty hidden file ``.<name>.partial-XXXXXXXX`` next to ``path``.

    Creating it (O_EXCL) both proves the directory is writable and reserves a unique name on the
    same filesystem, which ``os.replace`` needs to be atomic. Unlike ``tempfile.mkstemp`` (mode
    0600) the mode follows the umask, so the finished file has ordinary permissions.
    """
    for _ in range(100):
        temp = path.with_name(f".{path.name}.partial-{secrets.token_hex(4)}")
        try:
            fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return temp
    raise FileExistsError(f"no free temporary name next to {path}")
