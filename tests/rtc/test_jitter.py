"""The prompt jitter buffer: a frame leaves the moment it is complete (talkloop/rtc/jitter.py)."""

import asyncio

import pytest
from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from talkloop.rtc.jitter import PromptJitterBuffer, use_prompt_jitter_buffer

pytestmark = pytest.mark.unit


def _packet(seq: int, ts: int, marker: int = 0, data: bytes = b"") -> RtpPacket:
    p = RtpPacket(sequence_number=seq, timestamp=ts, marker=marker)
    p._data = data or bytes([seq % 256])
    return p


def test_a_video_frame_leaves_at_its_marker_packet_where_aiortc_waits_for_the_next_frame():
    frames = [(_packet(10, 3000), _packet(11, 3000), _packet(12, 3000, marker=1))]
    frames.append((_packet(13, 6600, marker=1),))
    prompt = PromptJitterBuffer(512, is_video=True)
    aiortc = JitterBuffer(512, is_video=True)
    out_prompt, out_aiortc = [], []
    for frame in frames:
        for packet in frame:
            out_prompt.append(prompt.add(packet)[1])
            out_aiortc.append(aiortc.add(packet)[1])
    # Ours: frame 1 when its third packet (the marker) arrives, frame 2 at once.
    assert [f is not None for f in out_prompt] == [False, False, True, True]
    assert out_prompt[2].timestamp == 3000 and out_prompt[2].data == bytes([10, 11, 12])
    assert out_prompt[3].timestamp == 6600
    # aiortc's: frame 1 only when frame 2's first packet arrives, frame 2 not yet.
    assert [f is not None for f in out_aiortc] == [False, False, False, True]
    assert out_aiortc[3].data == out_prompt[2].data


def test_a_video_frame_with_a_missing_packet_waits_for_it():
    buf = PromptJitterBuffer(512, is_video=True)
    assert buf.add(_packet(20, 100))[1] is None
    assert buf.add(_packet(22, 100, marker=1))[1] is None  # 21 not here: incomplete
    frame = buf.add(_packet(21, 100))[1]
    assert frame is not None and frame.data == bytes([20, 21, 22])


def test_audio_packets_leave_in_order_as_they_come_and_a_lost_one_is_given_up():
    buf = PromptJitterBuffer(16, is_video=False, depth=3)
    got = [buf.add(_packet(s, 960 * s))[1] for s in (1, 2)]
    assert [f.timestamp for f in got] == [960, 1920]  # each at once (aiortc holds four)
    assert buf.add(_packet(4, 960 * 4))[1] is None  # 3 missing: wait for it ...
    late = buf.add(_packet(3, 960 * 3))[1]  # ... it comes: out in order
    assert late.timestamp == 960 * 3
    assert buf.add(_packet(5, 960 * 5))[1].timestamp == 960 * 4  # one per packet: 4 first
    # 6 lost: after three more packets it is given up, never waited for again.
    out = [buf.add(_packet(s, 960 * s))[1] for s in (7, 8, 9)]
    assert out[0].timestamp == 960 * 5 and out[1] is None and out[2].timestamp == 960 * 7


def test_audio_losses_never_leave_more_than_depth_packets_waiting():
    buf = PromptJitterBuffer(16, is_video=False, depth=3)
    seq = 0
    for _ in range(20):  # every fourth packet lost
        for _ in range(3):
            seq += 1
            buf.add(_packet(seq, 960 * seq))
            assert sum(p is not None for p in buf._packets) <= 3
        seq += 1


def test_it_replaces_the_jitter_buffer_of_a_real_aiortc_receiver():
    async def run() -> list:
        pc = RTCPeerConnection()
        try:
            kinds = []
            for kind in ("audio", "video"):
                receiver = pc.addTransceiver(kind, direction="recvonly").receiver
                assert use_prompt_jitter_buffer(receiver)
                buf = receiver._RTCRtpReceiver__jitter_buffer
                kinds.append((type(buf), buf._is_video, buf.capacity))
            return kinds
        finally:
            await pc.close()

    assert asyncio.run(run()) == [(PromptJitterBuffer, False, 16), (PromptJitterBuffer, True, 512)]
