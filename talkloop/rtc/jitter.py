"""A jitter buffer that hands a frame on as soon as it is complete, as browsers do.

aiortc's own buffer (``aiortc.jitterbuffer.JitterBuffer``) knows a frame is complete only when a
packet of the next one arrives: every video frame waits one frame interval (40 ms at 25 fps), and
its receivers hold audio until four more packets have come (80 ms of Opus). A browser completes a
video frame at the packet that carries the RTP marker bit (RFC 6184: the last packet of an access
unit) and plays audio from an adaptive buffer that, on a clean link, holds a packet or two.

``PromptJitterBuffer`` does the same: a video frame leaves at its marker packet; an audio packet
(one Opus frame each, RFC 7587) leaves as soon as every packet before it has, a lost one is
given up once ``depth`` packets have arrived behind it, and no more than ``depth`` wait (after
losses the oldest go), so the audio's delay stays under ``depth`` packets.
``use_prompt_jitter_buffer`` puts one into an aiortc receiver (before its first packet),
``prompt_track`` into the receiver of a peer connection's remote track.
"""

from __future__ import annotations

import logging

from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtcrtpreceiver import RTCRtpReceiver

log = logging.getLogger("talkloop.rtc")

AUDIO_DEPTH = 3  # packets that may arrive behind a lost audio packet before it is given up


class PromptJitterBuffer(JitterBuffer):
    """``JitterBuffer`` that releases a frame the moment it is complete (module docstring)."""

    def __init__(self, capacity: int, is_video: bool, depth: int = AUDIO_DEPTH) -> None:
        super().__init__(capacity, prefetch=0, is_video=is_video)
        self.depth = depth

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        if self._is_video:
            return self._complete_video() or super()._remove_frame(sequence_number)
        return self._next_audio()

    def _complete_video(self) -> JitterFrame | None:
        """The oldest frame, if all its packets up to the marker one are here."""
        packets = []
        for count in range(self.capacity):
            packet = self._packets[(self._origin + count) % self.capacity]
            if packet is None or (packets and packet.timestamp != packets[0].timestamp):
                return None
            packets.append(packet)
            if packet.marker:
                self.remove(count + 1)
                data = b"".join(p._data for p in packets)  # type: ignore[attr-defined]
                return JitterFrame(data=data, timestamp=packets[0].timestamp)
        return None

    def _next_audio(self) -> JitterFrame | None:
        """The oldest audio packet here, once every packet before it has left or been given up
        (``depth`` newer ones arrived); of more than ``depth`` waiting behind it the oldest go
        too, so losses cannot add delay for good."""
        waiting = sum(p is not None for p in self._packets)
        if self._packets[self._origin % self.capacity] is None and waiting < self.depth:
            return None  # the missing packet may still come
        while True:
            head = self._packets[self._origin % self.capacity]
            self.remove(1)
            if head is None:  # lost
                continue
            waiting -= 1
            if waiting <= self.depth:
                return JitterFrame(data=head._data, timestamp=head.timestamp)  # type: ignore[attr-defined]


_SLOT = "_RTCRtpReceiver__jitter_buffer"  # aiortc's private attribute: no API chooses it


def use_prompt_jitter_buffer(receiver: RTCRtpReceiver) -> bool:
    """Give ``receiver`` a ``PromptJitterBuffer`` of the size aiortc gives its own (call it
    before the first packet: from the peer connection's "track" event). False, with a warning,
    where this aiortc keeps its buffer elsewhere: the receiver then keeps aiortc's."""
    old = getattr(receiver, _SLOT, None)
    if not isinstance(old, JitterBuffer):
        log.warning("aiortc's receiver has no %s: its own jitter buffer stays", _SLOT)
        return False
    setattr(receiver, _SLOT, PromptJitterBuffer(old.capacity, is_video=old._is_video))
    return True


def prompt_track(pc: RTCPeerConnection, track: MediaStreamTrack) -> None:
    """``use_prompt_jitter_buffer`` on the receiver of ``track`` (a remote track of ``pc``, from
    its "track" event)."""
    for t in pc.getTransceivers():
        if t.receiver.track is track:
            use_prompt_jitter_buffer(t.receiver)
