"""The H.264 encoder of our calls: aiortc's, with x264 set for a small picture on a busy CPU.

aiortc opens libx264 at its default preset (``medium``) with as many threads as x264 likes. For
a 256x256 talking head that spends CPU the avatar's generation needs on the same cores; at
``superfast`` on one thread x264 takes a fraction of that CPU for the same picture quality and a
few more bits (docs/benchmarks.md, "Figures behind code choices"). :func:`use_avatar_encoder`
makes one sender (our peers' video senders, ``talkloop/rtc/peer.py``) build this encoder for
H.264, its bitrate held to ``MAX_BITS_PER_PIXEL`` of the picture and reopened only for a move
past ``REOPEN_BAND``; everything else (the bitrate
below that from the browser's feedback, keyframe requests, packetisation, the VP8 fallback) stays
aiortc's, and every other sender in the process (another library's, a test's client) keeps
aiortc's own encoder.

Why a sender's class is swapped: aiortc (1.16) has no per-sender or per-connection encoder.
``RTCRtpSender(trackOrKind, transport)`` takes none, ``RTCPeerConnection`` builds its senders
itself (``__createTransceiver``) and takes no factory, and the sender makes its encoder in
``_next_encoded_frame`` by calling the module-level ``rtcrtpsender.get_encoder(codec)`` the first
time it encodes a frame (again after ``_run_rtp`` has ended and dropped it). Replacing that
function would change every sender of the process. Instead our own sender's class becomes
:class:`AvatarRtpSender`, whose ``_next_encoded_frame`` puts our encoder into the sender's
encoder slot just before aiortc would have filled it; the slot is the name-mangled private
``_RTCRtpSender__encoder``, checked on each sender we take over, so an aiortc that keeps its
encoder elsewhere fails loudly there rather than sending with its default x264 settings.
"""

from __future__ import annotations

import fractions
from collections.abc import Iterator

import av
import cv2
import numpy as np
from aiortc.codecs import get_encoder
from aiortc.codecs.base import Encoder
from aiortc.codecs.h264 import MAX_BITRATE, MAX_FRAME_RATE, MIN_BITRATE, H264Encoder
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from aiortc.rtcrtpsender import RTCEncodedFrame, RTCRtpSender

X264_PRESET = "superfast"
X264_THREADS = 1
# The most bits a second the encoder spends per pixel of the picture: 1.18 Mbit/s at 512x512. The
# browser's bandwidth estimate climbs to aiortc's 3 Mbit/s within a minute, reopening x264 (a
# keyframe each time) at every 10 % step, for a picture that changes little: the RTP packets
# tripled, and with them the server's and the receiver's per-packet work (docs/benchmarks.md,
# "Figures behind code choices"). A lower estimate is followed as before.
MAX_BITS_PER_PIXEL = 4.5
# How far the receiver's estimate may move from the bitrate x264 was opened at before it is
# reopened (a new stream: an IDR picture of 20-30 P pictures' bits, and a rate control that starts
# afresh, its first frames visibly blurred: 6 dB down at 512x512). aiortc
# reopens at 10 %; a receiver's estimate climbs about 8 % a second and falls 15 % a step, so each
# call reopened five times in its first 15 s (1.0, 0.8, 0.92, 1.03, 1.16 Mbit/s at 512x512), every
# call of a server at the same moments. Within 25 % the stream goes on; a congested link's second
# 15 % step reopens it (docs/benchmarks.md, "Figures behind code choices").
REOPEN_BAND = 0.25
ENCODER_SLOT = "_RTCRtpSender__encoder"  # RTCRtpSender's private self.__encoder
# OpenCV's YCrCb of a float picture: chroma = 0.5 + the BT.601 full-range difference. Limited
# range (what swscale gives x264) = 128 + 224 / 255 of that difference, rounded once.
_CHROMA_SCALE = 224 / 255
_CHROMA_OFFSET = 128 - 0.5 * _CHROMA_SCALE


def rgb_to_i420(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 RGB, H and W even -> (H * 3 / 2, W) uint8 I420, BT.601 limited range.

    The picture x264 would get from swscale (luma within 1, chroma the mean of each 2x2 block
    within a few levels) for a fraction of swscale's time: OpenCV's luma, and chroma from the
    frame shrunk by area (OpenCV's own I420 takes one pixel of four), converted by OpenCV's
    YCrCb in float and scaled to limited range in one rounding step (a 3x2 ``cv2.transform``
    gave the same within 1 level for half again the time: docs/benchmarks.md, "Figures behind
    code choices")."""
    h, w = rgb.shape[:2]
    yuv = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)
    small = cv2.resize(rgb, (w // 2, h // 2), interpolation=cv2.INTER_AREA).astype(np.float32)
    ycrcb = cv2.convertScaleAbs(
        cv2.cvtColor(small, cv2.COLOR_RGB2YCrCb), alpha=_CHROMA_SCALE, beta=_CHROMA_OFFSET
    )
    planes = yuv.reshape(-1)[h * w :]  # U then V, (h / 2) * (w / 2) each: rows of w may split
    quarter = planes.size // 2
    planes[:quarter] = ycrcb[..., 2].reshape(-1)  # U: Cb
    planes[quarter:] = ycrcb[..., 1].reshape(-1)  # V: Cr
    return yuv


class AvatarH264Encoder(H264Encoder):
    """aiortc's H.264 encoder with its libx264 opened at ``X264_PRESET`` on ``X264_THREADS``
    thread(s), given I420 made by :func:`rgb_to_i420` rather than by swscale inside the encode.
    Same profile, level and tuning as aiortc's own; its bitrate follows the receiver's estimate
    up to ``MAX_BITS_PER_PIXEL`` of the picture (never below aiortc's minimum), in moves past
    ``REOPEN_BAND``."""

    def __init__(self) -> None:
        super().__init__()
        self.max_bitrate = MAX_BITRATE  # aiortc's, until a frame gives the picture's size

    @property
    def target_bitrate(self) -> int:
        """The receiver's estimate (aiortc's, within its bounds), at most ``max_bitrate``; while
        that is within ``REOPEN_BAND`` of the open codec's bitrate, the codec's. What the codec
        is opened at, and what both our and aiortc's reopening test compare."""
        wanted = min(H264Encoder.target_bitrate.fget(self), self.max_bitrate)
        codec = self.codec
        if codec is None or codec.bit_rate > self.max_bitrate:  # a new stream, or a new cap
            return wanted
        return (
            codec.bit_rate
            if abs(wanted - codec.bit_rate) <= REOPEN_BAND * codec.bit_rate
            else wanted
        )

    @target_bitrate.setter
    def target_bitrate(self, bitrate: int) -> None:
        H264Encoder.target_bitrate.fset(self, bitrate)

    def _encode_frame(self, frame: av.VideoFrame, force_keyframe: bool) -> Iterator[bytes]:
        pixels = frame.width * frame.height
        self.max_bitrate = max(MIN_BITRATE, int(MAX_BITS_PER_PIXEL * pixels))
        if frame.format.name == "rgb24" and frame.width % 2 == 0 and frame.height % 2 == 0:
            i420 = av.VideoFrame.from_ndarray(rgb_to_i420(frame.to_ndarray()), format="yuv420p")
            i420.pts, i420.time_base = frame.pts, frame.time_base
            frame = i420
        if self.codec is None or self._stale(frame):
            self.buffer_data, self.buffer_pts = b"", None
            self.codec = None  # the new stream's bitrate is the estimate's, not held to the old
            self.codec = self._open(frame)
        # aiortc's encode now finds a codec that fits the frame and bitrate and keeps it.
        yield from super()._encode_frame(frame, force_keyframe)

    def _stale(self, frame: av.VideoFrame) -> bool:
        """aiortc's test for reopening: another frame size, or the target bitrate moved > 10 %
        (which it only does past ``REOPEN_BAND``)."""
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


class AvatarRtpSender(RTCRtpSender):
    """aiortc's sender, building its encoder with :func:`avatar_encoder` (the module's
    docstring says why this way). Only ever an existing sender's new class
    (:func:`use_avatar_encoder`), never constructed."""

    async def _next_encoded_frame(self, codec: RTCRtpCodecParameters) -> RTCEncodedFrame | None:
        if getattr(self, ENCODER_SLOT) is None:  # aiortc would call get_encoder(codec) now
            setattr(self, ENCODER_SLOT, avatar_encoder(codec))
        return await super()._next_encoded_frame(codec)


def use_avatar_encoder(sender: RTCRtpSender) -> None:
    """Make ``sender`` (and no other) build its encoder with :func:`avatar_encoder`.

    Raises:
        RuntimeError: this aiortc keeps a sender's encoder elsewhere (see the module's
            docstring); the sender would send with aiortc's default x264 settings.
    """
    hooks = hasattr(sender, ENCODER_SLOT) and hasattr(RTCRtpSender, "_next_encoded_frame")
    if type(sender) is not RTCRtpSender or not hooks:
        raise RuntimeError(
            f"cannot set the encoder of {type(sender).__name__}: talkloop/rtc/encoder.py expects "
            f"aiortc's RTCRtpSender making its encoder in _next_encoded_frame, into "
            f"{ENCODER_SLOT} (aiortc 1.16); check how the installed aiortc makes it"
        )
    sender.__class__ = AvatarRtpSender
