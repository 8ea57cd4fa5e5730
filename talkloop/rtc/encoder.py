"""The H.264 encoder of our calls: aiortc's, with x264 set for a small picture on a busy CPU.

aiortc opens libx264 at its default preset (``medium``) with as many threads as x264 likes. For
a 256x256 talking head that spends CPU the avatar's generation needs on the same cores; at
``veryfast`` on one thread x264 takes a fraction of that CPU for the same picture quality and a
few more bits (docs/benchmarks.md, "Figures behind code choices"). aiortc has no setting for
this, so :func:`install` makes its senders build this encoder for H.264; everything else
(bitrate control from the browser's feedback, keyframe requests, packetisation, the VP8
fallback) stays aiortc's.
"""

from __future__ import annotations

import fractions
from collections.abc import Iterator

import av
from aiortc import rtcrtpsender
from aiortc.codecs import get_encoder
from aiortc.codecs.base import Encoder
from aiortc.codecs.h264 import MAX_FRAME_RATE, H264Encoder
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

X264_PRESET = "veryfast"
X264_THREADS = 1


class AvatarH264Encoder(H264Encoder):
    """aiortc's H.264 encoder with its libx264 opened at ``X264_PRESET`` on ``X264_THREADS``
    thread(s). Same profile, level, tuning and bitrate as aiortc's own."""

    def _encode_frame(self, frame: av.VideoFrame, force_keyframe: bool) -> Iterator[bytes]:
        if self.codec is None or self._stale(frame):
            self.buffer_data, self.buffer_pts = b"", None
            self.codec = self._open(frame)
        # aiortc's encode now finds a codec that fits the frame and bitrate and keeps it.
        yield from super()._encode_frame(frame, force_keyframe)

    def _stale(self, frame: av.VideoFrame) -> bool:
        """aiortc's test for reopening: another frame size, or the target bitrate moved > 10 %."""
        codec = self.codec
        assert codec is not None
        return (
            frame.width != codec.width
            or frame.height != codec.height
            or abs(self.target_bitrate - codec.bit_rate) / codec.bit_rate > 0.1
        )

    def _open(self, frame: av.VideoFrame) -> av.VideoCodecContext:
        codec = av.CodecContext.create("libx264", "w")
        codec.width, codec.height = frame.width, frame.height
        codec.bit_rate = self.target_bitrate
        codec.pix_fmt = "yuv420p"
        codec.framerate = fractions.Fraction(MAX_FRAME_RATE, 1)
        codec.time_base = fractions.Fraction(1, MAX_FRAME_RATE)
        codec.options = {"level": "31", "tune": "zerolatency", "preset": X264_PRESET}
        codec.profile = "Baseline"
        codec.thread_count = X264_THREADS
        return codec


def avatar_encoder(codec: RTCRtpCodecParameters) -> Encoder:
    """aiortc's ``get_encoder``, but :class:`AvatarH264Encoder` for H.264."""
    if codec.mimeType.lower() == "video/h264":
        return AvatarH264Encoder()
    return get_encoder(codec)


def install() -> None:
    """Make aiortc's senders in this process build their encoders with :func:`avatar_encoder`
    (they look ``get_encoder`` up in their module when a track sends its first frame)."""
    rtcrtpsender.get_encoder = avatar_encoder
