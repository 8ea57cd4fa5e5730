"""The live engine: earliest deadline first, fair losses under overload, batches that change no
frame."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from talkloop.pipeline.core.clock import frame_start_sample
from talkloop.pipeline.core.engine import Engine, Stream
from talkloop.pipeline.core.schedule import NChunk
from talkloop.pipeline.core.session import step_sessions
from talkloop.pipeline.models.registry import build_pipeline

from support import CollectSink, make_reference, tiny_config

pytestmark = pytest.mark.unit

CHUNK_S = 0.12  # a live chunk: 3 frames at 25 fps
PLAYOUT_S = 0.32


class Timed:
    """A live session on a manual clock: its audio arrives in real time, chunk ``k`` can run
    once the audio of its last frame is there, and it plays ``PLAYOUT_S`` after that audio."""

    def __init__(self, name: str, now: list[float], pipeline: object, offset: float = 0.0):
        self.name, self.now, self.pipeline, self.offset = name, now, pipeline, offset
        self.next = 0
        self.generated = self.skipped = 0
        self.listeners: list = []

    def _audio_until(self, k: int) -> float:
        return self.offset + (k + 1) * CHUNK_S

    def next_chunk(self) -> NChunk:
        return NChunk(self.next, self.next * 3, self.next * 3 + 3)

    def ready(self) -> bool:
        return self.now[0] >= self._audio_until(self.next)

    def lag_seconds(self) -> float:
        return max(0.0, self.now[0] - self._audio_until(self.next))

    def skip_chunk(self) -> int:
        if self.next == 0 or not self.ready():
            return 0
        self.next += 1
        self.skipped += 1
        return 3

    def deadline(self, frame: int) -> float:
        return self.offset + frame / 25 + PLAYOUT_S


def simulate(
    sessions: list[Timed],
    now: list[float],
    cost_s: float,
    seconds: float,
    batch_s: float = 0.0,
    log: list | None = None,
    **kw,
):
    """Run the engine's policy with every batch costing ``batch_s`` plus ``cost_s`` per chunk
    of clock time; ``log`` gets (start, end, [(session, deadline of its chunk)]) per turn."""
    order: list[str] = []

    def step(batch, pool, computed=None):
        start = now[0]
        now[0] += batch_s + cost_s * len(batch)
        if log is not None:
            log.append((start, now[0], [(s, s.deadline(s.next * 3)) for s in batch]))
        for s in batch:
            order.append(s.name)
            s.next += 1
            s.generated += 1
        return [3] * len(batch)

    engine = Engine(step=step, **kw)

    def clock() -> float:  # one clock object for every session: they may be gathered
        return now[0]

    for s in sessions:
        # The lag bound of a live call: what still shows part of the chunk (AvatarSession).
        bound = PLAYOUT_S - cost_s - 1 / 25
        engine._streams.append(
            Stream(s, s.deadline, lambda b=bound: b, lambda err: pytest.fail(str(err)), clock)
        )
    while now[0] < seconds:
        look_again = engine.turn()
        if look_again is not None:  # to the next audio, or the held batch's latest start
            waiting = [s._audio_until(s.next) for s in sessions if not s.ready()]
            now[0] = min([*waiting, now[0] + look_again])
    return order


def test_the_chunk_due_first_runs_first() -> None:
    now = [0.45]  # every call's chunk 1 is ready, none is late enough to give it up
    pipeline = object()
    # Three calls that joined at different times: their next chunks are due in this order.
    late, early, middle = (
        Timed(n, now, pipeline, o) for n, o in (("c", 0.2), ("a", 0.0), ("b", 0.1))
    )
    for s in (late, early, middle):
        s.next = 1
    order = simulate([late, early, middle], now, 0.001, 0.4535, max_batch=1)
    # Due at 0.44, 0.54, then a's next chunk (0.56, its audio is there) before c's (0.64).
    assert order == ["a", "b", "a", "c"]


def test_five_calls_on_a_budget_for_three_lose_the_same_share() -> None:
    now = [0.0]
    pipeline = object()
    calls = [Timed(f"c{i}", now, pipeline, 0.013 * i) for i in range(5)]
    simulate(calls, now, CHUNK_S / 3, 60.0, max_batch=1)
    total = [s.generated + s.skipped for s in calls]
    shares = np.array([s.generated / t for s, t in zip(calls, total, strict=True)])
    # The machine generates three calls' worth: each call gets about 3/5 of its chunks.
    assert shares.sum() == pytest.approx(3.0, abs=0.1)
    assert shares.max() - shares.min() <= 0.05, shares
    assert min(total) >= 490  # every call's timeline kept up with real time (500 chunks)


def test_calls_that_joined_apart_are_gathered_into_batches_and_none_is_late() -> None:
    """Four calls whose chunks' audio completes 30 ms apart: each ready chunk waits, until its
    latest start, for the others; a batch costs little more than one chunk (as the motion net's
    does), so the engine computes far less than running each chunk as it comes, and no chunk
    starts so late that it misses its deadline."""

    def run(max_batch: int) -> tuple[list, float]:
        now, log = [0.0], []
        calls = [Timed(f"c{i}", now, object(), 0.03 * i) for i in range(4)]
        for c in calls:
            c.pipeline = calls[0].pipeline
        simulate(calls, now, 0.005, 30.0, batch_s=0.02, log=log, max_batch=max_batch)
        return log, sum(end - start for start, end, _ in log)

    alone, busy_alone = run(max_batch=1)
    gathered, busy = run(max_batch=8)
    sizes = np.array([len(chunks) for *_, chunks in gathered])
    assert sizes.mean() >= 3.5, np.bincount(sizes)
    assert busy <= 0.5 * busy_alone
    for log in (alone, gathered):
        late = [(end, due) for _, end, chunks in log for _, due in chunks if end > due]
        assert not late
    # every chunk still ran: the four timelines kept up with real time (250 chunks each)
    assert sum(len(chunks) for *_, chunks in gathered) >= 4 * 245


def test_calls_that_open_together_share_their_first_turn() -> None:
    """Before the engine has timed a turn it still gathers (a reserve of half a chunk): two
    calls of a fresh server whose first chunks come ready 5 ms apart run them as one batch, in
    time, rather than as two turns."""
    now, log = [0.0], []
    calls = [Timed(f"c{i}", now, object(), 0.005 * i) for i in range(2)]
    calls[1].pipeline = calls[0].pipeline
    simulate(calls, now, 0.005, 0.2, batch_s=0.02, log=log, max_batch=8)
    start, end, chunks = log[0]
    assert [s.name for s, _ in chunks] == ["c0", "c1"]
    assert start == pytest.approx(0.125) and all(end <= due for _, due in chunks)


def test_a_lone_call_never_waits() -> None:
    now, log = [0.0], []
    call = Timed("c", now, object())
    simulate([call], now, 0.005, 10.0, batch_s=0.02, log=log)
    starts = np.array([start for start, *_ in log])
    ready = np.array([call.offset + (k + 1) * CHUNK_S for k in range(len(starts))])
    np.testing.assert_allclose(starts, ready)


def test_a_calls_next_chunk_is_made_while_its_last_ones_frames_are_published() -> None:
    """Once a turn has made a call's chunk (``computed``), another worker may run the call's next
    turn while the first still publishes; ``remove`` returns only once both are over."""
    now = [1.0]  # the audio of chunks 1 to 6 is here
    call = Timed("c", now, object())
    call.next = 1
    publishing, release, made = threading.Event(), threading.Event(), []

    def step(batch, pool, computed=None):
        for s in batch:
            made.append(s.next)
            s.next += 1
            computed(s)
        if len(made) == 1:
            publishing.set()
            assert release.wait(30)  # the first chunk's frames are still being published
        return [3] * len(batch)

    engine = Engine(step=step)
    stream = Stream(
        call, call.deadline, lambda: 10.0, lambda err: pytest.fail(str(err)), lambda: now[0]
    )
    engine._streams.append(stream)
    first = threading.Thread(target=engine.turn)
    first.start()
    assert publishing.wait(30)
    assert engine.turn() is None  # the next turn: the next chunk, while the first publishes
    assert made == [1, 2] and stream.steps == 1 and not stream.running
    removing = threading.Thread(target=engine.remove, args=(stream,))
    removing.start()
    removing.join(0.2)
    assert removing.is_alive()  # the first turn's frames are not all out
    release.set()
    first.join(30)
    removing.join(30)
    assert not removing.is_alive() and stream.steps == 0 and engine.streams == 0


def test_a_batch_of_sessions_makes_the_frames_each_makes_alone(tiny_modules, speech) -> None:
    config = tiny_config(schedule={"first_len": 2, "n_len": 3, "i_len": 0, "ctx_len": 2})
    pipeline = build_pipeline(config, tiny_modules)
    rate = config.audio.sample_rate
    audio = [speech[: int(1.2 * rate)], np.roll(speech, 7000)[: int(1.2 * rate)]]
    prompts = ["", "calm, nods a lot"]

    def frames(batched: bool) -> list[np.ndarray]:
        sinks = [CollectSink(), CollectSink()]
        sessions = [
            pipeline.open_session(make_reference(seed=i), prompts[i], [sinks[i]], seed=i)
            for i in range(2)
        ]
        for s, a in zip(sessions, audio, strict=True):
            s.push_audio(a[: frame_start_sample(20, 25, rate)])
        steps = 0
        while sessions[0].ready() or sessions[1].ready():
            if batched:
                results = step_sessions(sessions)
                assert not any(isinstance(r, BaseException) for r in results)
            else:
                for s in sessions:
                    s.step()
            steps += 1
        assert steps >= 5
        for s in sessions:
            s.close()
        return [sink.all_frames() for sink in sinks]

    alone, together = frames(batched=False), frames(batched=True)
    for a, b in zip(alone, together, strict=True):
        assert a.shape == b.shape and a.shape[0] >= 15
        np.testing.assert_array_equal(a, b)


def test_a_pipeline_whose_publish_keeps_state_is_not_let_go_before_it(tiny_modules, speech) -> None:
    """A family whose publish keeps state for the next chunk (the tiny config's decoder cache)
    publishes each chunk before its next may begin: ``computed`` is never called."""
    pipeline = build_pipeline(tiny_config(), tiny_modules)
    assert pipeline.publish_keeps_state
    session = pipeline.open_session(make_reference(), "", [CollectSink()])
    session.push_audio(speech[: frame_start_sample(8, 25, pipeline.config.audio.sample_rate)])
    released = []
    (published,) = step_sessions([session], computed=released.append)
    assert published > 0 and released == []
    session.close()


def test_a_session_whose_chunk_fails_in_a_batch_fails_alone(tiny_modules, speech) -> None:
    """The batch fails for one session's input: each runs alone from its state before the batch,
    the good one publishes what it would have published anyway."""
    config = tiny_config(schedule={"first_len": 2, "n_len": 3, "i_len": 0, "ctx_len": 2})
    pipeline = build_pipeline(config, tiny_modules)
    rate = config.audio.sample_rate
    audio = speech[: frame_start_sample(8, 25, rate)]

    def run(poison: bool) -> tuple[list, np.ndarray]:
        sinks = [CollectSink(), CollectSink()]
        sessions = [pipeline.open_session(make_reference(), "", [k], seed=0) for k in sinks]
        for s in sessions:
            s.push_audio(audio)
        if poison:  # the second session's audio features come out with the wrong width
            sessions[1]._n_chunk_work = lambda step, s=sessions[1]: {
                **type(s)._n_chunk_work(s, step),
                "audio_windows": step.windows[:, :-1],
            }
        results = step_sessions(sessions)
        return results, sinks[0].all_frames()

    (good, _), clean = run(poison=False)
    (ok, bad), frames = run(poison=True)
    assert good == ok == 2 and isinstance(bad, BaseException)
    np.testing.assert_array_equal(frames, clean)


def test_later_sessions_anchor_on_the_grid_of_the_first() -> None:
    now = [2.0]
    engine = Engine(step=lambda batch, pool, computed=None: [0] * len(batch))

    def clock() -> float:
        return now[0]

    def other_clock() -> float:
        return now[0]

    assert engine.grid_start(clock, 0.08) == 2.0  # the first: now
    now[0] = 2.23
    assert engine.grid_start(clock, 0.08) == pytest.approx(2.16)  # the grid point before now
    now[0] = 2.32
    assert engine.grid_start(clock, 0.08) == pytest.approx(2.32)  # on a grid point: itself
    # Another chunk duration, or another clock, has a grid of its own.
    assert engine.grid_start(clock, 0.12) == 2.32
    assert engine.grid_start(other_clock, 0.08) == 2.32
