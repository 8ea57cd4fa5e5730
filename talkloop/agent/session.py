"""AvatarSession: the avatar as voice-agent frameworks expect it, in-process, no WebRTC needed.

    push_audio(AudioFrame) / end_of_segment() / clear_buffer()      (agent TTS in, any rate)
        -> resample to OUTPUT_RATE (48 kHz) -> AudioDriver (real-time blocks, segments, mic)
        -> PlayoutBuffer (the driving audio, full band)  -> next_audio()  (48 kHz, MediaClock)
        -> resampled to the model's rate -> pipeline Session.push_audio -> the live engine
           (one generation loop for every session of the process: talkloop/pipeline/core/engine.py)
        -> FrameQueueSink (bounded, drops the oldest)  -> next_video()  (same clock)
    playback events (started, finished with position) come from next_audio(): "played" means
    emitted by the audio output, never merely queued.

Consume the output either with ``async for item in session`` (video frames, audio frames and
playback events in media order) or with ``next_video()`` / ``next_audio()`` from two consumers
(the WebRTC tracks do this); not both.

A reply that arrives ahead of real time (an agent's TTS) starts at once: its first audio takes
the place of idle driving audio that was produced but not yet played, the chunks made from that
silence are made again from the reply (``Session.rewind``) and their frames withheld, and the
media clock jumps over the idle media still queued before it (``MediaClock.skip``), so the reply
plays as soon as its first chunk can be generated instead of a whole playout delay later
(``_start_reply_early``). Audio and video stay on one clock; their timestamps count played time
(continuous across a jump); the segment's positions count from where it really started.

Interrupting (``clear_buffer``) drops every unplayed sample of every queued segment, silences the
driving audio from the next sample the audio output will emit, and withholds the frames that were
already generated from the dropped audio: the video holds its last frame until frames made from
the silence that replaced it arrive (at most the playout delay).

Full-band audio: the output runs at ``OUTPUT_RATE`` (48 kHz) whatever the sources' rates, so a
24 kHz agent voice or espeak's 22 kHz keeps its whole band (the model only needs 16 kHz: it reads
the same blocks resampled once more). Each source is resampled once to 48 kHz; 48 kHz sources (the
browser's Opus microphone) pass through untouched. A call's decoded microphone frames
(``add_microphone_frame``) are converted off the event loop: the loop only queues them, a worker
thread turns them into float mono, and each driver tick takes every frame that arrived before it
(``FrameConverter``, ``talkloop/pipeline/audio/resample.py``). Every ``pts`` this class emits
counts samples at ``sample_rate`` (48 kHz), for audio and video alike. Mirrors (a KVS copy) get
the same full-band audio (``talkloop/pipeline/outputs/fullband.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from talkloop.agent.clock import Clock, Lateness, MediaClock, RealClock, av_offset_ms
from talkloop.agent.driver import AudioDriver
from talkloop.agent.frames import AudioFrame, PlaybackEvent, PlaybackFinished, VideoFrame
from talkloop.agent.tts import EspeakTTS
from talkloop.pipeline.audio.resample import FrameConverter, StreamResampler, resample
from talkloop.pipeline.backends.report import describe
from talkloop.pipeline.core.clock import frame_start_sample
from talkloop.pipeline.core.engine import Engine, Stream, default_engine
from talkloop.pipeline.core.errors import BusyError, SessionClosedError
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.core.session import Session
from talkloop.pipeline.outputs.fullband import FullBandSink
from talkloop.pipeline.outputs.queue import FrameQueueSink, LiveFrame
from talkloop.pipeline.outputs.sink import Sink

log = logging.getLogger("talkloop.agent")

BLOCK_S = 0.02  # driver tick and audio output frame: 20 ms, what WebRTC and Opus use
# The rate of the audio an avatar emits: Opus's own rate, and at least every supported source's,
# so no voice loses band on its way out (docs/architecture.md, "Live calls").
OUTPUT_RATE = 48000
MAX_CUTS = 64  # interrupts remembered for withholding frames (older frames are long gone)
# Lines of built-in TTS waiting behind the one being spoken; one more is refused with BusyError.
# A session speaks one line at a time anyway; a deeper queue only lets one client hold espeak.
MAX_QUEUED_SAYS = 3
# How long a reply may wait for enough of its audio to start early (see _start_reply_early).
REPLY_HOLD_S = 0.16
# What a reply's lead keeps to spare beyond the chunk time it expects. The measured chunk time
# missed a reply's first chunk by 0-26 ms (twenty replies, 2-core Zen 4, 2026-12-04); the jump's
# rounding down to a block (0-20 ms) absorbs most of that: 0 late frames in 50 replies, 1 in 70
# with the older rounding to a frame (docs/benchmarks.md).
REPLY_MARGIN_S = 0.01


def default_playout_s(pipeline: Pipeline) -> float:
    """The playout delay at which a generator that keeps up with real time shows every frame.

    A chunk can start once the audio of its last frame plus the look-ahead has arrived (one chunk
    of audio after its first frame's); generating it may take up to one chunk's duration if
    generation is to keep up at all; one driving block covers the hand-off (audio is taken in
    20 ms blocks). So: two chunks plus the look-ahead plus 20 ms (2-frame chunks at 25 fps with
    a 40 ms look-ahead: 220 ms). Two blocks (until 2026-12-02) added 20 ms and kept no frame
    more on time (docs/benchmarks.md, live calls on the Zen 5, 2026-12-02).
    """
    info = pipeline.info
    chunk = pipeline.config.schedule.n_len / info.fps
    return 2 * chunk + pipeline.lookahead_samples / info.sample_rate + BLOCK_S


class AvatarConfig(BaseModel):
    """Settings of a live avatar session (the chunk schedule is in the root config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    playout_delay_ms: int | None = Field(
        None,
        ge=50,
        le=5000,
        description="driving audio -> playout; None: derived from the chunk schedule "
        "(see default_playout_s)",
    )
    queue_seconds: float = Field(2.0, gt=0, le=30, description="published frames held at most")
    max_mic_backlog_ms: int = Field(200, ge=20, le=5000)
    max_lag_ms: int = Field(
        1000,
        ge=100,
        le=60000,
        description="generation this far behind skips whole chunks (the bound is lower when the "
        "measured chunk time says the next chunk could not play on time anyway)",
    )
    reply_lead_ms: int | None = Field(
        None,
        ge=0,
        le=5000,
        description="how far ahead of now a reply that arrives early starts playing; None: "
        "what is left of the chunk being made, a recent chunk time (the reply's first) and "
        "REPLY_MARGIN_S (two chunk times and a driver block before any chunk was measured)",
    )
    max_pending_speech_s: float = Field(
        120.0, gt=0, le=3600, description="speech queued ahead of playback at most (backpressure)"
    )


class AvatarSession:
    """One avatar: speech in, paced lip-synced video and the same audio out.

    Args:
        pipeline: a loaded pipeline (modules are shared between sessions).
        reference: (H, W, 3) uint8 avatar image; also the idle frame before the first one.
        prompt: initial style prompt.
        config: live settings.
        clock: time source; ``ManualClock`` in tests.
        name: used in thread names and logs.
        mirrors: extra sinks that get a copy of the stream (e.g. a KvsSink); they must not block.
        executor: runs the built-in TTS and the blocking parts of closing; None: the loop's
            default executor (a server passes its own, so media encoding never waits on them).
        engine: generates the chunks, with every other session's; None: the process's own
            (:func:`~talkloop.pipeline.core.engine.default_engine`).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        reference: np.ndarray,
        prompt: str = "",
        config: AvatarConfig | None = None,
        clock: Clock | None = None,
        name: str = "avatar",
        mirrors: Sequence[Sink] = (),
        executor: Executor | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.config = config = config or AvatarConfig()
        self.engine = engine or default_engine()
        self.executor = executor
        self.pipeline = pipeline
        self.name = name
        info = self.info = pipeline.info
        self.model_rate = info.sample_rate  # what the pipeline reads (16 kHz)
        self.sample_rate = OUTPUT_RATE  # what this session emits, and the unit of every pts
        self.frames = FrameQueueSink(
            max(1, int(config.queue_seconds * info.fps)), policy="drop_oldest"
        )
        # Mirrors (a KVS copy) get every published segment too; they never block (their contract).
        self.mirrors = list(mirrors)
        # ...with the full-band audio of the frames they get, not the model's 16 kHz.
        full_band = [FullBandSink(m, OUTPUT_RATE, self._read_output) for m in self.mirrors]
        self.session: Session = pipeline.open_session(reference, prompt, [self.frames, *full_band])
        self.clock: Clock = clock or RealClock()
        self.playout_s = (
            default_playout_s(pipeline)
            if config.playout_delay_ms is None
            else config.playout_delay_ms / 1000
        )
        self.media = MediaClock(info.sample_rate, self.playout_s, self.clock)
        self.block = int(round(BLOCK_S * info.sample_rate))
        self.driver = AudioDriver(
            self._push,
            self.media,
            info.sample_rate,
            block=self.block,
            max_mic_backlog_s=config.max_mic_backlog_ms / 1000,
            playout_s=max(4.0, 4 * self.playout_s),
            max_pending_s=config.max_pending_speech_s,
            out_rate=OUTPUT_RATE,
        )
        self._mic = StreamResampler(OUTPUT_RATE)
        # Decoded microphone frames, converted on a worker thread; the tick takes them.
        self._mic_frames = FrameConverter(OUTPUT_RATE, name=f"mic-{name}")
        self.listeners: list[Callable[[PlaybackEvent], None]] = []
        # Called once, on the event loop, if generation fails (the session is then dead: its
        # video would hold the last frame forever). Not called for a close.
        self.failure_listeners: list[Callable[[BaseException], None]] = []
        self._resamplers: dict[str, StreamResampler] = {}  # per source
        self._say_tasks: set[asyncio.Task] = set()
        self._last_say: asyncio.Task | None = None  # the newest line; the next one waits for it
        self._cuts: dict[int, int] = {}  # audio epoch -> first sample it silenced
        self._epoch = 0
        self._audio_next = 0  # next sample the audio output emits
        self._video_next = 0  # next frame index the video output emits
        self._pending: LiveFrame | None = None
        # The media clock's skip each output has applied (an early reply jumps it ahead).
        self._audio_skipped = self._video_skipped = 0
        self._idle_before = 0  # frames below this index were passed over by a jump
        self._held_since: float | None = None  # when the next reply started waiting to go early
        self.early_replies = 0  # replies that started ahead of the playout delay
        # The latest early start: ms its audio waited (from its first audio to the start) and
        # from the start until its first sample plays (the lead, then the next block).
        self.early_reply: dict[str, float] | None = None
        self._last_rgb = reference
        self.frames_sent = self.late_frames = self.dropped_frames = self.withheld_frames = 0
        self.overrun_frames = 0
        self.idle_dropped_frames = 0  # idle frames an early reply's jump passed over
        self.video_lateness, self.audio_lateness = Lateness(), Lateness()
        self.driving_dropped_samples = 0
        self.error: BaseException | None = None
        self._stream: Stream | None = None  # in the engine while generating
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._push_warned = False
        self.closed = False

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start generating and producing driving audio (call on the event loop). Idempotent."""
        if self._stream is not None or self.closed or self._tasks:
            return
        # Anchors the media clock on the engine's grid (now, or up to one chunk before).
        chunk_s = self.pipeline.config.schedule.n_len / self.info.fps
        self.driver.produce_due(self.engine.grid_start(self.clock.now, chunk_s))
        self._loop = asyncio.get_running_loop()
        self._stream = self.engine.add(
            self.session, self._deadline, self.lag_budget, self._generation_failed, self.clock.now
        )
        self._tasks.append(asyncio.get_running_loop().create_task(self._tick()))

    async def close(self) -> None:
        """Stop everything and release what the session held. Idempotent."""
        self.closed = True
        self._mic_frames.close()
        for task in [*self._tasks, *self._say_tasks]:
            task.cancel()
        for task in [*self._tasks, *self._say_tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self.frames.abort()  # drops held frames
        loop = asyncio.get_running_loop()
        if self._stream is not None:  # returns once no chunk of this session is generating
            await loop.run_in_executor(self.executor, self.engine.remove, self._stream)
        # Closing the pipeline session closes its mirrors too (a KVS uploader thread and its
        # connection): off the loop, as a mirror drains when closed. Idempotent.
        await loop.run_in_executor(self.executor, self.session.close)
        # Drop references so tensors, frames and audio buffers are freed now, not at GC time.
        self.session.state.clear()
        self._pending = None
        self.listeners.clear()

    # -- input -------------------------------------------------------------------------------------

    def push_audio(self, frame: AudioFrame, label: str | None = None, source: str = "") -> int:
        """Queue speech audio (any supported rate, mono or stereo) on ``source``'s open segment.

        Returns:
            The segment id (the one playback events report).

        Raises:
            AudioFormatError: the frame's declaration does not fit its bytes.
            BusyError: more than ``max_pending_speech_s`` is queued; the frame is dropped.
            SessionClosedError: the session was closed.
        """
        if self.closed:
            raise SessionClosedError("the avatar session is closed")
        frame.check()
        res = self._resamplers.get(source)
        if res is None:
            res = self._resamplers[source] = StreamResampler(OUTPUT_RATE)
        mono = res.push(frame.to_mono_float(), frame.sample_rate)
        segment = self.driver.push_speech(mono, label, source)
        if self.driver.started_at is not None and self.error is None:  # as the tick does
            self._start_reply_early()  # the moment its audio is here, not at the next tick
        return segment

    def end_of_segment(self, source: str = "") -> None:
        """The current segment of ``source`` is complete; it finishes when it has played."""
        res = self._resamplers.pop(source, None)
        if res is not None:
            tail = res.flush()  # the filter's last millisecond (48 samples from 16 kHz)
            # Only while the segment still has audio waiting: one that has all been produced
            # (its end came late) would otherwise play that millisecond as a blip after the
            # silence that followed it, and finish a playout delay later than it should.
            if tail.size and self.driver.queued_samples(source):
                with contextlib.suppress(BusyError):
                    self.driver.push_speech(tail, None, source)
        self._dispatch(self.driver.end_segment(source))

    def clear_buffer(self) -> list[PlaybackFinished]:
        """Interrupt: drop all unplayed speech, now. Returns the finished events it caused.

        No sample or frame made from the dropped audio is emitted afterwards; each dropped
        segment gets ``PlaybackFinished(interrupted=True)`` with the position actually played.
        """
        for task in self._say_tasks:
            task.cancel()
        self._resamplers.clear()
        cut = self._audio_next
        events = self.driver.interrupt(cut)
        if events:
            self._new_epoch(self.session.silence_unconsumed_audio(from_sample=cut), cut)
        self._dispatch(events)
        return [e for e in events if isinstance(e, PlaybackFinished)]

    def say(self, text: str, tts: object | None = None) -> asyncio.Task:
        """Speak ``text`` with the built-in TTS as one segment, streamed as it is synthesised.

        One line at a time: a line said while another is being spoken waits for it (up to
        ``MAX_QUEUED_SAYS`` lines wait). ``clear_buffer`` cancels the line and the queue.

        Args:
            text: what to say.
            tts: an object with ``stream(text)`` yielding AudioFrames; default espeak-ng.

        Returns:
            The task feeding it.

        Raises:
            BusyError: ``MAX_QUEUED_SAYS`` lines are already waiting.
            SessionClosedError: the session was closed.
        """

        if self.closed:
            raise SessionClosedError("the avatar session is closed")
        if len(self._say_tasks) > MAX_QUEUED_SAYS:
            raise BusyError(
                f"the avatar is already speaking and {MAX_QUEUED_SAYS} more lines are queued; "
                "wait for them to finish, or interrupt"
            )
        engine = tts if tts is not None else EspeakTTS(executor=self.executor)
        source = f"say-{id(text)}-{len(self._say_tasks)}"
        previous = self._last_say

        async def feed() -> None:
            if previous is not None and not previous.done():
                await asyncio.wait({previous})  # not `await previous`: its cancel is not ours
            try:
                async for frame in engine.stream(text):  # type: ignore[attr-defined]
                    while self.pending_s + frame.duration_s > self.config.max_pending_speech_s:
                        await self.clock.sleep_until(self.clock.now() + BLOCK_S)
                    self.push_audio(frame, label=None, source=source)
            finally:
                if not self.closed:
                    self.end_of_segment(source)

        task = asyncio.get_running_loop().create_task(feed())
        self._say_tasks.add(task)
        self._last_say = task
        task.add_done_callback(self._say_tasks.discard)
        return task

    def add_microphone(
        self, samples: np.ndarray, arrived_at: float | None = None, sample_rate: int = OUTPUT_RATE
    ) -> None:
        """Microphone audio (float32 mono at ``sample_rate``); ducked while speech plays."""
        mono = self._mic.push(samples, sample_rate)
        if mono.size:
            self.driver.add_mic(mono, arrived_at)

    def add_microphone_frame(self, frame: object, arrived_at: float | None = None) -> None:
        """A decoded microphone frame (a PyAV ``AudioFrame``: any format, layout and rate), as it
        arrived. Only queued here: a worker thread converts it (channels averaged, resampled to
        ``sample_rate``) and the next driver tick takes it with ``arrived_at`` (default: now), so
        the driving audio and its arrival times are those ``add_microphone`` would give."""
        at = self.clock.now() if arrived_at is None else arrived_at
        self._mic_frames.put(frame, at)  # type: ignore[arg-type]

    def _take_microphone(self) -> None:
        """Hand the microphone frames that arrived since the last tick to the driver."""
        for samples, at in self._mic_frames.take():
            if samples.size:
                self.add_microphone(samples, at)

    def set_prompt(self, text: str) -> None:
        """New style prompt, from the next chunk on."""
        self.session.set_prompt(text)

    @property
    def pending_s(self) -> float:
        """Speech queued and not yet produced (the backpressure measure)."""
        return self.driver.tts_pending_s

    async def wait_for_room(self, seconds: float = 0.0) -> None:
        """Wait until ``seconds`` more speech fits under ``max_pending_speech_s``."""
        limit = max(0.0, self.config.max_pending_speech_s - seconds)
        while self.pending_s > limit and not self.closed:
            await self.clock.sleep_until(self.clock.now() + BLOCK_S)

    # -- output ------------------------------------------------------------------------------------

    async def next_audio(self) -> AudioFrame:
        """The next 20 ms of output audio (at ``sample_rate``), returned at its play-out time.

        Raises:
            SessionClosedError: the session was closed.
        """
        await self._wait_started()
        n, skipped = self._audio_next, self.media.skipped
        if skipped > self._audio_skipped:  # the clock jumped: the idle audio passed over goes
            self.driver.played(n, skipped - self._audio_skipped)
            n += skipped - self._audio_skipped
            self._audio_skipped = skipped
        due = self.media.due(n)
        pts = self.driver.out_index(n - skipped)  # played time: continuous across a jump
        await self.clock.sleep_until(due)
        if self.closed:
            raise SessionClosedError("the avatar session is closed")
        self.audio_lateness.add(self.clock.now() - due)
        # Read after the sleep: an interrupt during it has silenced these samples already.
        samples = self.driver.playout.read(self.driver.out_index(n), self.driver.out_block)
        segment = self.driver.segment_of(n)
        self._audio_next = n + self.block
        events = self.driver.played(n, self.block)
        frame = AudioFrame.from_float(samples, self.sample_rate, pts=pts, segment_id=segment)
        self._dispatch(events)
        return frame

    async def next_video(self) -> VideoFrame:
        """The next video frame, returned at its play-out time.

        A frame that is not ready when due is replaced by the previous one (``late_frames``); a
        frame made from interrupted audio is too (``withheld_frames``). Frames that arrive after
        their time are dropped (``dropped_frames``). So slow generation costs video, never audio.
        A caller that comes after the next frame was already due (a slow encoder, a busy event
        loop) gets the frame due now, not the one after its last: the frame slots it missed are
        counted (``overrun_frames``) and the video's lag cannot build up.

        Raises:
            SessionClosedError: the session was closed.
        """
        await self._wait_started()
        j, skipped = self._video_next, self.media.skipped
        if skipped > self._video_skipped:  # the clock jumped: the frames it passed are idle
            # The frame on show (its timestamp taken before the jump) plays on until the next
            # frame whose played time comes after its own: a jump of part of a frame shortens it.
            jumped = skipped - self._video_skipped
            passed = jumped * self.info.fps // self.info.sample_rate
            j += passed
            self.idle_dropped_frames += passed
            self._idle_before = j  # frames made for them, if any, are not counted as dropped
            self._video_skipped = skipped
        now = self.clock.now()
        while self.media.due(self.info.frame_pts(j + 1)) <= now:
            j += 1
            self.overrun_frames += 1
        media_pts = self.info.frame_pts(j)
        due = self.media.due(media_pts)
        pts = self.driver.out_index(media_pts - skipped)  # played time, like the audio's
        await self.clock.sleep_until(due)
        if self.closed:
            raise SessionClosedError("the avatar session is closed")
        self.video_lateness.add(self.clock.now() - due)
        live = self._take(j)
        if live is None:
            self.late_frames += 1
        if live is not None:
            self._last_rgb = live.rgb
        self._video_next = j + 1
        self.frames_sent += 1
        return VideoFrame(self._last_rgb, j, pts, self.sample_rate, held=live is None)

    async def stream(self) -> AsyncIterator[VideoFrame | AudioFrame | PlaybackEvent]:
        """Video frames, audio frames and playback events, in media order, paced in real time.

        An event follows the audio frame that caused it (``clear_buffer``'s come next). Ends
        when the session is closed.
        """
        events: deque[PlaybackEvent] = deque()
        self.listeners.append(events.append)
        try:
            while not self.closed:
                while events:
                    yield events.popleft()
                try:
                    if self._audio_next <= self.info.frame_pts(self._video_next):
                        yield await self.next_audio()
                    else:
                        yield await self.next_video()
                except SessionClosedError:
                    return
        finally:
            with contextlib.suppress(ValueError):
                self.listeners.remove(events.append)

    def __aiter__(self) -> AsyncIterator[VideoFrame | AudioFrame | PlaybackEvent]:
        return self.stream()

    def lag_budget(self) -> float:
        """Most audio backlog (s) at which generating the next chunk still shows some of it.

        Frame ``i`` of an ``n``-frame chunk plays ``playout_delay`` after its audio arrived. The
        chunk is generated once the audio of its last frame plus the look-ahead has arrived, after
        the backlog ``L`` ahead of it, and is published ``C`` (its measured compute time) later.
        Its last frame is on time only if ``L <= playout - lookahead - C - 1 / fps``; with more
        backlog than that every frame of the chunk would be dropped as late, so skipping it
        (catching up a whole chunk of lag) is better. ``max_lag_ms`` caps the bound.
        """
        took = self.session.stats.chunk_seconds or 0.0
        lookahead = self.pipeline.lookahead_samples / self.model_rate
        # Since an early reply's jump, production may run short of the playout delay.
        playout = self.playout_s - self.driver.shortfall / self.model_rate
        budget = playout - lookahead - took - 1 / self.info.fps
        return min(self.config.max_lag_ms / 1000, max(BLOCK_S, budget))

    # -- figures -----------------------------------------------------------------------------------

    def stats(self) -> dict[str, float | int | str | None]:
        s = self.session.stats
        media = max(s.frames / self.info.fps, 1e-9)
        return {
            "frames_sent": self.frames_sent,
            "late_frames": self.late_frames,
            "dropped_frames": self.dropped_frames + self.frames.dropped_frames,
            "withheld_frames": self.withheld_frames,
            "early_replies": self.early_replies,
            "early_reply": self.early_reply,
            "overrun_frames": self.overrun_frames,
            "idle_dropped_frames": self.idle_dropped_frames,
            "skipped_frames": s.skipped_frames,
            "frames_generated": s.frames,
            "rtf": round(s.generate_seconds / media, 3) if s.frames else None,
            # where the generation time goes: seconds per second of video, per "phase/stage"
            "stage_rtf": {k: round(v, 3) for k, v in s.stage_rtf(self.info.fps).items()},
            # what computes the frames: {"backend", "dtype", "int8"} (talkloop/pipeline/backends/report.py)
            "runtime": describe(self.pipeline.modules, self.pipeline.compute_dtype),
            "playout_delay_ms": round(self.playout_s * 1000),
            "engine": self.engine.figures(),  # the process's live engine, every call together
            "av_offset_ms": av_offset_ms(self.video_lateness, self.audio_lateness),
            "queue_depth": self.frames.depth,
            "speech_pending_s": round(self.pending_s, 2),
            "mic_dropped_ms": round(1000 * self.driver.mic_dropped_samples / OUTPUT_RATE),
            "mic_backlog_ms": round(1000 * self.driver.mic_backlog_samples / OUTPUT_RATE),
            "mic_trimmed_ms": round(1000 * self.driver.mic_trimmed_samples / OUTPUT_RATE),
            "error": None if self.error is None else str(self.error),
            "mirrors": [m.status.line() for m in self.mirrors if hasattr(m, "status")],
        }

    # -- internals ---------------------------------------------------------------------------------

    def _dispatch(self, events: list[PlaybackEvent]) -> None:
        for event in events:
            for listener in list(self.listeners):
                try:
                    listener(event)
                except Exception:  # a broken listener must not break playback
                    log.exception("%s: playback listener failed", self.name)

    def _new_epoch(self, epoch: int, cut: int) -> None:
        """Frames of older epochs from sample ``cut`` on are withheld (an interrupt's or an early
        reply's); the last ``MAX_CUTS`` cuts are kept, so a long session keeps a bounded map."""
        self._epoch = epoch
        self._cuts[epoch] = cut
        for old in [e for e in self._cuts if e <= epoch - MAX_CUTS]:
            del self._cuts[old]

    def _withheld(self, live: LiveFrame) -> bool:
        """True when ``live`` was made from audio that an interrupt dropped before it played."""
        if live.epoch >= self._epoch:
            return False
        cut = self._cuts.get(live.epoch + 1)
        return cut is None or live.pts >= cut

    def _take(self, j: int) -> LiveFrame | None:
        """The frame for index ``j`` if it is here; drops frames older than ``j``."""
        while True:
            if self._pending is None:
                try:
                    self._pending = self.frames.get(timeout=0)
                except TimeoutError:
                    return None
                if self._pending is None:  # the queue was closed
                    return None
            if self._withheld(self._pending):  # made from audio an interrupt or a reply replaced
                self._pending = None
                self.withheld_frames += 1
                continue
            if self._pending.index < j:
                if self._pending.index >= self._idle_before:
                    self.dropped_frames += 1
                self._pending = None
                continue
            if self._pending.index == j:
                frame, self._pending = self._pending, None
                return frame
            return None  # a future frame: keep it for later

    async def _wait_started(self) -> None:
        while not self.media.started:
            if self.closed:
                raise SessionClosedError("the avatar session is closed")
            await asyncio.sleep(0.005)

    async def _tick(self) -> None:
        """Produce driving blocks on absolute tick times (no drift), from the anchor on."""
        start = self.driver.started_at
        assert start is not None  # start() anchored it
        k = 0
        while self.error is None:  # a failed generation loop takes no more driving audio
            self._take_microphone()
            self._start_reply_early()
            self.driver.produce_due(self.clock.now())
            k += 1
            await self.clock.sleep_until(start + k * BLOCK_S)

    def _start_reply_early(self) -> None:
        """Start the next reply at once, if its audio is here ahead of time (on every tick and
        whenever speech arrives).

        The driving audio produced but not yet played is idle, and a reply behind it would wait
        the whole playout delay. A reply that arrives faster than real time takes its place from
        a chunk start ``s`` on (``AudioDriver.rewrite``; the session makes the chunks from ``s``
        again, from the reply: ``Session.rewind``). When everything not yet played is idle, the
        media clock jumps ahead (``AudioDriver.skip``) so that ``s`` plays ``lead`` from now:
        the rest of the making of a chunk being made now (its frames, if they come after ``s``,
        are dropped rather than waited for), a recent chunk time for the reply's first, and
        ``REPLY_MARGIN_S`` (then on the next audio block: the jump moves by whole blocks). The idle
        frames and audio before it that would still have played are passed over. ``s`` is then
        the latest chunk start before which every frame is made (a later one would leave frames
        to play before the reply that nobody made in time), and the reply needs its first chunk
        and the look-ahead up front; where it has less than the idle audio produced from ``s``
        on, the idle blocks past its audio are forgotten (production goes back to where its
        audio ends). Without a jump (a reply still playing
        out), ``s`` must play at least ``lead`` from now, the earliest such start plays soonest,
        and the reply needs all the audio produced from ``s`` on plus the look-ahead. The reply
        waits up to ``REPLY_HOLD_S`` for its audio to fill the start that plays soonest, then
        takes the best start it fills, or starts on the clock. (With 2-frame chunks and a 40 ms
        look-ahead a reply sent at 2x real time fills its first chunk in 60 ms; it plays a lead
        later, on the next block.)
        """
        seg = self.driver.unstarted_speech()
        if seg is None:
            self.driver.hold, self._held_since = False, None
            return
        now = self.clock.now()
        if self._held_since is None:
            self._held_since, self.driver.hold = now, True
        info, rate = self.info, self.model_rate
        chunk_s = self.pipeline.config.schedule.n_len / info.fps
        stats, running = self.session.stats, self.session.running_seconds
        took, making = stats.chunk_seconds, stats.make_seconds
        if self.config.reply_lead_ms is not None:
            lead = self.config.reply_lead_ms / 1000
        elif took is None or making is None:  # nothing measured yet: a chunk, the reply's first
            lead = 2 * chunk_s + BLOCK_S
        else:  # the chunk being made now is made first (its frames are dropped, not waited for)
            rest = 0.0 if running is None else max(0.0, making - running)
            lead = rest + took + REPLY_MARGIN_S
        queued = seg.queued * rate // self.sample_rate  # model samples
        produced = self.driver.samples
        jump = self.driver.idle_from(self._audio_next)  # nothing still to play is speech
        made = frame_start_sample(self.session.made_until, info.fps, rate)

        def plays_at(s: int) -> float:
            # With a jump: the lead from now, and after the frames before it not made yet.
            due = self.media.due(s)
            return min(due, now + lead + max(0, s - made) / rate) if jump else due

        points = sorted(
            (
                (plays_at(s), -s, f, s)
                for f in self.session.rewind_points()
                if (s := frame_start_sample(f, info.fps, rate)) < produced
                and self.media.due(s) >= now + lead
                and self.driver.idle_from(s)
            ),
        )  # the soonest first; of equals, the latest start (it needs the least audio)
        # The audio it needs up front: without a jump, all that was produced from ``s`` on (it
        # plays as it stands) and the look-ahead; with one, no more than its first chunk and
        # the look-ahead: the idle blocks produced after the audio it has are forgotten.
        chunk = frame_start_sample(self.pipeline.config.schedule.n_len, info.fps, rate)
        look = self.pipeline.lookahead_samples
        enough = [
            p
            for p in points
            if (min(produced - p[3], chunk) if jump else produced - p[3]) + look <= queued
        ]
        timed_out = now - self._held_since >= REPLY_HOLD_S
        if enough and (enough[0] == points[0] or timed_out):
            at, _, frame, start = enough[0]
            # The jump passes over idle audio only (the audio output may be emitting the block
            # before ``_audio_next`` still), by whole blocks: the audio output's frames stay
            # whole; the video's frame on show when it jumps is shown that much shorter.
            skip = int((self.media.due(start) - at) * rate + 1e-6)
            skip = max(0, min(skip, start - self._audio_next - self.block))
            skip = skip // self.block * self.block
            keep = look * self.sample_rate // rate  # its look-ahead stays queued, at least
            model = resample(self.driver.rewrite(start, keep), self.sample_rate, rate)
            span = self.driver.samples - start  # what the reply rewrote (all, or it ran out)
            model = np.pad(model[:span], (0, max(0, span - model.shape[0])))
            self._new_epoch(self.session.rewind(frame, model), start)
            if skip > 0:
                self.driver.skip(skip)
            self.early_replies += 1
            self.early_reply = {
                "waited_ms": round(1000 * (now - self._held_since), 1),
                "plays_in_ms": round(1000 * (self.media.due(start) - now), 1),
            }
            self.driver.hold, self._held_since = False, None
            self.driver.produce_due(now)  # the reply's audio already here goes to the model now
        elif timed_out or not points:
            # Waited long enough, or no chunk start plays late enough to be made again in time
            # (waiting for one would cost more than it could gain): it starts on the clock.
            self.driver.hold, self._held_since = False, None

    def _read_output(self, start: int, count: int) -> np.ndarray | None:
        """Output samples ``[start, start + count)`` as played out (mirrors; generation thread);
        None when the playout buffer no longer holds them.

        The mirrors ask for audio the generation loop has just published, which the driver put
        in the playout buffer before the pipeline could read it and which the buffer holds for
        seconds more (at least 4 s; a published chunk is at most ``max_lag_ms`` behind, 1 s by
        default): no lock is needed.
        """
        playout = self.driver.playout
        if start < playout.held_from:
            return None
        return playout.read(start, count)

    def _push(self, block: np.ndarray) -> None:
        try:
            self.session.push_audio(block, timeout=0)
        except TimeoutError:  # generation is stalled far behind: never block the event loop
            self.driving_dropped_samples += block.shape[0]
        except Exception as err:  # session closed under us
            # Once: this runs every 20 ms, and the cause (a failed generation) is logged apart.
            if not self.closed and not self._push_warned:
                self._push_warned = True
                log.warning("%s: driving audio rejected: %s", self.name, err)

    @property
    def generating(self) -> bool:
        """True while the engine runs this session's chunks (from ``start`` to ``close`` or
        a failure)."""
        return self._stream is not None and not self._stream.ended

    def _deadline(self, frame: int) -> float:
        """When frame ``frame`` plays (the engine's order: earliest first)."""
        if not self.media.started:
            return float("-inf")
        return self.media.due(self.info.frame_pts(frame))

    def _generation_failed(self, err: BaseException) -> None:
        """The engine's report that this session's chunk failed (its thread): the session is
        dead, the others go on."""
        if self.closed:  # closing aborts the frame queue under a running step: not a fault
            log.debug("%s: generation stopped by close: %s", self.name, err)
            return
        self.error = err
        log.error("%s: generation failed", self.name, exc_info=err)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._failed, err)

    def _failed(self, err: BaseException) -> None:
        if self.closed:
            return
        for listener in list(self.failure_listeners):
            try:
                listener(err)
            except Exception:
                log.exception("%s: failure listener failed", self.name)
