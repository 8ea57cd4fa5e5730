"""Our calls' H.264 encoder: x264 at its low-CPU settings, still aiortc's bitrate, keyframes and
RTP packets, made for H.264 only and for our own peers' senders only."""

from __future__ import annotations

import asyncio
import re
from fractions import Fraction

import av
import cv2
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, rtcrtpsender
from aiortc.codecs import get_encoder
from aiortc.codecs.h264 import MIN_BITRATE, H264PayloadDescriptor
from aiortc.mediastreams import AudioStreamTrack, VideoStreamTrack
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from PIL import Image

from talkloop.pipeline.models.studio.family import DEFAULT_REFERENCE
from talkloop.rtc.encoder import (
    ENCODER_SLOT,
    MAX_BITS_PER_PIXEL,
    REOPEN_BAND,
    X264_PRESET,
    X264_THREADS,
    AvatarH264Encoder,
    avatar_encoder,
    rgb_to_i420,
    use_avatar_encoder,
)
from talkloop.rtc.peer import Peer

from support import psnr

pytestmark = pytest.mark.unit


def talking_frames(n: int) -> list[np.ndarray]:
    """The default avatar (256x256) with a moving dark mouth-sized block."""
    face = np.asarray(Image.open(DEFAULT_REFERENCE).convert("RGB"))
    out = []
    for i in range(n):
        f = face.copy()
        f[170 : 180 + 3 * (i % 6), 104:152] = 40
        out.append(f)
    return out


def send(enc: AvatarH264Encoder, rgb: np.ndarray, index: int, keyframe: bool = False):
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
    frame.pts, frame.time_base = index * 3600, Fraction(1, 90000)
    payloads, _ = enc.encode(frame, keyframe)
    return payloads


def depacketize(payloads: list[bytes]) -> bytes:
    """RTP payloads (single NAL, STAP-A, FU-A) back to an Annex B access unit, as a receiver."""
    return b"".join(H264PayloadDescriptor.parse(p)[1] for p in payloads)


def nal_types(annex_b: bytes) -> set[int]:
    return {unit[0] & 0x1F for unit in annex_b.split(b"\x00\x00\x01")[1:] if unit}


def x264_settings(annex_b: bytes) -> dict[str, str]:
    """The settings x264 writes into the stream it starts (its SEI: "options: cabac=0 ref=1 ...")."""
    match = re.search(rb"x264 - .*? options: ([^\x00]*)", annex_b)
    assert match, "no x264 settings SEI in this access unit"
    return dict(kv.split("=", 1) for kv in match.group(1).decode().split())


# x264's "superfast" preset (against "medium": subme=7 ref=3 me=hex); "zerolatency" turns
# B-frames off.
SUPERFAST = {"subme": "1", "ref": "1", "me": "dia", "bframes": "0"}


def test_frames_come_back_through_rtp_packets_at_low_cpu_settings() -> None:
    enc = AvatarH264Encoder()
    dec = av.CodecContext.create("h264", "r")
    frames = talking_frames(30)
    got = []
    for i, rgb in enumerate(frames):
        data = depacketize(send(enc, rgb, i))
        if i == 0:
            settings = x264_settings(data)
        got += [f.to_ndarray(format="rgb24") for f in dec.decode(av.Packet(data))]
        assert len(got) == i + 1  # no frame held back (zerolatency): one in, one out
    assert X264_PRESET == "superfast" and settings.items() >= SUPERFAST.items()
    assert settings["threads"] == str(X264_THREADS) == "1"
    assert settings["bitrate"] == str(enc.target_bitrate // 1000)  # aiortc's target, kbit/s
    assert psnr(np.stack(got), np.stack(frames)) > 35


@pytest.mark.parametrize("crop", [None, (250, 254)])
def test_frames_reach_x264_as_the_picture_swscale_would_give_it(crop) -> None:
    """Our RGB -> I420 (OpenCV) against swscale's, which x264 got before: the same luma within
    one level, chroma (the mean of each 2x2 block) within a few, and as close to the RGB; also
    for a height that is even but not a multiple of 4 (a chroma plane's rows split I420's)."""
    rgb = talking_frames(3)[2]
    rgb = np.ascontiguousarray(rgb if crop is None else rgb[: crop[0], : crop[1]])
    h, w = rgb.shape[:2]
    ours = rgb_to_i420(rgb)
    sws = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p").to_ndarray()
    assert ours.shape == sws.shape == (h * 3 // 2, w) and ours.dtype == np.uint8
    diff = np.abs(ours.astype(int) - sws)
    assert diff[:h].max() <= 1
    assert diff[h:].mean() < 0.5 and diff[h:].max() <= 8
    back = [
        av.VideoFrame.from_ndarray(x, format="yuv420p").to_ndarray(format="rgb24")
        for x in (ours, sws)
    ]
    assert psnr(back[0], rgb) >= psnr(back[1], rgb) - 0.2


def test_keyframe_requests_and_bitrate_changes_still_act() -> None:
    enc = AvatarH264Encoder()
    frames = [cv2.resize(f, (512, 512)) for f in talking_frames(12)]
    for i in range(5):
        send(enc, frames[i], i)
    first = enc.codec
    # The browser asks for a picture it can start from (PLI): an IDR slice (NAL type 5).
    assert 5 not in nal_types(depacketize(send(enc, frames[5], 5)))
    assert 5 in nal_types(depacketize(send(enc, frames[6], 6, keyframe=True)))
    # A move within REOPEN_BAND keeps the codec, a larger one reopens it at that bitrate,
    # with our settings again.
    enc.target_bitrate = int(first.bit_rate * 0.8)
    send(enc, frames[7], 7)
    assert enc.codec is first
    enc.target_bitrate = 600_000
    payloads = send(enc, frames[8], 8)
    assert enc.codec is not first
    data = depacketize(payloads)
    assert 5 in nal_types(data)  # a new stream starts with a keyframe
    settings = x264_settings(data)
    assert settings["bitrate"] == "600" and settings["threads"] == "1"
    assert settings.items() >= SUPERFAST.items()


def test_the_bitrate_follows_the_estimate_up_to_what_the_picture_needs() -> None:
    """The receiver's estimate climbs to aiortc's 3 Mbit/s; the encoder follows it in moves past
    REOPEN_BAND, never above MAX_BITS_PER_PIXEL of the picture (1.18 Mbit/s at 512x512), and
    never goes below aiortc's minimum for a small picture."""
    enc = AvatarH264Encoder()
    frames = [cv2.resize(f, (512, 512)) for f in talking_frames(12)]
    enc.target_bitrate = 600_000
    assert x264_settings(depacketize(send(enc, frames[0], 0)))["bitrate"] == "600"
    cap = int(MAX_BITS_PER_PIXEL * 512 * 512)
    opened = [enc.codec.bit_rate]
    for i, estimate in enumerate(range(700_000, 3_000_001, 100_000), start=1):
        enc.target_bitrate = estimate
        before = enc.codec
        send(enc, frames[i % 12], i)
        if enc.codec is not before:
            opened.append(enc.codec.bit_rate)
    assert opened == [600_000, 800_000, 1_100_000]  # each a move past the band from the last
    assert all(b > a * (1 + REOPEN_BAND) for a, b in zip(opened, opened[1:], strict=False))
    assert cap / (1 + REOPEN_BAND) <= enc.codec.bit_rate <= cap  # near the cap, never above
    small = AvatarH264Encoder()
    small.target_bitrate = 3_000_000
    tiny = talking_frames(2)  # 256x256: 0.29 Mbit/s by the rule, aiortc's 0.5 minimum
    send(small, tiny[0], 0)
    assert small.codec.bit_rate == MIN_BITRATE


def test_a_receivers_ramp_keeps_one_stream_and_congestion_still_reopens_it() -> None:
    """What a receiver's estimate did in a call's first 15 s (a call of 2026-12-06 at 512x512:
    aiortc's 1.0 Mbit/s, then 0.8, 0.92, 1.03, 1.16) keeps the stream x264 started: no IDR
    picture after the first, where aiortc's 10 % test reopened it at each. A congested link's
    second 15 % step down reopens it at the estimate."""
    enc = AvatarH264Encoder()
    frames = [cv2.resize(f, (512, 512)) for f in talking_frames(12)]
    idr = []
    for i, estimate in enumerate([1_000_000] * 3 + [800_000, 920_000, 1_030_000, 1_160_000]):
        enc.target_bitrate = estimate
        if 5 in nal_types(depacketize(send(enc, frames[i], i))):
            idr.append(i)
    assert idr == [0] and enc.codec.bit_rate == 1_000_000
    enc.target_bitrate = 850_000  # the estimate falls a step: the stream goes on
    send(enc, frames[7], 7)
    enc.target_bitrate = 722_500  # and another: past the band, a new stream at that rate
    assert 5 in nal_types(depacketize(send(enc, frames[8], 8)))
    assert enc.codec.bit_rate == 722_000  # x264 keeps kbit/s


def codec(mime: str, rate: int) -> RTCRtpCodecParameters:
    return RTCRtpCodecParameters(mimeType=mime, clockRate=rate, payloadType=96)


async def nothing() -> None:
    pass


def test_our_peers_video_sender_uses_it_and_no_other_sender_does() -> None:
    """Scoped to our peers: aiortc's get_encoder stays aiortc's, and a sender of another
    connection in the same process keeps aiortc's own x264 settings."""

    async def first_frames():
        config = RTCConfiguration(iceServers=[])  # nothing is negotiated: no network at all
        peer = Peer(AudioStreamTrack(), VideoStreamTrack(), lambda track: None, nothing, config)
        other = RTCPeerConnection(config)
        theirs = other.addTrack(VideoStreamTrack())
        ours = next(s for s in peer.pc.getSenders() if s.kind == "video")
        h264 = codec("video/H264", 90000)
        # what each sender's RTP loop sends first: its encoder is made for this frame
        frames = [await sender._next_encoded_frame(h264) for sender in (ours, theirs)]
        await peer.close()
        await other.close()
        return frames

    ours, theirs = asyncio.run(first_frames())
    assert rtcrtpsender.get_encoder is get_encoder
    mine = x264_settings(depacketize(ours.payloads))
    assert mine.items() >= SUPERFAST.items() and mine["threads"] == str(X264_THREADS)
    assert x264_settings(depacketize(theirs.payloads))["subme"] == "7"  # aiortc's "medium"


def test_it_is_made_for_h264_only() -> None:
    assert type(avatar_encoder(codec("video/H264", 90000))) is AvatarH264Encoder
    for mime, rate in (("video/VP8", 90000), ("audio/opus", 48000)):
        assert type(avatar_encoder(codec(mime, rate))) is type(get_encoder(codec(mime, rate)))


def test_an_aiortc_that_keeps_its_encoder_elsewhere_is_refused() -> None:
    async def take_over() -> None:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        sender = pc.addTrack(VideoStreamTrack())
        delattr(sender, ENCODER_SLOT)  # as if aiortc had renamed its encoder slot
        try:
            use_avatar_encoder(sender)
        finally:
            await pc.close()

    with pytest.raises(RuntimeError, match=ENCODER_SLOT):
        asyncio.run(take_over())
