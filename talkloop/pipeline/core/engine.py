"""The live engine: one generation loop for every live session of a process.

A live session (a :class:`Session` fed in real time by a call) joins the engine with two
functions: ``deadline(frame)``, when that frame must play (one clock for every session: a
server's is ``time.monotonic``), and ``max_lag_s()``, how much audio may wait before it gives up
a chunk. Each turn the engine

1. lets every session whose backlog is past its bound skip its next chunk (it catches up a whole
   chunk of lag and computes nothing: its video holds a frame meanwhile);
2. takes, of the sessions whose next chunk has its audio, the one that has given up the most
   chunks, and of those the one whose chunk is due first (earliest deadline first), and with it
   every other ready session of the same pipeline, up to ``max_batch``: their ``n_chunk`` phases
   run as one batch (one forward of the motion model for all of them,
   :func:`~talkloop.pipeline.core.session.step_sessions`), then each finishes its chunk (the
   renderers run side by side on ``publish_workers`` threads; a family that makes each frame
   alone publishes every chunk's first frame before any second one);
3. waits for audio when no session is ready.

**Gathering.** A batch of four chunks costs the motion net little more than one (it is bound by
dispatch, not arithmetic: docs/benchmarks.md), but calls that joined at different moments have
their chunks' audio complete at different moments. So a ready batch that could still grow (other
sessions of its pipeline, on the same clock, are not in it) waits for them until its *latest
start*: the earliest deadline in it less a reserve, the median of the last ``TURN_HISTORY``
turns' durations (timed on that clock) plus ``GATHER_MARGIN_S``; before the engine has timed a turn
(a fresh server's first calls) the reserve is ``FIRST_RESERVE_SHARE`` of the chunk's own duration.
Whoever becomes ready meanwhile joins it. A lone call never waits (there is nobody to gather), nor
does a batch that is full; under overload the latest start has passed and the batch runs at once.

**One grid.** Gathering can only wait so long: calls that joined at random moments have their
chunks' audio complete at random phases of a chunk's duration, and a batch that waited for all of
them would start too late. So a live session anchors its timeline on a grid the engine keeps per
clock and chunk duration (:meth:`Engine.grid_start`): the first session's start, and for every
later one the last grid point before its own start (it begins up to one chunk in the past, with
silence, which costs it no latency: its samples still play a playout delay after they arrive).
Sessions on one grid have their chunks come ready at the same moments, so they make one batch
without waiting; an agent's early reply moves a session off the grid by whole driving blocks,
and gathering still joins it where it can.

It runs these turns on one worker thread per core, each taking sessions no other worker is
running: sessions whose chunks come due together share one batch, the others run side by side.

**Overlap.** A turn lets go of each session as soon as its chunk is made (the batch's motion, its
I chunk, the motion context rolled on: ``step_sessions``' ``computed``), while that chunk's
frames are still being rendered and published; another worker may then make the session's next
chunk, whose frames go out after these. With three calls on two cores the batch's making (about
a quarter of the 80 ms chunk) and its six renders no longer add up on one worker: alternated
three-call levels lost fewer frames in every pair (docs/benchmarks.md, the Zen 3 entry of
2026-12-07 09:22-11:05). ``remove`` waits for both. A family whose publish keeps state for the
next chunk (``Pipeline.publish_keeps_state``: a video decoder's cache) publishes a chunk before its
next begins.

So the event loop of a server carries no generation work. While the machine keeps up, nothing is
skipped and the order is earliest deadline first. Under overload (more calls than it can generate
in real time) deadlines alone would starve some calls: a session that skipped a chunk jumps ahead
in its timeline, so its next deadline is later than everyone's and it falls behind again. Serving
the most deprived session first (a deficit count, as fair queueing does) shares the losses out:
every session gives up about the same share of chunks (``tests/core/test_engine.py``).

A session that fails ends alone: its ``on_error`` is called and the engine forgets it.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from talkloop.pipeline.core.session import Session, step_sessions

log = logging.getLogger("talkloop.engine")

WAIT_S = 0.02  # longest sleep without a wake-up: one driving block
TURN_HISTORY = 32  # turns whose compute time sets the gathering reserve
TURN_QUANTILE = 0.5  # of those, the one that sets it: the median (docs/benchmarks.md, 2026-12-04)
GATHER_MARGIN_S = 0.02  # what a gathered batch's start may still slip by (a wake-up, a tick)
# The reserve before any turn is timed, as a share of the chunk's duration: the median turn of
# two to four calls on a 2-core VM took 35-70 ms of an 80 ms chunk (docs/benchmarks.md). Without
# it two calls that opened together ran their first chunks as two turns side by side, each slower
# than one batch of both, while their connections and encoders also started (docs/benchmarks.md,
# "Intel Xeon (family 6 model 207), 2026-12-06 08:22-09:50").
FIRST_RESERVE_SHARE = 0.5


@dataclass(eq=False)
class Stream:
    """A session the engine runs, and how it is told what happens to it."""

    session: Session
    deadline: Callable[[int], float]
    max_lag_s: Callable[[], float]
    on_error: Callable[[BaseException], None]
    now: Callable[[], float] = time.monotonic  # the clock of ``deadline``
    running: bool = False  # a chunk of it is being made (its frames may still be rendering)
    steps: int = 0  # turns with a chunk of it not yet over (made, or its frames being published)
    ended: bool = False
    deficit: int = 0  # chunks it gave up while in the engine (fairness under overload)


class Engine:
    """Runs the chunks of every added session on its worker threads (the module docstring).

    Args:
        max_batch: sessions whose chunks run as one batch at most.
        publish_workers: threads that finish the chunks of a batch side by side (the renderers
            release the GIL); None: the number of cores.
        workers: threads that run turns, each on the sessions the others are not running; None:
            the number of cores (a family that computes on one thread per process would
            otherwise leave the other cores idle between renders).
        step: runs one batch of sessions' chunks (tests replace it to time the policy alone).
    """

    def __init__(
        self,
        max_batch: int = 8,
        publish_workers: int | None = None,
        workers: int | None = None,
        name: str = "engine",
        step: Callable[..., list[int | BaseException]] = step_sessions,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.step = step
        self.max_batch = max_batch
        self.name = name
        cores = len(os.sched_getaffinity(0))
        self._pool = ThreadPoolExecutor(
            publish_workers or cores, thread_name_prefix=f"{name}-publish"
        )
        self._cond = threading.Condition()
        self._streams: list[Stream] = []
        self.workers = workers or cores
        self._threads: list[threading.Thread] = []
        self.batches = 0  # turns that ran more than one session's chunk in one batch
        self.turns = 0
        self.batched_chunks = 0  # chunks that ran in those turns
        self._turn_s: deque[float] = deque(maxlen=TURN_HISTORY)  # compute time of recent turns
        self._grids: dict[tuple[Callable[[], float], float], float] = {}  # a point of each grid

    # -- membership ----------------------------------------------------------------------------

    def grid_start(self, now: Callable[[], float], period: float) -> float:
        """Where a session starting now on clock ``now``, with chunks of ``period`` seconds,
        anchors its timeline: now for the first such session, else the last point at or before
        now of the grid the first one set (see the module docstring)."""
        t = now()
        with self._cond:
            origin = self._grids.setdefault((now, period), t)
        return origin + math.floor((t - origin) / period + 1e-9) * period  # 1e-9: float error

    def add(
        self,
        session: Session,
        deadline: Callable[[int], float],
        max_lag_s: Callable[[], float],
        on_error: Callable[[BaseException], None],
        now: Callable[[], float] = time.monotonic,
    ) -> Stream:
        """Run ``session``'s chunks from now on, until :meth:`remove` or its audio ends.
        ``now``: the clock of ``deadline`` (sessions on one clock are gathered into batches)."""
        stream = Stream(session, deadline, max_lag_s, on_error, now)
        session.listeners.append(self.wake)
        with self._cond:
            # A newcomer starts level with the least deprived: no head start over the others.
            stream.deficit = min((s.deficit for s in self._streams), default=0)
            self._streams.append(stream)
            self._threads = [th for th in self._threads if th.is_alive()]
            while len(self._threads) < min(self.workers, len(self._streams)):
                th = threading.Thread(
                    target=self._loop, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(th)
                th.start()
            self._cond.notify_all()
        return stream

    def remove(self, stream: Stream, timeout: float | None = None) -> None:
        """Stop running ``stream``; returns once no chunk of it is being generated or published."""
        with self._cond:
            stream.ended = True
            self._cond.wait_for(lambda: not stream.running and not stream.steps, timeout)
            if stream in self._streams:
                self._streams.remove(stream)
        if self.wake in stream.session.listeners:
            stream.session.listeners.remove(self.wake)

    def wake(self) -> None:
        """Audio arrived (or a session ended): look again."""
        with self._cond:
            self._cond.notify_all()

    @property
    def streams(self) -> int:
        with self._cond:
            return len(self._streams)

    # -- the loop ------------------------------------------------------------------------------

    def turn(self) -> float | None:
        """One turn (see the module docstring). Returns None when a batch ran, else how long
        until it is worth looking again: until the latest start of the batch held back (seconds
        of its clock), inf when nothing was ready."""
        with self._cond:
            live = [s for s in self._streams if not s.ended and not s.running]
        # Another worker may take one of these meanwhile: a session refuses to skip the chunk
        # it is making (``Session.skip_chunk``).
        for stream in live:
            s = stream.session
            if s.lag_seconds() > stream.max_lag_s() and s.skip_chunk():
                stream.deficit += 1
        ready = []
        for stream in live:
            chunk = stream.session.next_chunk()
            if chunk is not None and stream.session.ready():
                ready.append((-stream.deficit, stream.deadline(chunk.start), stream, chunk))
        if not ready:
            return float("inf")
        ready.sort(key=lambda item: item[:2])
        first, chunk = ready[0][2:]
        batch = [first] + [st for _, _, st, _ in ready[1:] if self._batchable(first, st)][
            : self.max_batch - 1
        ]
        due = min(deadline for _, deadline, st, _ in ready if st in batch)
        chunk_s = first.deadline(chunk.stop) - first.deadline(chunk.start)
        hold = self._latest_start(batch, due, chunk_s) - first.now()
        if hold > 0:  # gathering: others may join before it must start
            return hold
        with self._cond:  # another worker may have taken some of them meanwhile
            batch = [st for st in batch if not st.ended and not st.running]
            if not batch:
                return None
            for st in batch:
                st.running = True
                st.steps += 1
        by_session = {id(st.session): st for st in batch}
        released: set[int] = set()

        def computed(session: Session) -> None:  # its next chunk may begin on another worker
            with self._cond:
                by_session[id(session)].running = False
                released.add(id(session))
                self._cond.notify_all()

        t0 = first.now()
        try:
            results = self.step([st.session for st in batch], self._pool, computed=computed)
        finally:
            with self._cond:
                for st in batch:
                    if id(st.session) not in released:  # else a later turn may have it now
                        st.running = False
                    st.steps -= 1
                self._turn_s.append(first.now() - t0)
                self._cond.notify_all()
        self.turns += 1
        if len(batch) > 1:
            self.batches += 1
            self.batched_chunks += len(batch)
        for stream, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                self._fail(stream, result)
        return None

    def figures(self) -> dict[str, float | int]:
        """How the engine has run: its calls now, its turns, and the chunks a turn ran on average
        (above 1: chunks of several calls shared the motion net's forward)."""
        with self._cond:
            streams, turns = len(self._streams), self.turns
            chunks = self.batched_chunks + turns - self.batches
        return {
            "calls": streams,
            "turns": turns,
            "chunks_per_turn": round(chunks / turns, 2) if turns else 0.0,
        }

    @staticmethod
    def _batchable(first: Stream, other: Stream) -> bool:
        """Whether ``other``'s chunk may run in one batch with ``first``'s."""
        return other.session.pipeline is first.session.pipeline and other.now == first.now

    def _latest_start(self, batch: list[Stream], due: float, chunk_s: float) -> float:
        """Until when ``batch``, whose first frame plays at ``due`` and whose first chunk lasts
        ``chunk_s``, may wait for others to join it (on its clock; -inf: run now)."""
        if len(batch) >= self.max_batch:
            return float("-inf")
        with self._cond:
            others = any(
                not st.ended and st not in batch and self._batchable(batch[0], st)
                for st in self._streams
            )
            turns = sorted(self._turn_s)
        if not others:
            return float("-inf")
        if turns:
            reserve = turns[int(TURN_QUANTILE * (len(turns) - 1))]
        else:
            reserve = FIRST_RESERVE_SHARE * chunk_s
        return due - reserve - GATHER_MARGIN_S

    def _fail(self, stream: Stream, err: BaseException) -> None:
        with self._cond:
            if stream.ended:  # closed under its step: expected, not a fault
                log.debug("%s: a session's chunk stopped by its close: %s", self.name, err)
                return
            stream.ended = True
            if stream in self._streams:
                self._streams.remove(stream)
        try:
            stream.on_error(err)
        except Exception:
            log.exception("%s: error listener failed", self.name)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._streams:
                    return
            try:
                look_again = self.turn()
            except Exception:  # a bug of the engine itself: keep serving the others
                log.exception("%s: turn failed", self.name)
                look_again = float("inf")
            if look_again is not None:  # a held batch at its latest start, or when audio comes
                with self._cond:
                    self._cond.wait(min(WAIT_S, look_again))


_default: Engine | None = None
_default_lock = threading.Lock()


def default_engine() -> Engine:
    """The process's engine (made on first use): every live session shares it."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Engine()
        return _default
