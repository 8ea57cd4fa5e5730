"""The outgoing WebRTC tracks: thin wrappers around an AvatarSession's paced outputs."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from talkloop.agent.session import AvatarSession
from talkloop.pipeline.core.errors import SessionClosedError

VIDEO_CLOCK = 90000  # RTP video clock rate


class AvatarAudioTrack(MediaStreamTrack):
    """Sends the AvatarSession's output audio (the driving audio, played out on the media
    clock)."""

    kind = "audio"

    def __init__(self, avatar: AvatarSession) -> None:
        super().__init__()
        self.avatar = avatar

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        try:
            out = await self.avatar.next_audio()
        except SessionClosedError:
            raise MediaStreamError from None
        pcm = np.frombuffer(out.data, dtype="<i2").reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = out.sample_rate
        frame.pts = out.pts
        frame.time_base = Fraction(1, out.sample_rate)
        return frame


class AvatarVideoTrack(MediaStreamTrack):
    """Sends the AvatarSession's output video: frame ``j`` at the time of its first audio sample.

    Args:
        avatar: the AvatarSession whose frames it sends (late and withheld frames are repeats).
        stamp: optional ``(rgb, frame_index) -> rgb`` applied before sending (latency tests).
    """

    kind = "video"

    def __init__(
        self,
        avatar: AvatarSession,
        stamp: Callable[[np.ndarray, int], np.ndarray] | None = None,
    ) -> None:
        super().__init__()
        self.avatar, self.stamp = avatar, stamp

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        try:
            out = await self.avatar.next_video()
        except SessionClosedError:
            raise MediaStreamError from None
        rgb = out.rgb if self.stamp is None else self.stamp(out.rgb, out.index)
        # The frame wraps the pixels (never written again: a published frame is its own copy)
        # rather than copying them on the event loop: 0.005 against 0.16 ms a 512x512 frame.
        # Only the idle frame (the caller's avatar image) may be a view with other strides.
        frame = av.VideoFrame.from_numpy_buffer(np.ascontiguousarray(rgb), format="rgb24")
        frame.pts = out.pts * VIDEO_CLOCK // out.sample_rate
        frame.time_base = Fraction(1, VIDEO_CLOCK)
        return frame


STAMP_BITS = 32


def _stamp_blocks(h: int, w: int) -> tuple[int, int]:
    return w // 16, max(8, min(16, h // 16))


def stamp_bits(rgb: np.ndarray, value: int) -> np.ndarray:
    """Paint ``value`` (32 bits, MSB first) as two rows of 16 black/white blocks at the top, and
    its complement as the two rows below: a frame that was sent unstamped, or whose blocks the
    codec blurred, does not read back as a wrong value."""
    out = rgb.copy()
    bw, bh = _stamp_blocks(*out.shape[:2])
    for bit in range(2 * STAMP_BITS):
        row, col = divmod(bit, 16)
        on = (value >> (STAMP_BITS - 1 - bit % STAMP_BITS)) & 1 ^ (bit >= STAMP_BITS)
        out[row * bh : (row + 1) * bh, col * bw : (col + 1) * bw] = 255 if on else 0
    return out


def read_stamp(rgb: np.ndarray) -> int | None:
    """Inverse of ``stamp_bits`` on a decoded (lossy) frame, (H, W, 3) RGB or its (H, W) luma;
    None when the frame carries no readable stamp (some bit and its complement agree)."""
    bw, bh = _stamp_blocks(*rgb.shape[:2])
    my, mx = bh // 4, bw // 4  # read the block's centre: its edges blur in the codec
    bits = []
    for bit in range(2 * STAMP_BITS):
        row, col = divmod(bit, 16)
        block = rgb[row * bh + my : (row + 1) * bh - my, col * bw + mx : (col + 1) * bw - mx]
        bits.append(int(block.mean() > 127))
    value, check = bits[:STAMP_BITS], bits[STAMP_BITS:]
    if any(a == b for a, b in zip(value, check, strict=True)):
        return None
    return int("".join(map(str, value)), 2)
