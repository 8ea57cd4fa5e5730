"""The latency stamp survives H.264 and refuses frames that carry none."""

from __future__ import annotations

import av
import numpy as np
import pytest

from talkloop.rtc.client import luma
from talkloop.rtc.tracks import read_stamp, stamp_bits


def h264_round_trip(frames: list[np.ndarray], as_rgb: bool = True) -> list[np.ndarray]:
    """The frames through x264 and back: decoded RGB, or the luma the scripted
    client reads (``as_rgb`` False)."""
    h, w = frames[0].shape[:2]
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = w, h, "yuv420p"
    enc.options = {"preset": "ultrafast", "tune": "zerolatency", "crf": "35"}
    dec = av.CodecContext.create("h264", "r")
    out = []
    packets = []
    for rgb in frames:
        packets += enc.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24"))
    packets += enc.encode(None)
    for p in packets:
        out += [f.to_ndarray(format="rgb24") if as_rgb else luma(f) for f in dec.decode(p)]
    return out


@pytest.mark.unit
def test_stamps_read_back_through_h264_and_unstamped_frames_read_none() -> None:
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)
    values = [0, 0xFFFFFFFF, 0x12345678, 4_000_000_000, 123]
    sent = [stamp_bits(photo, v) for v in values] + [photo]
    for as_rgb in (True, False):
        got = [read_stamp(frame) for frame in h264_round_trip(sent, as_rgb)]
        assert got == [*values, None]
    # a blank frame (e.g. all black before the first one) is no stamp either
    assert read_stamp(np.zeros((512, 512, 3), np.uint8)) is None
