"""LiveSession: one avatar call. Generation on its own thread, media on the event loop.

    microphone (aiortc) -> resample to 16 kHz -> AudioDriver (real-time blocks, + TTS, silence)
        -> pipeline Session.push_audio  -> generation thread (Session.run_live)
        -> FrameQueueSink (bounded, drops the oldest) -> AvatarVideoTrack (paced by MediaClock)
        -> PlayoutBuffer -> AvatarAudioTrack (the same driving audio, same clock)

Closing a session stops the thread, ends the tracks and drops every reference to tensors, queues
and buffers it held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

import av
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from pipeline.audio.io import pcm16_to_float
from pipeline.core.pipeline import Pipeline, Session
from pipeline.outputs.queue import FrameQueueSink
from rtc.clock import MediaClock
from rtc.driver import AudioDriver
from rtc.tracks import AvatarAudioTrack, AvatarVideoTrack, av_offset_ms, stamp_bits

log = logging.getLogger("talkloop.live")


class LiveConfig(BaseModel):
    """Live-call settings (the chunk schedule is in the root config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    playout_delay_ms: int = Field(
        450, ge=50, le=5000, description="driving audio -> playout; must cover one chunk + compute"
    )
    queue_seconds: float = Field(2.0, gt=0, le=30, description="published frames held at most")
    max_mic_backlog_ms: int = Field(200, ge=20, le=5000)
    max_lag_ms: int = Field(
        1000, ge=100, le=60000, description="generation this far behind skips whole chunks"
    )
    stamp_frames: bool = Field(
        False, description="paint the audio arrival time into frames (tests)"
    )


class LiveSession:
    """Owns a pipeline session, its generation thread, the driver and the two tracks."""

    def __init__(
        self,
        pipeline: Pipeline,
        reference: np.ndarray,
        prompt: str,
        live: LiveConfig,
        token: str,
    ) -> None:
        self.token = token
        self.live = live
        self.pipeline = pipeline
        info = pipeline.info
        self.frames = FrameQueueSink(
            max(1, int(live.queue_seconds * info.fps)), policy="drop_oldest"
        )
        self.session: Session = pipeline.open_session(reference, prompt, [self.frames])
        self.clock = MediaClock(info.sample_rate, live.playout_delay_ms / 1000.0)
        self.driver = AudioDriver(
            self._push,
            self.clock,
            info.sample_rate,
            max_mic_backlog_s=live.max_mic_backlog_ms / 1000,
        )
        self.audio_track = AvatarAudioTrack(self.driver.playout, self.clock)
        stamp = self._stamp if live.stamp_frames else None
        self.video_track = AvatarVideoTrack(self.frames, self.clock, info, reference, stamp)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._generate, name=f"gen-{token[:6]}", daemon=True)
        self._tasks: list[asyncio.Task] = []
        self.error: BaseException | None = None
        self.driving_dropped_samples = 0
        self.created_at = time.monotonic()

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start generating and producing driving audio (call on the event loop)."""
        self._thread.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self.driver.run()))

    def attach_microphone(self, track: Any) -> None:
        """Consume a remote audio track (aiortc) as microphone input."""
        self._tasks.append(asyncio.get_running_loop().create_task(self._read_microphone(track)))

    async def close(self) -> None:
        """Stop everything and release what the session held. Idempotent."""
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self.audio_track.stop()
        self.video_track.stop()
        self.frames.abort()  # wakes a generation step blocked on the queue, drops held frames
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join)
        # Drop references so tensors, frames and audio buffers are freed now, not at GC time.
        self.session.state = type(self.session.state)()
        self.video_track.last = None
        self.video_track._pending = None

    # -- control -----------------------------------------------------------------------------------

    def say(self, samples: np.ndarray) -> bool:
        return self.driver.say(samples)

    def interrupt(self) -> None:
        """Drop queued speech and unplayed audio; the avatar is idle again within one chunk."""
        self.driver.interrupt()
        self.session.silence_unconsumed_audio()

    def set_prompt(self, text: str) -> None:
        self.session.set_prompt(text)

    def stats(self) -> dict[str, float | int | str | None]:
        v, s = self.video_track, self.session.stats
        media = max(s.frames / self.pipeline.info.fps, 1e-9)
        return {
            "frames_sent": v.frames_sent,
            "late_frames": v.late_frames,
            "dropped_frames": v.dropped_frames + self.frames.dropped_frames,
            "skipped_frames": s.skipped_frames,
            "frames_generated": s.frames,
            "rtf": round(s.generate_seconds / media, 3) if s.frames else None,
            "playout_delay_ms": self.live.playout_delay_ms,
            "av_offset_ms": av_offset_ms(v.lateness, self.audio_track.lateness),
            "queue_depth": self.frames.depth,
            "speech_pending_s": round(self.driver.tts_pending_s, 2),
            "mic_dropped_ms": round(
                1000 * self.driver.mic_dropped_samples / self.pipeline.info.sample_rate
            ),
            "error": None if self.error is None else str(self.error),
        }

    # -- internals ---------------------------------------------------------------------------------

    def _push(self, block: np.ndarray) -> None:
        try:
            self.session.push_audio(block, timeout=0)
        except TimeoutError:  # generation is stalled far behind: never block the event loop
            self.driving_dropped_samples += block.shape[0]
        except Exception as err:  # session closed under us
            if not self._stop.is_set():
                log.warning("session %s: driving audio rejected: %s", self.token[:6], err)

    def _generate(self) -> None:
        try:
            self.session.run_live(self._stop, max_lag_s=self.live.max_lag_ms / 1000)
        except Exception as err:  # ends this session only
            self.error = err
            log.exception("session %s: generation failed", self.token[:6])

    async def _read_microphone(self, track: Any) -> None:
        rate = self.pipeline.info.sample_rate
        resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
        while not self._stop.is_set():
            try:
                frame = await track.recv()
            except Exception:  # MediaStreamError: the browser stopped sending
                return
            arrived = time.monotonic()
            for out in resampler.resample(frame):
                self.driver.add_mic(pcm16_to_float(out.to_ndarray().reshape(-1)), arrived)

    def _stamp(self, rgb: np.ndarray, frame: int) -> np.ndarray:
        """Paint the wall-clock ms at which the audio of ``frame`` arrived (latency tests)."""
        info = self.pipeline.info
        arrived = self.driver.arrival_of(info.frame_pts(frame + 1) - 1)
        if arrived is None:
            return rgb
        wall_ms = int((time.time() - (time.monotonic() - arrived)) * 1000) & 0xFFFFFFFF
        return stamp_bits(rgb, wall_ms)
