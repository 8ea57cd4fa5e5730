"""The CPU a level's processes and the server's threads use, and the host's steal share
(``talkloop.pipeline.bench.cpu``, ``talkloop.pipeline.bench.calls.server_parts``)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from talkloop.pipeline.bench.calls import server_parts
from talkloop.pipeline.bench.cpu import (
    MAIN_THREAD,
    CpuSnapshot,
    cores_between,
    cpu_seconds,
    host_ticks,
    snapshot,
    thread_cores_between,
    with_descendants,
)
from talkloop.pipeline.core.threadnames import name_os_threads

# Two /proc/stat texts 10 s apart on a 2-core machine: 2,000 ticks, 150 of them stolen.
_STAT_BEFORE = "cpu  1000 0 200 5000 10 0 5 100 0 0\ncpu0 500 0 100 2500 5 0 3 50 0 0\n"
_STAT_AFTER = "cpu  2100 0 400 5550 10 0 5 250 0 0\ncpu0 1100 0 200 2800 5 0 3 125 0 0\n"

# Spins until this process has used half a second of CPU itself, says so, then waits to be killed.
_SPIN = (
    "import sys, time\n"
    "while time.process_time() < 0.5: pass\n"
    "print('spun', flush=True)\n"
    "sys.stdin.read()\n"
)


def _read_lines(fd: int, n: int, patience_s: float = 120.0) -> list[str]:
    """The first ``n`` lines written to ``fd``; fails the test rather than hang when a process
    that should write one never does."""
    data = b""
    while data.count(b"\n") < n:
        ready, _, _ = select.select([fd], [], [], patience_s)
        chunk = os.read(fd, 1024) if ready else b""
        if not chunk:
            pytest.fail(f"expected {n} lines, got {data!r}")
        data += chunk
    return data.decode().split()


@pytest.mark.unit
def test_host_ticks_reads_all_ticks_and_the_stolen_ones_from_proc_stat() -> None:
    assert host_ticks(_STAT_BEFORE) == (6315, 100)
    assert host_ticks("intr 1 2 3\n") is None  # no "cpu" line


@pytest.mark.unit
def test_cores_between_divides_cpu_seconds_by_the_time_between_and_names_the_steal() -> None:
    a = CpuSnapshot(100.0, {"server": {1: 5.0, 2: 1.0}, "client": {3: 2.0}}, (6315, 100))
    b = CpuSnapshot(110.0, {"server": {1: 12.0, 2: 4.0, 9: 50.0}, "client": {3: 3.5}}, (8315, 250))
    assert host_ticks(_STAT_AFTER) == b.host
    cpu = cores_between(a, b)
    # pid 9 was not there at the start: its seconds are not the window's
    assert cpu == {"server_cores": 1.0, "client_cores": 0.15, "steal_pct": 7.5}
    # every process of the group ended in the window: not known, rather than none used
    assert cores_between(a, CpuSnapshot(110.0, {"server": {}}, None)) == {
        "server_cores": None,
        "steal_pct": None,
    }


@pytest.mark.unit
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_and_its_children_are_counted_with_the_cpu_they_used() -> None:
    spawn = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {_SPIN!r}])\n"
    parent = subprocess.Popen(
        [sys.executable, "-c", spawn + _SPIN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        # both write to our pipe: once each has spun
        assert _read_lines(parent.stdout.fileno(), 2) == ["spun", "spun"]
        tree = with_descendants(parent.pid)
        assert tree[0] == parent.pid and len(tree) == 2
        # /proc counts whole clock ticks, a little behind the process's own clock
        assert all(cpu_seconds(pid) >= 0.4 for pid in tree)
    finally:
        for pid in with_descendants(parent.pid)[::-1]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        parent.wait(timeout=10)
    assert cpu_seconds(parent.pid) is None  # gone


@pytest.mark.unit
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_threads_of_a_process_are_counted_by_name_with_the_cpu_they_used() -> None:
    spun: list[float] = []
    started, done, release = threading.Event(), threading.Event(), threading.Event()

    def spin() -> None:
        started.set()
        while time.thread_time() < 0.3:
            pass
        spun.append(time.thread_time())
        done.set()
        release.wait(30)

    thread = threading.Thread(target=spin, name="engine-7")
    thread.start()
    started.wait(30)
    name_os_threads()
    first = snapshot({}, threads_of=os.getpid())
    assert done.wait(120), "the spinning thread never finished its 0.3 s"
    last = snapshot({}, threads_of=os.getpid())
    try:
        assert first.threads[thread.native_id][0] == "engine-7"
        assert last.threads[os.getpid()][0] == MAIN_THREAD
        # /proc counts whole clock ticks (10 ms), a little behind the thread's own clock
        used = last.threads[thread.native_id][1]
        assert spun[0] - 0.05 <= used <= spun[0] + 0.02
        cores = thread_cores_between(first, last)
        span = last.at - first.at
        assert cores["engine-7"] == pytest.approx(
            (used - first.threads[thread.native_id][1]) / span, abs=1e-3
        )
    finally:
        release.set()
        thread.join(30)


@pytest.mark.unit
def test_the_server_cores_split_into_its_parts_by_thread_name() -> None:
    server, worker = 100, 200
    names = {
        server: MAIN_THREAD,
        101: "engine-0",
        102: "engine-publish_",
        103: "asyncio_2",
        104: "mic-3734f7d24cd",
        105: "audio-decoder",
        106: "Thread-9",
    }
    before = {tid: (name, 10.0) for tid, name in names.items()}
    used = {server: 0.9, 101: 0.8, 102: 0.3, 103: 1.1, 104: 0.1, 105: 0.1, 106: 0.2}
    after = {tid: (name, 10.0 + used[tid]) for tid, name in names.items()}
    after[107] = ("engine-1", 0.4)  # started within the window: all it used counts
    before[108] = ("asyncio_5", 10.0)  # ended within it: its 0.5 s stay in the server's total
    a = CpuSnapshot(0.0, {"server": {server: 50.0, worker: 20.0}}, None, before)
    b = CpuSnapshot(10.0, {"server": {server: 54.4, worker: 22.0}}, None, after)
    assert server_parts(a, b, server) == {
        "render_workers": 0.2,
        "executor": 0.11,
        "event_loop": 0.09,
        "engine": 0.12,
        "publish": 0.03,
        "microphone": 0.02,
        "other": 0.07,  # Thread-9's 0.02 and the ended thread's 0.05
    }
    assert server_parts(a, CpuSnapshot(10.0, b.seconds, None), server) == {}  # no threads
