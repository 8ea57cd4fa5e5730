"""Session: one avatar stream's loop over the N/I timeline, its input and its statistics.

Thread model: ``push_audio``/``end_audio``/``set_prompt`` may be called from any thread; the
``step``/``render``/``run_live`` loop runs on one worker thread (live calls: the process's engine,
``engine.py``, steps every call's session on its own thread, several at once with
:func:`step_sessions`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from talkloop.pipeline.core.clock import frame_start_sample, frames_for_samples
from talkloop.pipeline.core.errors import InputError, SessionClosedError
from talkloop.pipeline.core.records import AudioChunk, VideoChunk
from talkloop.pipeline.core.schedule import NChunk
from talkloop.pipeline.core.state import SessionState
from talkloop.pipeline.outputs.sink import Sink

if TYPE_CHECKING:
    from talkloop.pipeline.core.pipeline import Pipeline


@dataclass
class SessionStats:
    """Running figures of a session (constant size: no histories)."""

    frames: int = 0
    chunks: int = 0
    generate_seconds: float = 0.0
    first_frame_at: float | None = None  # perf_counter() when the first frame was published
    first_audio_at: float | None = None  # perf_counter() when the first audio sample arrived
    stage_seconds: dict[str, float] = field(default_factory=dict)  # per stage name, plus "sinks"
    skipped_frames: int = 0  # live catch-up (skip_chunk: the engine, run_live with max_lag_s)
    chunk_seconds: float | None = None  # recent wall time of one N chunk step (EMA), live budgets
    make_seconds: float | None = None  # the same until its motion was made (EMA, the rest: frames)

    @property
    def ttff_ms(self) -> float | None:
        if self.first_frame_at is None or self.first_audio_at is None:
            return None
        return (self.first_frame_at - self.first_audio_at) * 1000.0

    def stage_rtf(self, fps: float) -> dict[str, float]:
        """Where the time goes: seconds of each "phase/stage" per second of video published
        (their sum is at most the rtf). Safe to call from another thread than the loop's."""
        media = max(self.frames / fps, 1e-9)
        return {k: v / media for k, v in sorted(dict(self.stage_seconds).items())}


def _recent(last: float | None, took: float) -> float:
    """A running time's recent value (EMA), the first one as it is."""
    return took if last is None else 0.8 * last + 0.2 * took


REWIND_S = 0.5  # how far back a rewind can go: a live call's playout delay, with room to spare


@dataclass
class _Snapshot:
    """What a session kept just before it began a chunk: enough to make that chunk again."""

    next_n: int
    frames_published: int
    fields: dict
    prompt: str


@dataclass
class _Step:
    """One N chunk's inputs, taken from a session under its lock."""

    chunk: NChunk
    windows: np.ndarray
    total_samples: int | None
    t0: float
    epoch: int  # the audio epoch its audio was read in (VideoChunk.epoch of its frames)


@dataclass(eq=False)
class _Segment:
    """A chunk's latents in display order and their audio features, published in one go or,
    frame by frame, over several calls (``done``: the frames published so far)."""

    step: _Step
    latents: torch.Tensor | None
    audio: torch.Tensor | None
    done: int = 0
    dropped: bool = False  # a rewind goes back before it: its frames are made again, not these


class Session:
    """One avatar stream. Not created directly: use ``Pipeline.open_session``.

    Thread model: ``push_audio``/``end_audio``/``set_prompt`` may be called from any thread; the
    ``step``/``render``/``run_live`` loop runs on one worker thread.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        reference: np.ndarray,
        prompt: str,
        sinks: Sequence[Sink],
        seed: int,
    ) -> None:
        cfg = pipeline.config
        if reference.shape != (cfg.video.height, cfg.video.width, 3) or reference.dtype != np.uint8:
            raise InputError(
                f"reference must be a ({cfg.video.height}, {cfg.video.width}, 3) uint8 RGB array, "
                f"got {reference.shape} {reference.dtype}"
            )
        self.pipeline = pipeline
        self.seed = seed
        self.sinks = list(sinks)
        self.state = SessionState(pipeline.state_fields, prompt)
        self.stats = SessionStats()
        self._cond = threading.Condition()
        self._pending_prompt: str | None = None
        self._closed = False
        self._max_buffer = cfg.audio.sample_rate * 30  # backpressure bound for push_audio
        # Interrupts bump the audio epoch; each chunk records the epoch its audio was read in,
        # so consumers can tell frames made from since-interrupted audio (VideoChunk.epoch).
        self.audio_epoch = 0
        # Chunks made (their motion) but not yet published, oldest first: the engine may begin a
        # session's next chunk while the last one's frames are rendered (``step_sessions``'
        # ``computed``); a rewind drops those it goes back before (``_Segment.dropped``).
        self._unpublished: list[_Segment] = []
        # Chunks skipped while others were still unpublished: first frame -> the frame after.
        self._skips: dict[int, int] = {}
        self._broken: BaseException | None = None  # a publish that failed: later ones give up
        # Called (no arguments, any thread) when audio arrives or ends and when the session
        # closes: the live engine waits on these instead of polling.
        self.listeners: list[Callable[[], None]] = []
        self._snapshots: deque[_Snapshot] = deque()  # the last REWIND_S of chunk starts
        self._pending_rewind: int | None = None  # the frame a rewind goes back to
        self._step_t0: float | None = None  # perf_counter() when the running chunk began
        # The N chunk begun and not yet made (``_begin_step`` until ``_segment``): the timeline
        # moves past it only once it is made, so it must not be skipped meanwhile.
        self._making: NChunk | None = None
        pipeline.run_phase("init", {"reference_image": reference, "prompt": prompt}, self.state)
        opened: list[Sink] = []
        try:
            for sink in self.sinks:
                sink.open(pipeline.info)
                opened.append(sink)
        except BaseException:
            for sink in opened:
                sink.abort()
            raise

    # -- input ------------------------------------------------------------------------------------

    def push_audio(self, samples: np.ndarray, timeout: float | None = None) -> None:
        """Append driving audio: float32 mono at the pipeline's sample rate.

        Blocks while more than 30 s of audio is waiting (backpressure), up to ``timeout``.
        """
        samples = np.asarray(samples)
        if samples.ndim != 1 or not np.issubdtype(samples.dtype, np.floating):
            raise InputError(
                f"audio must be a 1-D float array (mono), got {samples.shape} {samples.dtype}"
            )
        if not np.all(np.isfinite(samples)):
            raise InputError("audio contains NaN or infinite samples")
        with self._cond:
            if self._closed or self.state.audio.ended:
                raise SessionClosedError("cannot push audio: the session's audio has ended")
            buf = self.state.audio
            if not self._cond.wait_for(
                lambda: buf.samples.shape[0] < self._max_buffer or self._closed, timeout
            ):
                raise TimeoutError("audio buffer full: the pipeline is behind")
            if self.stats.first_audio_at is None and samples.size:
                self.stats.first_audio_at = time.perf_counter()
            buf.append(samples)
            self._cond.notify_all()
        self._tell()

    def end_audio(self) -> None:
        """No more audio will come: the remaining chunks run with the audio received."""
        with self._cond:
            self.state.audio.ended = True
            self._cond.notify_all()
        self._tell()

    def silence_unconsumed_audio(self, from_sample: int = 0) -> int:
        """Zero the audio no chunk has used yet (an interrupt): the avatar returns to idle.

        Args:
            from_sample: never zero audio before this sample (audio already played out).

        Returns:
            The new audio epoch: chunks whose audio was read before this call carry a lower one.
        """
        info, p = self.pipeline.info, self.pipeline
        with self._cond:
            used = frame_start_sample(self.state.frames_published, info.fps, info.sample_rate)
            buf = self.state.audio
            unused = used + p.lookahead_samples
            if self._pending_rewind is not None:  # a reply that started early, interrupted
                unused = min(unused, self._frame_sample(self._pending_rewind))
            start = max(unused, from_sample)
            buf.samples[max(0, start - buf.offset) :] = 0.0
            self.audio_epoch += 1
            return self.audio_epoch

    def rewind_points(self) -> list[int]:
        """The frames a :meth:`rewind` can start new audio at, oldest first: the starts of the
        chunks made in the last ``REWIND_S`` (made again), of the next chunk, and of the later
        ones whose audio has arrived (not made yet: only their audio is replaced)."""
        with self._cond:
            return self._rewind_points_locked()

    def _rewind_points_locked(self) -> list[int]:
        if self._pending_rewind is not None:
            return []
        points = [s.frames_published for s in self._snapshots]
        timeline, k = self.pipeline.timeline, self.state.next_n
        while (n := timeline.n_chunk(k)) is not None and (
            self._frame_sample(n.start) < self.state.audio.received
        ):
            if n.start not in points:
                points.append(n.start)
            k += 1
        return points or [self.state.frames_published]

    @property
    def running_seconds(self) -> float | None:
        """How long the chunk being made now has been running (None: no chunk is; its frames
        may still be being rendered and published: :attr:`busy`)."""
        t0 = self._step_t0
        return None if t0 is None else time.perf_counter() - t0

    @property
    def busy(self) -> bool:
        """A chunk is being made, or one made has frames still to publish."""
        with self._cond:
            return self._making is not None or bool(self._unpublished)

    @property
    def made_until(self) -> int:
        """The frames before this one are made (published or skipped); the chunk from it on,
        if it is being made, is not done yet."""
        with self._cond:
            return self.state.frames_published

    def rewind(self, frame: int, audio: np.ndarray) -> int:
        """Make the chunks from ``frame`` (one of :meth:`rewind_points`) again, on new audio.

        ``audio`` replaces the driving audio from ``frame``'s first sample on: what had arrived
        after it is dropped, and the rest of the new audio comes through ``push_audio``. A
        reply that arrived ahead of real time starts on frames already made from silence. The
        chunk being made now, if any, is made (on the audio it read when it began) and the
        session goes back before its next one; the chunks from ``frame`` on that are made but
        not yet all published are dropped at once (their frames are not rendered, or no more of
        them are). Frames published from the old audio carry the epoch from before this call.

        Returns:
            The new audio epoch (chunks begun from here on carry it).
        """
        with self._cond:
            if frame not in self._rewind_points_locked():
                raise ValueError(f"frame {frame} is not a rewind point of this session")
            # Now, not when the rewind is applied: audio pushed meanwhile follows the new audio.
            self.state.audio.replace_from(self._frame_sample(frame), audio)
            self._pending_rewind = frame
            for seg in self._unpublished:
                if seg.step.chunk.start >= frame:
                    seg.dropped = True
            self._unpublished = [seg for seg in self._unpublished if not seg.dropped]
            self._skips = {a: b for a, b in self._skips.items() if a < frame}
            self.audio_epoch += 1
            self._cond.notify_all()
            epoch = self.audio_epoch
        self._tell()
        return epoch

    def _frame_sample(self, frame: int) -> int:
        info = self.pipeline.info
        return frame_start_sample(frame, info.fps, info.sample_rate)

    def _rewind_chunk_locked(self) -> NChunk | None:
        """The chunk a pending rewind goes back to (its audio may not all be here: a reply
        that arrives ahead of real time is still arriving)."""
        for snap in self._snapshots:
            if snap.frames_published == self._pending_rewind:
                return self.pipeline.timeline.n_chunk(snap.next_n, self._total_frames())
        return self.next_chunk()  # a point at or after the next chunk

    def _apply_rewind(self) -> None:
        """(lock held, no chunk being made) Go back to the pending rewind's chunk; the chunks
        before it may still be publishing (``rewind`` dropped those after it)."""
        assert self._pending_rewind is not None
        frame, self._pending_rewind = self._pending_rewind, None
        snap = None
        while self._snapshots and self._snapshots[-1].frames_published >= frame:
            snap = self._snapshots.pop()
        if snap is not None and snap.frames_published == frame:
            self.state.next_n = snap.next_n
            self.state.frames_published = min(self.state.frames_published, frame)
            self.state.fields, self.state.prompt = snap.fields, snap.prompt
        elif frame < self.state.frames_published:  # rewind() checked it was a point
            raise RuntimeError(f"rewind point {frame} was lost")
        # (a point at or after the next chunk: nothing was made from its audio yet)

    def _tell(self) -> None:
        """Wake whoever runs this session's chunks (outside the lock: they take their own)."""
        for listener in list(self.listeners):
            listener()

    def set_prompt(self, prompt: str) -> None:
        """Change the text conditioning from the next chunk on."""
        with self._cond:
            self._pending_prompt = prompt

    # -- schedule ---------------------------------------------------------------------------------

    def _total_frames(self) -> int | None:
        buf, info = self.state.audio, self.pipeline.info
        return frames_for_samples(buf.received, info.fps, info.sample_rate) if buf.ended else None

    def _audio_needed(self, n: NChunk) -> int:
        """Samples that must have arrived before N chunk ``n`` can run (its last window's end)."""
        info = self.pipeline.info
        return (
            frame_start_sample(n.stop, info.fps, info.sample_rate) + self.pipeline.lookahead_samples
        )

    def next_chunk(self) -> NChunk | None:
        return self.pipeline.timeline.n_chunk(self.state.next_n, self._total_frames())

    @property
    def finished(self) -> bool:
        return self.state.audio.ended and self.next_chunk() is None

    def ready(self) -> bool:
        """True when ``step`` would generate a chunk without waiting for audio."""
        with self._cond:
            return self._ready_locked()

    def wait_ready(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: self._closed or self.finished or self._ready_locked(), timeout
            )

    def _ready_locked(self) -> bool:
        if self._pending_rewind is not None and self._making is not None:
            return False  # a rewind goes back once the chunk being made is made
        n = self.next_chunk() if self._pending_rewind is None else self._rewind_chunk_locked()
        return n is not None and (
            self.state.audio.ended or self.state.audio.received >= self._audio_needed(n)
        )

    # -- the loop ---------------------------------------------------------------------------------

    def step(self) -> int:
        """Generate and publish the next N chunk (and the I chunk before it) if its audio is here.

        Returns the number of frames published (0 when not ready or finished).
        """
        (result,) = step_sessions([self])
        if isinstance(result, BaseException):
            raise result
        return result

    def _begin_step(self) -> _Step | None:
        """The next N chunk's inputs, taken under the lock (None when it cannot run yet); the
        prompt phase runs here when the prompt changed."""
        if self._closed:
            raise SessionClosedError("the session is closed")
        p, state = self.pipeline, self.state
        with self._cond:
            if self._pending_rewind is not None:
                if self._making is not None:  # it goes back once the chunk being made is made
                    return None
                self._apply_rewind()
            if not self._ready_locked():
                return None
            n = self.next_chunk()
            assert n is not None  # _ready_locked checked it
            self._making = n
            # ``n.start``, not ``frames_published``: the last chunk's frames may still be out.
            self._snapshots.append(
                _Snapshot(state.next_n, n.start, dict(state.fields), state.prompt)
            )
            windows = self._windows(n)
            epoch = self.audio_epoch
            total_samples = state.audio.received if state.audio.ended else None
            prompt, self._pending_prompt = self._pending_prompt, None
        t0 = self._step_t0 = time.perf_counter()
        if prompt is not None and prompt != state.prompt:
            state.prompt = prompt
            p.run_phase("prompt", {"prompt": prompt}, state, self.stats.stage_seconds)
        return _Step(n, windows, total_samples, t0, epoch)

    def _n_chunk_work(self, step: _Step) -> dict:
        return {"job": step.chunk, "seed": self.seed, "audio_windows": step.windows}

    def _segment(self, step: _Step, work: dict) -> _Segment:
        """After the ``n_chunk`` phase: the chunk's latents in display order (the I chunk
        redone first, if the timeline has one), with the motion context rolled forward; its
        frames are then made and published by :meth:`_publish_segment`."""
        p, state, n = self.pipeline, self.state, step.chunk
        latents, chunk_audio = work.pop("latents"), work.pop("chunk_audio")
        del work
        segments = p.timeline.segments_after(n)
        if len(segments) == 2:  # an I chunk redoes the first frames of n
            i_job = segments[0].source
            i_work = p.run_phase(
                "i_chunk",
                {
                    "job": i_job,
                    "seed": self.seed,
                    "next_latents": latents,
                    "next_audio": chunk_audio,
                },
                state,
                self.stats.stage_seconds,
            )
            display = torch.cat([i_work.pop("latents"), latents[i_job.length :]])
            del i_work
        else:
            display = latents
        # Roll the motion context forward: the tail of the newest N chunk and its audio features.
        ctx_len = min(p.config.schedule.ctx_len, latents.shape[0])
        state.fields["context_latents"] = latents[-ctx_len:].clone()
        state.fields["context_audio"] = chunk_audio[-ctx_len:].clone()
        seg = _Segment(step, display, chunk_audio)
        self.stats.make_seconds = _recent(self.stats.make_seconds, time.perf_counter() - step.t0)
        with self._cond:  # the next chunk may begin now; this one's frames are still to come
            state.next_n += 1
            self._making = None
            if self._step_t0 == step.t0:
                self._step_t0 = None
            if self._pending_rewind is not None and n.start >= self._pending_rewind:
                seg.dropped = True  # a rewind asked for while it was made goes back before it
            else:
                self._unpublished.append(seg)
        return seg

    def _publish_segment(self, seg: _Segment, count: int | None = None) -> None:
        """Make and publish the next ``count`` frames of ``seg`` (None: all that are left; only a
        family whose ``publish`` makes each frame from its own latents alone,
        ``FamilySpec.publish_per_frame``, is given fewer; ``seg.done`` counts them). After the
        chunk's last frame its step is over: timed, counted, the session's timeline moved on."""
        p, state, n = self.pipeline, self.state, seg.step.chunk
        if seg.dropped:
            seg.latents = seg.audio = None
        if seg.latents is None or seg.audio is None:  # all published already, or dropped
            return
        lo, total = seg.done, seg.latents.shape[0]
        hi = total if count is None else min(total, lo + count)
        if lo == 0:  # frames go out in order: after the session's chunk before this one
            with self._cond:
                self._cond.wait_for(
                    lambda: (
                        state.frames_published >= n.start
                        or seg.dropped
                        or self._closed
                        or self._broken
                    )
                )
                if seg.dropped:
                    seg.latents = seg.audio = None
                    return
                if state.frames_published < n.start:
                    raise SessionClosedError(
                        "the session closed or failed before its last chunk was published"
                    )
        frames = p.run_phase(
            "publish",
            {  # both: the frames of n, in display order
                "segment_latents": seg.latents[lo:hi],
                "segment_audio": seg.audio[lo:hi],
                "segment_start": n.start + lo,
                "seed": self.seed,
            },
            state,
            self.stats.stage_seconds,
        ).pop("frames")
        if seg.dropped:  # a rewind went back before it while its frames were rendered
            seg.latents = seg.audio = None
            return
        seg.done = hi
        if hi == total:
            took = time.perf_counter() - seg.step.t0
            self.stats.generate_seconds += took
            self.stats.chunk_seconds = _recent(self.stats.chunk_seconds, took)
        self._publish(n.start + lo, frames, seg.step)
        if hi == total:
            seg.latents = seg.audio = None  # the chunk's working tensors, released now
            with self._cond:
                if not seg.dropped:  # (dropped while written: the timeline went back already)
                    end = n.stop
                    while end in self._skips:  # chunks skipped after this one: done with it
                        end = self._skips.pop(end)
                    state.frames_published = end
                    self._unpublished.remove(seg)
                    self._trim_audio()
                    self._cond.notify_all()
            self.stats.chunks += 1

    def _publish_failed(self, err: BaseException) -> None:
        """A chunk's publish failed: the session's later chunks, waiting for it, give up."""
        with self._cond:
            self._broken = err
            self._cond.notify_all()

    def lag_seconds(self) -> float:
        """Audio waiting beyond what the next N chunk needs (0 when generation keeps up)."""
        with self._cond:
            n = self.next_chunk()
            if n is None:
                return 0.0
            extra = self.state.audio.received - self._audio_needed(n)
            return max(0, extra) / self.pipeline.info.sample_rate

    def skip_chunk(self) -> int:
        """Advance past the next N chunk without generating it (live catch-up).

        The motion context stays that of the last generated chunk; the next chunk continues from
        it. Returns the number of frames skipped (counted in ``stats.skipped_frames``).
        """
        with self._cond:
            n = self.next_chunk()
            # N0 is never skipped: later chunks and I chunks need its motion context. Nor is
            # a chunk a rewind is about to make again, nor one being made: the live engine's
            # workers look at a session before another may take it, and a skip under its maker
            # would count the chunk both made and skipped, and the maker would then move the
            # timeline past the next chunk too, which no publish reaches: every later chunk
            # would wait for it forever.
            if (
                n is None
                or n.index == 0
                or self._making is not None
                or self._pending_rewind is not None
                or not self._ready_locked()
            ):
                return 0
            self.state.next_n += 1
            if self._unpublished:  # passed over once the chunks before it are published
                self._skips[n.start] = n.stop
            else:
                self.state.frames_published = n.stop
            self._trim_audio()
            self._cond.notify_all()
        self.stats.skipped_frames += n.length
        return n.length

    def _windows(self, n: NChunk) -> np.ndarray:
        """(T, W) audio windows of the frames of ``n``, each ending lookahead after its frame."""
        info, p = self.pipeline.info, self.pipeline
        ends = [
            frame_start_sample(j + 1, info.fps, info.sample_rate) + p.lookahead_samples
            for j in range(n.start, n.stop)
        ]
        return np.stack([self.state.audio.window(e - p.window_samples, e) for e in ends])

    def _trim_audio(self) -> None:
        """Release audio that neither publishing nor a future window needs."""
        info, p = self.pipeline.info, self.pipeline
        horizon = self.state.frames_published - int(REWIND_S * info.fps)
        while self._snapshots and self._snapshots[0].frames_published < horizon:
            self._snapshots.popleft()
        # From the oldest chunk a rewind can make again (its windows reach back as far).
        done = min([s.frames_published for s in self._snapshots] + [self.state.frames_published])
        keep_from = min(
            frame_start_sample(done, info.fps, info.sample_rate),
            frame_start_sample(done + 1, info.fps, info.sample_rate)
            + p.lookahead_samples
            - p.window_samples,
        )
        self.state.audio.trim_before(max(0, keep_from))

    def _publish(self, first: int, frames: np.ndarray, step: _Step) -> None:
        info = self.pipeline.info
        a = frame_start_sample(first, info.fps, info.sample_rate)
        b = frame_start_sample(first + frames.shape[0], info.fps, info.sample_rate)
        if step.total_samples is not None:
            b = min(b, step.total_samples)
        with self._cond:
            audio = self.state.audio.window(a, b)
        video_chunk = VideoChunk(frames, first, step.epoch)
        audio_chunk = AudioChunk(audio, a)
        t0 = time.perf_counter()
        for sink in self.sinks:
            sink.write(video_chunk, audio_chunk)
        sinks = self.stats.stage_seconds
        sinks["sinks"] = sinks.get("sinks", 0.0) + time.perf_counter() - t0
        if self.stats.first_frame_at is None:
            self.stats.first_frame_at = time.perf_counter()
        self.stats.frames += frames.shape[0]

    # -- drivers ----------------------------------------------------------------------------------

    def render(self, source: Iterable[np.ndarray]) -> None:
        """Batch mode: pull audio blocks from ``source`` only as needed, run every chunk, close."""
        blocks: Iterator[np.ndarray] = iter(source)
        try:
            while not self.finished:
                if self.step():
                    continue
                block = next(blocks, None)
                if block is None:
                    self.end_audio()
                else:
                    self.push_audio(block)
        except KeyboardInterrupt:
            self.close()  # Ctrl-C / SIGTERM: keep what was produced, finalised and playable
            raise
        except BaseException:
            self.abort()
            raise
        self.close()

    def run_live(
        self,
        stop: threading.Event | None = None,
        max_lag_s: float | Callable[[], float] | None = None,
    ) -> None:
        """Streaming mode: generate as audio is pushed from other threads until it ends.

        Args:
            stop: set it to end the loop (the sinks are closed).
            max_lag_s: live catch-up. When more audio than this is waiting beyond what the next
                chunk needs (generation fell behind real time), whole N chunks are skipped, so the
                lag stays bounded; their frames are never generated (a live track repeats the last
                frame meanwhile). A callable is asked before every chunk (a bound that follows the
                measured chunk time). None never skips (offline).
        """
        bound = max_lag_s if callable(max_lag_s) or max_lag_s is None else lambda: max_lag_s
        try:
            while not self.finished and not (stop and stop.is_set()):
                if bound is not None and self.lag_seconds() > bound() and self.skip_chunk():
                    continue
                if not self.step():
                    self.wait_ready(timeout=0.05)
        except BaseException:
            self.abort()
            raise
        self.close()

    def close(self) -> None:
        """Finish: sinks finalise what was produced."""
        self._end(abort=False)

    def abort(self) -> None:
        """Error: sinks discard what was produced."""
        self._end(abort=True)

    def _end(self, abort: bool) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._tell()
        errors: list[BaseException] = []
        for sink in self.sinks:
            try:
                sink.abort() if abort else sink.close()
            except BaseException as err:  # every sink gets its close, then the first error
                errors.append(err)
        if errors:
            raise errors[0]


def step_sessions(
    sessions: Sequence[Session],
    executor: Executor | None = None,
    computed: Callable[[Session], None] | None = None,
) -> list[int | BaseException]:
    """:meth:`Session.step` for several sessions of one pipeline at once: their ``n_chunk``
    phases run stage by stage over all of them (the motion model sees one batch), then each
    finishes its own chunk (``executor`` runs those side by side, when given).

    ``computed(session)`` is called once a session's chunk is made but before its frames are
    rendered and published: from then on its next chunk may begin (in another thread: the live
    engine's), and that chunk's frames go out after these. Not for a pipeline whose publish
    keeps state for the next chunk (``Pipeline.publish_keeps_state``).

    Returns per session the frames it published (0: its chunk was not ready) or the error that
    ended its step, so one failing session never takes the others down: when the batched phase
    fails, each session runs its phase alone to find whose input it was.
    """
    begun: list[tuple[Session, _Step]] = []
    results: dict[int, int | BaseException] = {}
    for s in sessions:
        try:
            step = s._begin_step()
        except Exception as err:
            s._step_t0 = None
            results[id(s)] = err
            continue
        if step is None:
            results[id(s)] = 0
        else:
            begun.append((s, step))
    if begun:
        try:
            _step_begun(begun, results, executor, computed)
        finally:
            for s, step in begun:
                if s._step_t0 == step.t0:  # not a later chunk's, begun meanwhile
                    s._step_t0 = None  # its chunk is over, whatever came of it
                with s._cond:
                    if s._making is step.chunk:  # its making failed
                        s._making = None
    return [results[id(s)] for s in sessions]


def _step_begun(
    begun: list[tuple[Session, _Step]],
    results: dict[int, int | BaseException],
    executor: Executor | None,
    computed: Callable[[Session], None] | None,
) -> None:
    """``step_sessions`` for the sessions whose chunk began: the batched ``n_chunk`` phase, then
    each one's segment (an I chunk where the timeline has them; the motion context rolled on),
    then each one's frames (results by ``id`` of the session)."""
    pipeline = begun[0][0].pipeline
    if any(s.pipeline is not pipeline for s, _ in begun):
        raise ValueError("step_sessions batches sessions of one pipeline only")
    works: list[dict | BaseException]
    kept = [dict(s.state.fields) for s, _ in begun]  # stages replace fields, never mutate
    try:
        works = list(
            pipeline.run_phase_batch(
                "n_chunk",
                [s._n_chunk_work(step) for s, step in begun],
                [s.state for s, _ in begun],
                [s.stats.stage_seconds for s, _ in begun],
            )
        )
    except Exception:
        if len(begun) == 1:
            raise
        works = []
        for (s, step), fields in zip(begun, kept, strict=True):  # alone: whose input failed?
            s.state.fields = fields  # as before the failed batch
            try:
                work = pipeline.run_phase(
                    "n_chunk", s._n_chunk_work(step), s.state, s.stats.stage_seconds
                )
                works.append(work)
            except Exception as err:
                works.append(err)

    segments: dict[int, _Segment] = {}

    def segment(item: tuple[tuple[Session, _Step], dict | BaseException]) -> None:
        (s, step), work = item
        try:
            if isinstance(work, BaseException):
                raise work
            segments[id(s)] = s._segment(step, work)
        except Exception as err:
            results[id(s)] = err

    if pipeline.publish_keeps_state:  # the next chunk needs what this one's publish keeps
        computed = None
    items = list(zip(begun, works, strict=True))
    side_by_side = executor is not None and len(items) > 1
    if side_by_side:  # an I chunk is a phase of its own: one per session, side by side
        for future in [executor.submit(segment, item) for item in items]:
            future.result()
    else:
        for item in items:
            segment(item)
    made = [s for s, _ in begun if id(s) in segments]
    # Several chunks of a family that makes each frame alone go out in two waves: every chunk's
    # first frame, then the rest, so the last call's first frame does not wait for the other
    # calls' second frames (their deadline is a frame later).
    waves = 2 if pipeline.publish_per_frame and len(made) > 1 else 1

    def publish(s: Session, wave: int) -> None:
        if id(s) in results:  # an earlier wave failed
            return
        try:
            s._publish_segment(segments[id(s)], 1 if wave == 0 and waves == 2 else None)
        except Exception as err:
            results[id(s)] = err
            s._publish_failed(err)

    if side_by_side and len(made) > 1:
        # In order, so each session's later wave is taken after its first (which an earlier
        # task runs): a later wave waits for it, never for a task queued behind itself. The
        # next chunks' tasks (``computed``) are queued behind all of these.
        firsts = [executor.submit(publish, s, 0) for s in made]
        rest = [
            executor.submit(_after, f, publish, s, 1)
            for f, s in zip(firsts, made, strict=True)
            if waves == 2
        ]
        for s in made:
            if computed is not None:
                computed(s)
        for future in firsts + rest:
            future.result()
    else:
        for s in made:
            if computed is not None:
                computed(s)
        for wave in range(waves):
            for s in made:
                publish(s, wave)
    for s in made:
        if id(s) not in results:  # it did not fail: the frames it published
            results[id(s)] = segments[id(s)].done


def _after(first: Future, fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` once ``first`` is done."""
    first.result()
    fn(*args)
