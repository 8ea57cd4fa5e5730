"""Worker processes for the GIL-bound work of many live sessions (``model.render_processes``).

A family's per-frame work that is many small numpy and OpenCV calls (a photo warp's renderer:
some thirty per frame) gives up and takes back the GIL at every call. Next to a server's event loop,
which does the same for every RTP packet, each taking-back waits for the other thread: with two
calls in one process the renders took three to four times their CPU time while a core stayed
idle (docs/benchmarks.md, the capacity entry of 2026-12-02). In a worker process of its own the
same work has a GIL to itself.

:class:`ProcessPool` keeps ``processes`` workers: fresh interpreters
(``python -m talkloop.pipeline.core.workers``, so no thread of the parent is copied into them and
no script's ``__main__`` runs again), each on one end of a socket pair, computing on one thread
(the pool is the parallelism). :meth:`ProcessPool.bind` sends an object (pickled, once) to the
worker holding the fewest; :meth:`Bound.call` runs one of its methods there and returns the
result, the calling thread waiting without the GIL. An object whose methods never change it (a renderer) can be held
by every worker instead (``everywhere=True``): each call then runs on the worker with the fewest
calls in flight, so two calls' chunks spread over the cores however the calls were bound, and a
dead worker's share goes to the others; :meth:`Bound.call_parts` splits one piece of work over
several of them at once (a chunk's frames: the chunk is done when its slowest part is, not after
all of its frames one by one). An object is forgotten in its workers when its
:class:`Bound` is garbage-collected. A worker that dies fails the calls of the objects it alone
held, each with :class:`WorkerLostError`; the next :meth:`ProcessPool.bind` starts a new one in
its place.

A result that is a large array (a chunk's frames: 786 KB a frame at 512) does not travel through
the socket: the worker writes it into a buffer the two processes share (an anonymous memory
file, grown to the largest result), answers with its shape, and the caller copies it out before
the worker's next request. Pickled through the socket, a chunk of two frames cost the caller 1.35
and the worker 1.5 ms of CPU (copies into and out of pickle's bytes and the socket); through the
buffer 0.25 and 0.3 (docs/benchmarks.md, "Figures behind code choices").
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import mmap
import os
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from talkloop.pipeline.core.errors import TalkloopError
from talkloop.pipeline.core.heap import freeze_loaded


class WorkerLostError(TalkloopError):
    """The worker process that held an object is gone (killed, or out of memory)."""


SHARED_MIN_BYTES = 1 << 16  # an array result at least this large comes back through the buffer


class _SharedResults:
    """A worker's end of its shared result buffer: the memory file ``fd``, mapped as large as
    the largest array written so far."""

    def __init__(self, fd: int) -> None:
        self.fd, self.map = fd, None  # fd -1: no buffer (no memfd_create here), all pickled

    def put(self, result: Any) -> tuple[str, Any]:
        """The answer for ``result``: ``("shared", (shape, dtype))`` with the array written to
        the buffer, or ``("ok", result)`` for anything else (pickled as before)."""
        if (
            self.fd < 0
            or not isinstance(result, np.ndarray)
            or result.dtype.hasobject
            or result.nbytes < SHARED_MIN_BYTES
        ):
            return "ok", result
        if self.map is None or len(self.map) < result.nbytes:
            if self.map is not None:
                self.map.close()
            os.ftruncate(self.fd, result.nbytes)
            self.map = mmap.mmap(self.fd, result.nbytes)
        np.ndarray(result.shape, result.dtype, buffer=self.map)[...] = result
        return "shared", (result.shape, result.dtype.str)


def _serve(conn: Connection, preload: Sequence[str], shared: _SharedResults) -> None:
    """A worker's loop: bind, forget and call requests, one at a time, answered in order (an
    array result through ``shared``)."""
    for name in preload:
        importlib.import_module(name)
    if "cv2" in sys.modules:
        sys.modules["cv2"].setNumThreads(1)
    freeze_loaded()
    objects: dict[int, Any] = {}
    conn.send(("ready", None))
    while True:
        try:
            op, key, payload = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if op == "forget":
            objects.pop(key, None)
            continue
        try:
            if op == "bind":
                objects[key], result = payload, None
            else:
                method, args = payload
                result = getattr(objects[key], method)(*args)
            conn.send(shared.put(result))
        except Exception as err:  # the caller's error, raised again there
            try:
                conn.send(("error", err))
            except Exception:  # an exception that does not pickle: its type and message
                conn.send(("error", RuntimeError(f"{type(err).__name__}: {err}")))


_serials = itertools.count()  # the order in which a caller takes several workers' locks


class _Worker:
    def __init__(self, preload: Sequence[str]) -> None:
        self.serial = next(_serials)
        mine, theirs = socket.socketpair()
        fd = theirs.fileno()
        # The shared result buffer: a memory file of no name, freed when both ends close it
        # (Linux; elsewhere every result is pickled).
        fds = [fd]
        self.shared_fd = -1
        if hasattr(os, "memfd_create"):
            self.shared_fd = os.memfd_create("talkloop-worker-results")
            fds.append(self.shared_fd)
            weakref.finalize(self, os.close, self.shared_fd)
        self.shared: mmap.mmap | None = None  # mapped on the first shared result
        cmd = [sys.executable, "-m", __name__, str(fd), str(self.shared_fd), *preload]
        # It finds modules where this process does; one thread for whatever it loads (the
        # pool is the parallelism).
        path = os.pathsep.join(p for p in sys.path if p)
        env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(cmd, pass_fds=fds, env=env)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.lock = threading.Lock()
        self.ready = False
        self.bound = 0  # objects held
        self.in_flight = 0  # calls sent or waiting for it (the pool's lock)
        self.forgotten: list[int] = []  # keys to forget before the next request

    def request(self, op: str, key: int, payload: Any) -> Any:
        with self.lock:
            self.send(op, key, payload)
            return self.receive()

    def send(self, op: str, key: int, payload: Any) -> None:
        """Send one request (the caller holds ``lock`` until it has the answer: :meth:`receive`).
        The payload is pickled before anything is written, so a payload that does not pickle
        raises here and leaves the worker ready for the next request."""
        try:
            if not self.ready:
                self.conn.recv()  # ("ready", None): its imports are done
                self.ready = True
            while self.forgotten:
                self.conn.send(("forget", self.forgotten.pop(), None))
            self.conn.send((op, key, payload))
        except (EOFError, OSError) as err:
            raise self._lost() from err

    def receive(self) -> Any:
        """The answer to the request :meth:`send` sent; the worker's error raised here."""
        try:
            status, result = self.conn.recv()
        except (EOFError, OSError) as err:
            raise self._lost() from err
        if status == "error":
            raise result
        if status == "shared":  # copied out now: the next request may overwrite the buffer
            shape, dtype = result
            size = int(np.prod(shape)) * np.dtype(dtype).itemsize
            if self.shared is None or len(self.shared) < size:
                if self.shared is not None:
                    self.shared.close()
                self.shared = mmap.mmap(self.shared_fd, os.fstat(self.shared_fd).st_size)
            return np.ndarray(shape, dtype, buffer=self.shared).copy()
        return result

    def _lost(self) -> WorkerLostError:
        return WorkerLostError(
            f"the render worker process {self.process.pid} is gone "
            f"(exit code {self.process.poll()}): the sessions it served end"
        )

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        self.conn.close()  # the worker reads the end of its socket and exits
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Bound:
    """An object held by one worker process, or by several (copies of an object its methods never
    change); :meth:`call` runs its methods there."""

    def __init__(self, holders: list[_Worker], key: int, lock: threading.Lock) -> None:
        self._holders, self._key, self._lock = holders, key, lock
        weakref.finalize(self, _forget, holders, key)

    def call(self, method: str, *args: Any) -> Any:
        """``obj.method(*args)`` in the holder with the fewest calls in flight; its exceptions are
        raised here. A holder found dead is passed over for another (the object is the same
        there).

        Raises:
            WorkerLostError: every worker that held the object died.
        """
        holders = list(self._holders)
        while True:
            with self._lock:
                worker = min(holders, key=lambda w: (not w.alive, w.in_flight))
                worker.in_flight += 1
            try:
                return worker.request("call", self._key, (method, args))
            except WorkerLostError:
                holders.remove(worker)
                if not holders:
                    raise
            finally:
                with self._lock:
                    worker.in_flight -= 1

    @property
    def width(self) -> int:
        """How many live workers hold the object: the parts :meth:`call_parts` runs at once."""
        return sum(w.alive for w in self._holders)

    def call_parts(self, method: str, parts: Sequence[tuple]) -> list[Any]:
        """``obj.method(*args)`` for every ``args`` of ``parts``, each on a holder of its own
        (the least busy), all at once; the results in the order of ``parts``. For an object
        held everywhere whose work splits (a renderer's frames). A part whose worker dies, or
        that found no holder of its own, runs again by :meth:`call` on a live one; a part's
        error is raised here once every other part has answered (each worker stays in step).

        Raises:
            WorkerLostError: every worker that held the object died.
        """
        parts = list(parts)
        with self._lock:
            live = sorted((w for w in self._holders if w.alive), key=lambda w: w.in_flight)
            chosen = live[: len(parts)]
            for w in chosen:
                w.in_flight += 1
        results: list[Any] = [None] * len(parts)
        redo = list(range(len(chosen), len(parts)))
        error: BaseException | None = None
        sent: list[int] = []
        try:
            # Every caller takes several workers' locks in one order (their serials), so two
            # split calls never hold one lock each while waiting for the other's.
            for i in sorted(range(len(chosen)), key=lambda i: chosen[i].serial):
                worker = chosen[i]
                worker.lock.acquire()
                try:
                    worker.send("call", self._key, (method, parts[i]))
                    sent.append(i)
                except WorkerLostError:
                    worker.lock.release()
                    redo.append(i)
                except BaseException as err:
                    worker.lock.release()
                    error = error or err
            for i in sent:
                try:
                    results[i] = chosen[i].receive()
                except WorkerLostError:
                    redo.append(i)
                except BaseException as err:
                    error = error or err
                finally:
                    chosen[i].lock.release()
        finally:
            with self._lock:
                for w in chosen:
                    w.in_flight -= 1
        if error is not None:
            raise error
        for i in sorted(redo):
            results[i] = self.call(method, *parts[i])
        return results

    def call_each(self, method: str, *args: Any) -> list[Any]:
        """``obj.method(*args)`` in every holder, one after another (first-use costs)."""
        return [w.request("call", self._key, (method, args)) for w in self._holders]


def _forget(holders: list[_Worker], key: int) -> None:
    # May run inside the garbage collector on any thread, even one holding the worker's lock:
    # never block; the next request sends it.
    for worker in holders:
        worker.bound -= 1
        worker.forgotten.append(key)


class ProcessPool:
    """``processes`` worker processes; each imports ``preload`` when it starts.

    Args:
        processes: how many (>= 1).
        preload: modules every worker imports before its first request (what unpickling the
            bound objects needs), so a first bind does not pay for them.
    """

    def __init__(self, processes: int, preload: Sequence[str] = ()) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self._preload = tuple(preload)
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._workers = [_Worker(self._preload) for _ in range(processes)]

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in self._workers]

    def bind(self, obj: Any, everywhere: bool = False) -> Bound:
        """Send ``obj`` to the worker that holds the fewest objects, or with ``everywhere`` to
        every worker (only for an object its methods never change: each call runs on one of
        them); a dead worker is replaced first."""
        with self._lock:
            for i, w in enumerate(self._workers):
                if not w.alive:
                    self._workers[i] = _Worker(self._preload)
            holders = (
                list(self._workers) if everywhere else [min(self._workers, key=lambda w: w.bound)]
            )
            for worker in holders:
                worker.bound += 1
            key = next(self._keys)
        sent: list[_Worker] = []
        try:
            for worker in holders:
                worker.request("bind", key, obj)
                sent.append(worker)
        except BaseException:
            _forget(sent, key)
            for worker in holders[len(sent) :]:
                worker.bound -= 1
            raise
        return Bound(holders, key, self._lock)

    def close(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        for w in workers:
            w.close()


_pools: dict[tuple[int, tuple[str, ...]], ProcessPool] = {}
_pools_lock = threading.Lock()


def shared_pool(processes: int, preload: Sequence[str] = ()) -> ProcessPool:
    """The process's pool of this size and preload (made on first use, kept until exit)."""
    key = (processes, tuple(preload))
    with _pools_lock:
        if key not in _pools:
            _pools[key] = ProcessPool(processes, preload)
        return _pools[key]


@atexit.register
def _close_pools() -> None:
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


# A worker: python -m talkloop.pipeline.core.workers FD MEMFD [MODULE...] (MEMFD -1: none).
if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])), sys.argv[3:], _SharedResults(int(sys.argv[2])))
