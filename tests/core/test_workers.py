"""Worker processes (talkloop/pipeline/core/workers.py): bound objects' methods run in another
process, their errors come back, a dead worker fails only its own objects' calls and is replaced,
and an object is forgotten once its handle is gone."""

from __future__ import annotations

import gc
import os
import signal
import time

import numpy as np
import pytest

from talkloop.pipeline.core.workers import ProcessPool, WorkerLostError

pytestmark = pytest.mark.unit


class Counter:
    """A picklable object with state (what a renderer is to the pool)."""

    def __init__(self, start: int) -> None:
        self.n = start

    def add(self, k: int) -> int:
        self.n += k
        return self.n

    def plus(self, k: int) -> int:
        return self.n + k

    def pid(self) -> int:
        return os.getpid()

    def fail(self) -> None:
        raise ValueError("bad input for this object")

    def frames(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, self.n % 256, np.uint8)

    def meet(self, folder: str, part: int, parts: int) -> tuple[int, int]:
        """Leaves a mark, then waits for every part's: only parts that run at once, each in its
        own process, all return (in one worker one after another the first would time out)."""
        open(os.path.join(folder, str(part)), "w").close()
        deadline = time.monotonic() + 30  # a bound on a hang, not a timing
        while len(os.listdir(folder)) < parts:
            if time.monotonic() > deadline:
                raise TimeoutError(f"part {part} met {len(os.listdir(folder))} of {parts}")
            time.sleep(0.01)
        return part, os.getpid()


@pytest.fixture
def pool():
    p = ProcessPool(2)
    yield p
    p.close()


def test_methods_run_in_a_worker_with_the_objects_own_state(pool) -> None:
    a, b = pool.bind(Counter(10)), pool.bind(Counter(100))
    assert a.call("add", 1) == 11 and a.call("add", 2) == 13  # state kept between calls
    assert b.call("add", 5) == 105
    pids = {a.call("pid"), b.call("pid")}
    assert os.getpid() not in pids
    assert pids == set(pool.pids)  # one object on each worker: the least loaded takes it
    frames = a.call("frames", (2, 64, 64, 3))
    assert frames.dtype == np.uint8 and frames.shape == (2, 64, 64, 3) and frames[0, 0, 0, 0] == 13


def test_array_results_come_back_through_the_shared_buffer_each_a_copy_of_its_own(pool) -> None:
    """Frames come back through the buffer the worker shares with the caller, which grows to
    the largest; each result is the caller's own copy, not a view that the next one overwrites."""
    a = pool.bind(Counter(7))
    (worker,) = [w for w in pool._workers if w.bound]
    first = a.call("frames", (2, 64, 64, 3))  # 24 KB: below SHARED_MIN_BYTES, pickled
    assert worker.shared is None
    small = a.call("frames", (2, 128, 128, 3))
    assert worker.shared is not None and len(worker.shared) == small.nbytes
    a.call("add", 1)
    large = a.call("frames", (3, 256, 256, 3))  # the buffer grows
    assert len(worker.shared) == large.nbytes
    a.call("add", 1)
    last = a.call("frames", (2, 128, 128, 3))  # written over the start of the buffer
    assert (first == 7).all() and (small == 7).all() and (large == 8).all() and (last == 9).all()
    assert small.shape == (2, 128, 128, 3) and large.shape == (3, 256, 256, 3)
    assert pool.bind(Counter(0)).call("frames", (0, 4)).shape == (0, 4)  # empty: pickled


def test_an_objects_error_is_raised_in_the_caller_and_the_worker_goes_on(pool) -> None:
    a = pool.bind(Counter(0))
    with pytest.raises(ValueError, match="bad input for this object"):
        a.call("fail")
    assert a.call("add", 1) == 1
    with pytest.raises(AttributeError):
        a.call("no_such_method")


def test_a_dead_worker_fails_its_objects_alone_and_is_replaced(pool) -> None:
    a, b = pool.bind(Counter(0)), pool.bind(Counter(0))
    victim = a.call("pid")
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and victim in _alive(pool):
        time.sleep(0.05)
    with pytest.raises(WorkerLostError, match=f"process {victim} is gone"):
        a.call("add", 1)
    assert b.call("add", 1) == 1  # the other worker's object is untouched
    c = pool.bind(Counter(7))  # a new worker takes the dead one's place
    assert victim not in pool.pids and len(pool.pids) == 2
    assert c.call("add", 1) == 8


def test_an_object_held_everywhere_runs_on_the_least_busy_worker_and_outlives_one(pool) -> None:
    """An object its methods never change, held by every worker: each call goes to the worker
    with the fewest calls in flight, and a dead worker's calls go to the one left."""
    a = pool.bind(Counter(5), everywhere=True)
    w0, w1 = pool._workers
    assert w0.bound == w1.bound == 1
    assert a.call_each("pid") == [w0.process.pid, w1.process.pid]
    w0.in_flight = 1  # a call of another session is in w0
    assert a.call("pid") == w1.process.pid
    w0.in_flight, w1.in_flight = 0, 1
    assert a.call("pid") == w0.process.pid
    w1.in_flight = 0

    def lost(*args):  # w0 dies while the call is in it
        raise WorkerLostError("gone")

    w0.request = lost
    assert a.call("pid") == w1.process.pid  # the call goes to the other copy
    del w0.request
    os.kill(w0.process.pid, signal.SIGKILL)
    w0.process.wait(timeout=10)
    assert [a.call("add", 0) for _ in range(3)] == [5, 5, 5]  # the copy in w1 answers
    os.kill(w1.process.pid, signal.SIGKILL)
    w1.process.wait(timeout=10)
    with pytest.raises(WorkerLostError):
        a.call("add", 0)


def test_parts_of_one_piece_of_work_run_at_once_each_in_its_own_worker(pool, tmp_path) -> None:
    a = pool.bind(Counter(0), everywhere=True)
    assert a.width == 2
    results = a.call_parts("meet", [(str(tmp_path), 0, 2), (str(tmp_path), 1, 2)])
    assert [part for part, _ in results] == [0, 1]  # in the order of the parts
    assert {pid for _, pid in results} == set(pool.pids)
    assert all(w.in_flight == 0 for w in pool._workers)


def test_a_parts_error_comes_back_after_the_others_answered_and_the_workers_go_on(pool) -> None:
    a = pool.bind(Counter(3), everywhere=True)
    with pytest.raises(ValueError, match="bad input for this object"):
        a.call_parts("fail", [(), ()])
    with pytest.raises(TypeError, match="shape"):  # one part fails, the other answers
        a.call_parts("frames", [((1, 2),), ()])
    # Every worker answered what it was sent: the next requests get their own answers.
    assert a.call_parts("plus", [(1,), (2,)]) == [4, 5]
    assert a.call_each("pid") == pool.pids


def test_a_part_whose_worker_died_runs_again_on_a_live_one(pool) -> None:
    a = pool.bind(Counter(1), everywhere=True)
    w0, w1 = pool._workers
    os.kill(w0.process.pid, signal.SIGKILL)
    w0.process.wait(timeout=10)
    assert a.width == 1
    assert a.call_parts("plus", [(1,), (2,)]) == [2, 3]  # both on w1, one after the other

    def lost(*args):  # the worker dies after it was chosen: its part goes to another
        raise WorkerLostError("gone")

    pool._workers[0] = w0 = type(w1)(())
    b = pool.bind(Counter(0), everywhere=True)
    w1.send = lost
    assert b.call_parts("pid", [(), ()]) == [w0.process.pid, w0.process.pid]
    del w1.send
    os.kill(w0.process.pid, signal.SIGKILL)
    w0.process.wait(timeout=10)
    w1.process.kill()
    w1.process.wait(timeout=10)
    with pytest.raises(WorkerLostError):
        b.call_parts("pid", [(), ()])


def _alive(pool) -> list[int]:
    return [w.process.pid for w in pool._workers if w.alive]


def test_an_object_is_forgotten_in_its_worker_when_its_handle_goes() -> None:
    pool = ProcessPool(1)
    try:
        (worker,) = pool._workers
        handle = pool.bind(Counter(0))
        assert worker.bound == 1
        del handle
        gc.collect()
        assert worker.bound == 0 and len(worker.forgotten) == 1  # queued, never blocking
        other = pool.bind(Counter(1))  # the next request sends the forget first
        assert worker.forgotten == [] and other.call("add", 1) == 2
    finally:
        pool.close()


def test_a_pool_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="processes must be >= 1"):
        ProcessPool(0)


class Unpicklable(Exception):
    def __init__(self, handle) -> None:
        super().__init__("holds a handle")
        self.handle = handle

    def __reduce__(self):
        raise TypeError("cannot pickle this error")


class Raiser:
    def fail(self) -> None:
        raise Unpicklable(object())


def test_an_error_that_does_not_pickle_comes_back_by_name_and_the_worker_lives() -> None:
    pool = ProcessPool(1)
    try:
        r = pool.bind(Raiser())
        with pytest.raises(RuntimeError, match="Unpicklable: holds a handle"):
            r.call("fail")
        assert pool.bind(Counter(4)).call("add", 1) == 5
    finally:
        pool.close()
