"""The server's side of one WebRTC call (aiortc): tracks out, microphone in, H.264 preferred."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaBlackhole
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtcrtpsender import RTCRtpSender
from aiortc.sdp import candidate_from_sdp

from talkloop.rtc.encoder import use_avatar_encoder
from talkloop.rtc.jitter import prompt_track
from talkloop.rtc.protocol import ProtocolError

log = logging.getLogger("talkloop.peer")


def preferred_video_codecs() -> list:
    """H.264 first, VP8 as fallback (with their RTX entries, so retransmission stays on)."""
    codecs = RTCRtpSender.getCapabilities("video").codecs
    order = {"video/H264": 0, "video/VP8": 1, "video/rtx": 2}
    return sorted((c for c in codecs if c.mimeType in order), key=lambda c: order[c.mimeType])


class Peer:
    """One RTCPeerConnection: sends ``audio`` and ``video``, hands the browser's microphone on.

    Args:
        audio: the outgoing audio track.
        video: the outgoing video track (H.264 preferred, x264 at our settings:
            ``talkloop/rtc/encoder.py``; VP8 as fallback).
        on_microphone: called with the browser's audio track when it arrives.
        on_closed: called once when the connection fails or closes on its own.
        configuration: ICE servers and transport policy (``talkloop.rtc.ice.IceConfig``); None:
            aiortc's default (a public STUN server).
        name: the call's name in log lines.
    """

    def __init__(
        self,
        audio: MediaStreamTrack,
        video: MediaStreamTrack,
        on_microphone: Callable[[MediaStreamTrack], None],
        on_closed: Callable[[], Awaitable[None]],
        configuration: RTCConfiguration | None = None,
        name: str = "",
    ) -> None:
        self.pc = RTCPeerConnection(configuration)
        self.name = name
        self._on_closed = on_closed
        self._blackholes: list[MediaBlackhole] = []
        self._tasks: list[asyncio.Future] = []
        self._closing = False
        self.pc.addTrack(audio)
        sender = self.pc.addTrack(video)
        # x264 at a preset that leaves the CPU to the avatar, for this sender only.
        use_avatar_encoder(sender)
        # Codec preferences only count if set before setRemoteDescription (aiortc).
        for t in self.pc.getTransceivers():
            if t.sender is sender:
                t.setCodecPreferences(preferred_video_codecs())

        @self.pc.on("track")
        def on_track(track) -> None:
            if track.kind == "audio":
                # The microphone's packets go on as they come (aiortc holds four, 80 ms); the
                # driver's backlog rules absorb jitter (talkloop/rtc/jitter.py).
                prompt_track(self.pc, track)
                on_microphone(track)
            else:  # we never use the client's video; drain it so aiortc's queue stays empty
                hole = MediaBlackhole()
                hole.addTrack(track)
                self._blackholes.append(hole)
                self._tasks.append(asyncio.ensure_future(hole.start()))

        @self.pc.on("connectionstatechange")
        async def on_state() -> None:
            log.info("call %s: connection %s", self.name, self.pc.connectionState)
            # Our own close() (after a bad offer, or at teardown) must not end the call.
            if self.pc.connectionState in ("failed", "closed") and not self._closing:
                await self._on_closed()

    async def answer(self, sdp: str) -> str:
        """Apply the browser's offer and return our answer (all our candidates included)."""
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            # A malformed offer can pass parsing and only fail while answering (no media lines,
            # no directions): both count as a bad offer, not as a server fault.
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except Exception as err:  # aiortc raises ValueError, KeyError, ... on malformed SDP
            raise ProtocolError(
                "bad_sdp", f"invalid SDP offer: {err or type(err).__name__}"
            ) from None
        if not any(
            line.startswith("m=video") for line in self.pc.localDescription.sdp.splitlines()
        ):
            raise ProtocolError("bad_sdp", "invalid SDP offer: it has no video section to answer")
        return self.pc.localDescription.sdp

    async def add_candidate(self, candidate: str | None, sdp_mid: object, index: object) -> None:
        """Add a trickled remote candidate (None or "": end of candidates).

        Raises:
            ProtocolError: ``bad_candidate``, naming what is wrong with it.
        """
        if not candidate:
            await self.pc.addIceCandidate(None)  # end of candidates
            return
        try:
            c = candidate_from_sdp(
                candidate.split(":", 1)[1] if candidate.startswith("candidate:") else candidate
            )
        except Exception as err:
            raise ProtocolError(
                "bad_candidate", f"invalid ICE candidate {candidate[:80]!r}: {err}"
            ) from None
        c.sdpMid = sdp_mid if isinstance(sdp_mid, str) else None
        c.sdpMLineIndex = index if isinstance(index, int) and not isinstance(index, bool) else None
        if c.sdpMid is None and c.sdpMLineIndex is None:
            raise ProtocolError(
                "bad_candidate",
                "an ICE candidate needs sdpMid (a string) or sdpMLineIndex (a number) naming its "
                "media section, as RTCPeerConnection's onicecandidate gives them",
            )
        transceivers = self.pc.getTransceivers()
        if c.sdpMid not in {t.mid for t in transceivers} and c.sdpMLineIndex not in range(
            len(transceivers)
        ):
            # aiortc would drop it without a word; the sender should know it went nowhere.
            raise ProtocolError(
                "bad_candidate",
                f"ICE candidate for sdpMid={c.sdpMid!r} sdpMLineIndex={c.sdpMLineIndex!r}: "
                "the call has no such media section",
            )
        try:
            await self.pc.addIceCandidate(c)
        except Exception as err:  # aiortc/aioice refusals of a candidate they parsed
            raise ProtocolError(
                "bad_candidate", f"ICE candidate refused: {err or type(err).__name__}"
            ) from None

    async def close(self) -> None:
        self._closing = True
        for hole in self._blackholes:
            await hole.stop()
        await self.pc.close()
