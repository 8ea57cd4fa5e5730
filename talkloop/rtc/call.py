"""Call: one browser call over WebRTC: its peer, its avatar (an AvatarSession) and its mirrors.

    microphone (aiortc, 48 kHz Opus) -> AvatarSession.add_microphone_frame (queued; made mono,
                                        full band, on a worker thread, off the loop)
    "say" text / agent speech                            -> AvatarSession (segments)
    AvatarSession.next_video() -> AvatarVideoTrack ;  AvatarSession.next_audio() -> AvatarAudioTrack

Everything about generation, pacing, speech segments and interrupts lives in the AvatarSession
(``talkloop/agent/session.py``); this class adds what a call needs: the peer, the tracks, the
microphone and the latency stamps of the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np
from pydantic import Field

from talkloop.agent.session import AvatarConfig, AvatarSession
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.core.session import Session
from talkloop.pipeline.outputs.sink import Sink
from talkloop.rtc.peer import Peer
from talkloop.rtc.tracks import AvatarAudioTrack, AvatarVideoTrack, stamp_bits


class CallConfig(AvatarConfig):
    """Call settings: its AvatarSession's, plus test hooks."""

    stamp_frames: bool = Field(
        False, description="paint the audio arrival time into frames (tests)"
    )


class Call:
    """One browser call: owns its AvatarSession, the two tracks, the microphone reader and, once
    the page has sent its offer, the Peer (``talkloop/rtc/peer.py``) that carries them.

    Layers, outside in: the server's ``CallSlot`` (``talkloop/rtc/slots.py``: the page's and the
    agent's connections of one call, its slot number) -> ``Call`` -> ``AvatarSession``
    (``talkloop/agent/session.py``: speech in, paced audio and video out) -> ``Session``
    (``talkloop/pipeline/core/session.py``: the generation stream and its rolling memory).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        reference: np.ndarray,
        prompt: str,
        config: CallConfig,
        token: str,
        mirrors: Sequence[Sink] = (),
        executor: Executor | None = None,
    ) -> None:
        self.token = token
        self.config = config
        self.pipeline = pipeline
        self.avatar = AvatarSession(
            pipeline, reference, prompt, config, name=token, mirrors=mirrors, executor=executor
        )
        self.audio_track = AvatarAudioTrack(self.avatar)
        stamp = self._stamp if config.stamp_frames else None
        self.video_track = AvatarVideoTrack(self.avatar, stamp)
        self.peer: Peer | None = None  # set by page signaling when the page's offer comes
        self._tasks: list[asyncio.Task] = []
        self.created_at = time.monotonic()

    @property
    def session(self) -> Session:
        """The pipeline session (the generation stream and its rolling memory) of this call."""
        return self.avatar.session

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start generating and producing driving audio (call on the event loop)."""
        self.avatar.start()

    def attach_microphone(self, track: Any) -> None:
        """Consume a remote audio track (aiortc) as microphone input."""
        self._tasks.append(asyncio.get_running_loop().create_task(self._read_microphone(track)))

    async def close(self) -> None:
        """Close the peer, stop everything and release what the call held. Idempotent."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.peer is not None:
            with contextlib.suppress(Exception):
                await self.peer.close()
        self.audio_track.stop()
        self.video_track.stop()
        await self.avatar.close()  # closes the pipeline session and its mirrors, started or not

    # -- control -----------------------------------------------------------------------------------

    def say(self, text: str) -> asyncio.Task:
        """Speak ``text`` with the built-in TTS (streamed)."""
        return self.avatar.say(text)

    def interrupt(self) -> None:
        """Drop queued speech and unplayed audio; the avatar is idle again within one chunk."""
        self.avatar.clear_buffer()

    def set_prompt(self, text: str) -> None:
        self.avatar.set_prompt(text)

    def stats(self) -> dict[str, float | int | str | None]:
        return self.avatar.stats()

    # -- internals ---------------------------------------------------------------------------------

    async def _read_microphone(self, track: Any) -> None:
        # Opus decodes at 48 kHz, the avatar's output rate: the microphone passes through at
        # full band (channels averaged, on the avatar's converter thread: the loop only queues
        # the frame); the driver resamples it for the model.
        while not self.avatar.closed:
            try:
                frame = await track.recv()
            except Exception:  # MediaStreamError: the browser stopped sending
                return
            self.avatar.add_microphone_frame(frame, time.monotonic())

    def _stamp(self, rgb: np.ndarray, frame: int) -> np.ndarray:
        """Paint the wall-clock ms at which the audio of ``frame`` arrived (latency tests)."""
        info = self.pipeline.info
        arrived = self.avatar.driver.arrival_of(info.frame_pts(frame + 1) - 1)
        if arrived is None:
            return rgb
        wall_ms = int((time.time() - (time.monotonic() - arrived)) * 1000) & 0xFFFFFFFF
        return stamp_bits(rgb, wall_ms)
