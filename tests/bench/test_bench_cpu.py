"""The CPU a level's processes use and the host's steal share (``talkloop.pipeline.bench.cpu``)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys

import pytest

from talkloop.pipeline.bench.cpu import (
    CpuSnapshot,
    cores_between,
    cpu_seconds,
    host_ticks,
    with_descendants,
)

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
    assert cores_between(a, CpuSnapshot(110.0, {"server": {}}, None)) == {
        "server_cores": 0.0,
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
