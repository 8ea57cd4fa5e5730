"""AudioDriver: a session's driving audio, produced on a real-time clock, and its speech segments.

Every block (20 ms) the driver takes speech audio (agent TTS, "say" text) if a segment has some
queued, else microphone audio that has arrived, else silence, and hands the block to the playout
buffer (which the outputs emit ``playout_delay`` later) and, resampled to the model's rate, to the
pipeline (which generates the frames for it). The pipeline therefore always has audio to work on:
when nobody speaks it gets silence and the avatar idles; it never waits and the video never
freezes.

Two rates, one clock. Speech and microphone audio are queued, played out and counted at the
output rate (48 kHz in an AvatarSession: full band, what Opus carries); the model reads the same
blocks at its own rate (16 kHz). A block is 20 ms at both rates, so block ``b`` is output samples
``[b * out_block, (b + 1) * out_block)`` and model samples ``[b * block, (b + 1) * block)``: the
sound that plays at a media time is the sound the model made that time's frame from. Positions
handed in and out (``played``, ``segment_of``, ``arrival_of``, ``interrupt``) count model samples,
the media clock's unit; segment positions (``PlaybackFinished.position_s``) count output samples.

While speech plays the microphone is ducked (ignored), so the avatar lip-syncs what it says.

Speech arrives in segments (one agent utterance each). A block never mixes two segments: a segment
that ends mid-block is followed by silence up to the block's end. Each produced block remembers
which segment it carries and how far into that segment it reaches, so the audio output can say
exactly how much of a segment was *played* (emitted), not merely produced.

Everything here is cheap (array copies of a few hundred samples) and runs on the event loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from talkloop.agent.clock import MediaClock
from talkloop.agent.frames import PlaybackEvent, PlaybackFinished, PlaybackStarted
from talkloop.pipeline.audio.resample import StreamResampler
from talkloop.pipeline.core.errors import BusyError

QUIET_RMS = 0.005  # about -46 dBFS: microphone audio this quiet may be dropped to cut latency


class PlayoutBuffer:
    """The last ``capacity`` driving samples, addressed by absolute sample index.

    A ring: sample ``i`` lives at ``i % capacity``, so a run of samples is at most two slices of
    the array (before and after the wrap). Every operation copies through those slices: a
    block's append and read take a third of the time an index array per sample took (4.4
    against 13 microseconds on an AMD EPYC Zen 3)."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"a playout buffer holds at least one sample, got {capacity}")
        self.data = np.zeros(capacity, dtype=np.float32)
        self.capacity = capacity
        self.end = 0  # one past the last sample written
        # No sample before this is held, however many the ring has room for: a truncation
        # leaves the forgotten samples in the slots of the ``capacity`` before them.
        self._low = 0

    @property
    def held_from(self) -> int:
        """The first sample still held (the buffer holds ``[held_from, end)``)."""
        return max(self._low, self.end - self.capacity)

    def _spans(self, start: int, stop: int) -> list[tuple[slice, slice]]:
        """(ring slice, run slice) pairs covering samples ``[start, stop)`` (at most
        ``capacity`` of them): where each part lies in ``data`` and in a run starting at
        ``start``."""
        lo, n = start % self.capacity, stop - start
        first = min(n, self.capacity - lo)
        spans = [(slice(lo, lo + first), slice(0, first))]
        if n > first:
            spans.append((slice(0, n - first), slice(first, n)))
        return spans

    def append(self, samples: np.ndarray) -> None:
        n = samples.shape[0]
        if n > self.capacity:  # only the last ``capacity`` samples can be held
            self.end += n - self.capacity
            samples = samples[n - self.capacity :]
            n = self.capacity
        if n:
            for ring, run in self._spans(self.end, self.end + n):
                self.data[ring] = samples[run]
        self.end += n

    def read(self, start: int, count: int) -> np.ndarray:
        """Samples ``[start, start + count)``; zeros for what is not (or no longer) held."""
        out = np.zeros(count, dtype=np.float32)
        lo, hi = max(start, self.held_from), min(start + count, self.end)
        if hi > lo:
            part = out[lo - start : hi - start]
            for ring, run in self._spans(lo, hi):
                part[run] = self.data[ring]
        return out

    def write(self, start: int, samples: np.ndarray) -> None:
        """Overwrite samples ``[start, start + len)``, all of them already written and held."""
        if start < self.held_from or start + samples.shape[0] > self.end:
            raise ValueError(
                f"samples {start}..{start + samples.shape[0]} are not all held "
                f"(held {self.held_from}..{self.end})"
            )
        if samples.shape[0]:
            for ring, run in self._spans(start, start + samples.shape[0]):
                self.data[ring] = samples[run]

    def truncate(self, end: int) -> None:
        """Forget the samples from ``end`` on (the next ``append`` writes at ``end``)."""
        if end < self.held_from or end > self.end:
            raise ValueError(f"cannot truncate at sample {end} (held {self.held_from}..{self.end})")
        self._low = self.held_from
        self.end = end

    def silence_from(self, start: int) -> None:
        """Zero everything written from ``start`` on (an interrupt)."""
        lo = max(start, self.held_from)
        if self.end > lo:
            for ring, _ in self._spans(lo, self.end):
                self.data[ring] = 0.0


@dataclass
class Segment:
    """One utterance: queued samples, and how much of it was produced and played."""

    id: int
    label: str | None = None
    queue: deque[np.ndarray] = field(default_factory=deque)
    queued: int = 0  # samples waiting to be produced
    produced: int = 0
    played: int = 0
    last_block: int = -1  # the latest produced block carrying this segment
    ended: bool = False  # no more audio will be added
    started: bool = False  # PlaybackStarted was emitted


class AudioDriver:
    """Produces the driving audio in real time. See the module docstring.

    Args:
        push: hands a block of driving audio, at ``sample_rate``, to the pipeline (must not
            block).
        clock: the session's playout clock (at ``sample_rate``); started when the first block is
            produced.
        sample_rate: the pipeline's (model's) rate.
        block: model samples per tick.
        max_mic_backlog_s: microphone audio older than this is dropped, so a burst of late
            packets cannot add lasting latency.
        playout_s: how much driving audio the playout buffer keeps (more than the delay).
        max_pending_s: speech queued (not yet produced) at most; more raises BusyError.
        out_rate: the rate speech and microphone audio arrive, are held and are played out at;
            None: ``sample_rate`` (no resampling). ``block`` must last a whole number of samples
            at it.
    """

    def __init__(
        self,
        push: Callable[[np.ndarray], None],
        clock: MediaClock,
        sample_rate: int,
        block: int = 320,
        max_mic_backlog_s: float = 0.2,
        playout_s: float = 4.0,
        max_pending_s: float = 120.0,
        out_rate: int | None = None,
    ) -> None:
        self.push = push
        self.clock = clock
        self.rate = sample_rate
        self.block = block
        self.out_rate = out_rate = out_rate or sample_rate
        if (block * out_rate) % sample_rate:
            raise ValueError(
                f"a driving block of {block} samples at {sample_rate} Hz is not a whole number of "
                f"samples at the output rate {out_rate} Hz; choose a block that is"
            )
        self.out_block = block * out_rate // sample_rate
        # The model reads the output blocks at its own rate: one streaming filter, no seams.
        self._to_model = StreamResampler(sample_rate)
        self.max_mic = int(max_mic_backlog_s * out_rate)
        self.max_pending = int(max_pending_s * out_rate)
        # The driving audio as it is played out, at the output rate.
        self.playout = PlayoutBuffer(int(playout_s * sample_rate) // block * self.out_block)
        self._mic: deque[tuple[np.ndarray, float]] = deque()  # (samples, arrival time)
        self._mic_len = 0
        self._segments: deque[Segment] = deque()  # queued or producing, in order
        self._open: dict[str, Segment] = {}  # per source (agent, say): the segment it extends
        self._live: dict[int, Segment] = {}  # produced from, not yet finished playing
        self._next_id = 0
        self.samples = 0  # driving samples produced so far (model rate)
        self.emitted_until = 0  # the audio output has emitted every sample before this
        self.started_at: float | None = None
        # Model samples production is short of the playout delay since the clock skipped ahead.
        self.shortfall = 0
        ring = self.playout.capacity // self.out_block + 1
        # Per produced block (a fixed ring, by block index): arrival time of its audio (latency
        # stamps), and which segment it carries and how far into it it reaches (output samples;
        # -1: none).
        self._arrivals = np.zeros(ring, dtype=np.float64)
        self._blk_seg = np.full(ring, -1, dtype=np.int64)
        self._blk_pos = np.zeros(ring, dtype=np.int64)
        self._blk_last = np.zeros(ring, dtype=bool)
        # Set by the avatar while it waits to start the head segment early (``rewrite``): a
        # segment none of which was produced yet is not started by the clock meanwhile.
        self.hold = False
        self.mic_dropped_samples = 0  # these three count output samples
        self.mic_trimmed_samples = 0
        self.speech_dropped_samples = 0

    # -- inputs (event loop) ----------------------------------------------------------------------

    def add_mic(self, samples: np.ndarray, arrived_at: float | None = None) -> None:
        """Microphone audio, float32 mono at the output rate."""
        at = self.clock.clock.now() if arrived_at is None else arrived_at
        self._mic.append((samples.astype(np.float32, copy=False), at))
        self._mic_len += samples.shape[0]
        while self._mic_len - self._mic[0][0].shape[0] >= self.max_mic:
            old, _ = self._mic.popleft()  # too much backlog: the oldest audio goes
            self._mic_len -= old.shape[0]
            self.mic_dropped_samples += old.shape[0]

    @property
    def mic_backlog_samples(self) -> int:
        """Microphone samples (output rate) that arrived and wait for their block (latency the
        user feels)."""
        return self._mic_len

    @property
    def pending_samples(self) -> int:
        """Speech samples (output rate) queued and not yet produced."""
        return sum(s.queued for s in self._segments)

    @property
    def tts_pending_s(self) -> float:
        return self.pending_samples / self.out_rate

    def queued_samples(self, source: str = "") -> int:
        """Samples of ``source``'s open segment not yet produced (0: none, or no open segment)."""
        seg = self._open.get(source)
        return 0 if seg is None else seg.queued

    def push_speech(self, samples: np.ndarray, label: str | None = None, source: str = "") -> int:
        """Append speech (float32 mono at the output rate) to ``source``'s open segment (opening
        one if needed). Returns its id.

        Each source (an agent connection, the built-in TTS) has its own open segment, so two
        sources never interleave within one segment; segments play in the order they opened.

        Raises:
            BusyError: more than ``max_pending_s`` of speech would be queued; nothing is added.
        """
        if self.pending_samples + samples.shape[0] > self.max_pending:
            self.speech_dropped_samples += samples.shape[0]
            raise BusyError(
                f"speech queue full ({self.max_pending / self.out_rate:.0f} s of audio not yet "
                "played): send audio at most this far ahead of playback, or interrupt"
            )
        seg = self._open.get(source)
        if seg is None:
            seg = self._open[source] = Segment(self._next_id, label)
            self._next_id += 1
            self._segments.append(seg)
        if samples.shape[0]:
            seg.queue.append(samples.astype(np.float32, copy=False))
            seg.queued += samples.shape[0]
        return seg.id

    def end_segment(self, source: str = "") -> list[PlaybackEvent]:
        """Close ``source``'s open segment: it finishes once its queued audio has played.

        Returns the segment's ``PlaybackFinished`` when all of it has already been emitted.
        """
        seg = self._open.pop(source, None)
        if seg is None:
            return []
        seg.ended = True
        if seg.queued:
            return []  # its last block, when produced, is marked last
        if seg in self._segments:
            self._segments.remove(seg)
        if seg.produced == 0:
            return []  # empty: nothing was or will be played, nothing to report
        # Everything was produced before the end was known: mark the block that carried its
        # last samples, or, if the output already emitted that block, it has finished now.
        ring = self._blk_seg.shape[0]
        if seg.last_block * self.block >= self.emitted_until:
            self._blk_last[seg.last_block % ring] = True
            return []
        self._live.pop(seg.id, None)
        return [PlaybackFinished(seg.id, seg.played / self.out_rate, False, seg.label)]

    def interrupt(self, played_until: int) -> list[PlaybackEvent]:
        """Drop every segment's unplayed audio. Returns their ``PlaybackFinished`` events.

        Args:
            played_until: the next sample the audio output will emit; everything from there on
                is unplayed and is silenced.
        """
        events: list[PlaybackEvent] = []
        affected = list(self._live.values()) + [s for s in self._segments if s.id not in self._live]
        for seg in sorted(affected, key=lambda s: s.id):
            events.append(PlaybackFinished(seg.id, seg.played / self.out_rate, True, seg.label))
        self._segments.clear()
        self._live.clear()
        self._open.clear()
        if affected:
            # Blocks at or after played_until no longer belong to any segment: they are silence.
            ring = self._blk_seg.shape[0]
            first = max(played_until // self.block, self.samples // self.block - ring + 1, 0)
            for b in range(first, self.samples // self.block + 1):
                self._blk_seg[b % ring] = -1
            self.playout.silence_from(self.out_index(played_until))
        return events

    def unstarted_speech(self) -> Segment | None:
        """The segment due to play next if none of it has been produced yet (and some is queued)."""
        seg = self._segments[0] if self._segments else None
        return seg if seg is not None and seg.produced == 0 and seg.queued > 0 else None

    def idle_from(self, sample: int) -> bool:
        """True when every block from model ``sample`` to the last produced one carries no
        speech, none of it was emitted yet and all of it is still held."""
        ring = self._blk_seg.shape[0]
        first, last = sample // self.block, self.samples // self.block
        if sample % self.block or sample < self.emitted_until or last - first >= ring - 1:
            return False
        return all(self._blk_seg[b % ring] == -1 for b in range(first, last))

    def rewrite(self, sample: int, keep: int = 0) -> np.ndarray:
        """Start the head segment at model ``sample``, in the past of the clock: the blocks
        produced from there on (idle: ``idle_from``) become its first blocks, in the playout
        buffer and in the segment's accounting. Returns their new audio (output rate), for the
        caller to give the model in place of what it had.

        Of a segment still open, ``keep`` output samples (and what is not a whole block) stay
        queued, for the blocks after these to take in real time. Where its audio runs out first,
        the idle blocks after it are forgotten: production goes back to where it ends, short of
        the playout delay by as much (``shortfall``, as after a ``skip``), and its audio still
        to come fills them."""
        if not self.idle_from(sample) or self.unstarted_speech() is None:
            raise ValueError(f"cannot start the next segment at sample {sample}")
        ring, out = self._blk_seg.shape[0], []
        for b in range(sample // self.block, self.samples // self.block):
            head = self._segments[0] if self._segments else None
            if head is None or (head.queued < self.out_block + keep and not head.ended):
                break
            speech, seg, last = self._take_speech(self.out_block, held_too=True)
            if speech is None or seg is None:
                break
            self._blk_seg[b % ring], self._blk_pos[b % ring] = seg.id, seg.produced
            self._blk_last[b % ring] = last
            seg.last_block = b
            self._live[seg.id] = seg
            self.playout.write(b * self.out_block, speech)
            out.append(speech)
        end = sample + len(out) * self.block
        if end < self.samples:  # ran out: the idle blocks after it go (produced again later)
            self.shortfall += self.samples - end
            self.samples = end
            self.playout.truncate(self.out_index(end))
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    # -- outputs ----------------------------------------------------------------------------------

    def played(self, start: int, count: int) -> list[PlaybackEvent]:
        """The audio output emitted ``[start, start + count)``: update segments, return events."""
        events: list[PlaybackEvent] = []
        ring = self._blk_seg.shape[0]
        self.emitted_until = max(self.emitted_until, start + count)
        for b in range(start // self.block, (start + count + self.block - 1) // self.block):
            if b * self.block >= self.samples or b * self.block < self.samples - ring * self.block:
                continue
            seg = self._live.get(int(self._blk_seg[b % ring]))
            if seg is None:
                continue
            if not seg.started:
                seg.started = True
                events.append(PlaybackStarted(seg.id, seg.label))
            seg.played = int(self._blk_pos[b % ring])
            if self._blk_last[b % ring]:
                del self._live[seg.id]
                events.append(
                    PlaybackFinished(seg.id, seg.played / self.out_rate, False, seg.label)
                )
        return events

    def out_index(self, sample: int) -> int:
        """The output sample at the media time of model ``sample``."""
        b, r = divmod(sample, self.block)
        return b * self.out_block + r * self.out_rate // self.rate

    def segment_of(self, sample: int) -> int | None:
        """The segment whose audio is at driving ``sample`` (None: silence or microphone)."""
        b = sample // self.block
        if sample < 0 or sample >= self.samples:
            return None
        seg = int(self._blk_seg[b % self._blk_seg.shape[0]])
        return seg if seg in self._live else None

    def arrival_of(self, sample: int) -> float | None:
        """When the audio at driving ``sample`` arrived (mic) or was produced (silence, TTS)."""
        held = self._arrivals.shape[0] - 1
        if (
            sample < 0
            or sample >= self.samples
            or sample // self.block < self.samples // self.block - held
        ):
            return None
        return float(self._arrivals[(sample // self.block) % self._arrivals.shape[0]])

    # -- the clock ---------------------------------------------------------------------------------

    def produce_due(self, now: float | None = None) -> int:
        """Produce every block whose time has come. Returns the number of blocks produced."""
        now = self.clock.clock.now() if now is None else now
        if self.started_at is None:
            self.started_at = now
            self.clock.start(now)
        due = int(round((now - self.started_at) * self.rate)) // self.block + 1
        due += (self.clock.skipped - self.shortfall) // self.block
        made = 0
        while self.samples // self.block < due:
            self._produce_block(now)
            made += 1
        # Since the clock skipped ahead, production is ``shortfall`` short of the playout delay:
        # speech that is already here goes now, and once no speech is queued or playing, idle
        # audio fills the rest at once.
        while self.shortfall >= self.block and (self._speech_ready() or not self._segments):
            self._produce_block(now)
            self.shortfall -= self.block
            made += 1
        return made

    def _speech_ready(self) -> bool:
        """The head segment has a whole block queued (or its last samples), and may start."""
        seg = self._segments[0] if self._segments else None
        if seg is None or (self.hold and seg.produced == 0):
            return False
        return seg.queued >= self.out_block or (seg.ended and seg.queued > 0)

    def skip(self, samples: int) -> None:
        """The media clock jumps ``samples`` ahead (a multiple of the block; the played media
        passes over idle audio): production stays where it is, short of the playout delay by
        that much until speech that arrived ahead of time, or idle audio once none is queued,
        makes it up (``produce_due``)."""
        if samples % self.block:
            raise ValueError(f"a skip of {samples} samples is not a whole number of blocks")
        self.clock.skip(samples)
        self.shortfall += samples

    def _produce_block(self, now: float) -> None:
        n, b = self.out_block, self.samples // self.block
        ring = self._blk_seg.shape[0]
        speech, seg, last = self._take_speech(n)
        mic, arrived = self._take_mic(n)
        if speech is not None and seg is not None:
            block = speech  # the microphone is ducked while speech plays (module docstring)
            self._blk_seg[b % ring], self._blk_pos[b % ring] = seg.id, seg.produced
            self._blk_last[b % ring] = last
            seg.last_block = b
            self._live[seg.id] = seg
        else:
            block = mic if mic is not None else np.zeros(n, dtype=np.float32)
            self._blk_seg[b % ring] = -1
        self._arrivals[b % ring] = arrived or now
        self.playout.append(block)
        self.samples += self.block
        model = self._to_model.push(block, self.out_rate)  # swr holds back a few samples at most
        if model.size:
            self.push(model)

    def _take_speech(
        self, n: int, held_too: bool = False
    ) -> tuple[np.ndarray | None, Segment | None, bool]:
        """Up to ``n`` samples of the head segment; (block, segment, is its last block). While
        ``hold`` is set a segment not yet started gives nothing (unless ``held_too``)."""
        while self._segments:
            seg = self._segments[0]
            if seg.queued == 0 and seg.ended:  # drained and closed (its last block is out)
                self._segments.popleft()
                continue
            if self.hold and seg.produced == 0 and not held_too:
                return None, None, False
            if seg.queued == 0:
                return None, None, False  # the agent is slower than real time: silence for now
            out = np.zeros(n, dtype=np.float32)
            got = _fill(out, seg.queue)
            seg.queued -= got
            seg.produced += got
            last = seg.ended and seg.queued == 0
            if last:
                self._segments.popleft()
            return out, seg, last
        return None, None, False

    def _take_mic(self, n: int) -> tuple[np.ndarray | None, float | None]:
        if not self._mic:
            return None, None
        # Microphone audio that waits for its block is latency the user feels on every word, and
        # a backlog, once there (packets released in a burst, a call that started with some
        # queued), would stay for good: blocks leave exactly as fast as packets come. It is worked
        # off in quiet stretches, where dropping audio cannot be heard, down to half a block
        # waiting beyond the block taken now.
        while (
            self._mic_len - self._mic[0][0].shape[0] >= n + n // 2
            and float(np.sqrt(np.mean(np.square(self._mic[0][0])))) < QUIET_RMS
        ):
            old, _ = self._mic.popleft()
            self._mic_len -= old.shape[0]
            self.mic_trimmed_samples += old.shape[0]
        arrived = self._mic[0][1]
        out = np.zeros(n, dtype=np.float32)
        got = _fill(out, self._mic, lambda e: e[0], lambda e, rest: (rest, e[1]))
        self._mic_len -= got
        return out, arrived


def _fill(
    out: np.ndarray,
    queue: deque,
    samples: Callable[[Any], np.ndarray] = lambda e: e,
    rest: Callable[[Any, np.ndarray], Any] = lambda e, r: r,
) -> int:
    """Move samples from the front of ``queue`` into ``out``; returns how many were moved.

    ``samples`` gets the array out of a queue entry and ``rest`` builds the entry that stays
    when only part of one was taken (entries may carry more than samples, e.g. arrival times).
    """
    got, n = 0, out.shape[0]
    while queue and got < n:
        head = samples(queue[0])
        k = min(n - got, head.shape[0])
        out[got : got + k] = head[:k]
        got += k
        if k == head.shape[0]:
            queue.popleft()
        else:
            queue[0] = rest(queue[0], head[k:])
    return got
