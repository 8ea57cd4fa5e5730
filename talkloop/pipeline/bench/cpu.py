"""What a measurement's processes cost in CPU, and what the host took from them (Linux ``/proc``).

A late frame says that a call missed its time, not why: our code's cost and a busy host look the
same. A level of ``talkloop bench --calls`` therefore also reports, over a window in the middle of
its calls, the cores its server (with its render workers) and its clients used, and the share of
the machine's CPU time the hypervisor gave to others (``steal`` in ``/proc/stat``). The cores a
call costs predict the capacity of another machine of the kind; a steal share of several percent
says that this run's late frames were partly the host's (on a 2-core VM of 2026-12-06 it moved
between 3 and 28 % from one 5 s to the next while two calls ran, docs/benchmarks.md). Within
the server, the cores of each of its threads by name say which part of a call costs what (the
server names its threads in the OS: ``talkloop/pipeline/core/threadnames.py``).

Elsewhere than Linux every figure is None.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
_STEAL = 7  # the steal column of /proc/stat's "cpu" line, counting from user = 0
MAIN_THREAD = "MainThread"  # what thread_seconds calls a process's main thread (Python's name)


def _stat_fields(path: Path) -> list[str] | None:
    """The fields of a ``stat`` file of ``/proc`` after the command name (state first); None:
    no such process or thread (or no /proc)."""
    try:
        text = (path / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _seconds(fields: list[str]) -> float:
    """User plus system CPU seconds of a ``stat`` line's fields."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds the process ``pid`` has used (its threads included, its
    children not); None when it is gone."""
    fields = _stat_fields(PROC / str(pid))
    return None if fields is None else _seconds(fields)


def thread_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of the process ``pid``: its name in the OS (``comm``; the main thread's is
    ``MAIN_THREAD``) and the CPU seconds it has used. Empty when the process is gone."""
    out: dict[int, tuple[str, float]] = {}
    for task in (PROC / str(pid) / "task").glob("[0-9]*"):
        fields = _stat_fields(task)
        try:
            name = (task / "comm").read_text().rstrip("\n")
        except OSError:
            continue  # the thread ended meanwhile
        if fields is not None:
            tid = int(task.name)
            out[tid] = (MAIN_THREAD if tid == pid else name, _seconds(fields))
    return out


def with_descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a server and its render workers)."""
    parents: dict[int, list[int]] = {}
    for entry in PROC.glob("[0-9]*"):
        fields = _stat_fields(entry)
        if fields is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(parents.get(p, []))
    return tree


def host_ticks(stat: str | None = None) -> tuple[int, int] | None:
    """(all, steal) clock ticks of the machine's CPUs so far, from ``/proc/stat`` (or ``stat``,
    its text); None without it."""
    if stat is None:
        try:
            stat = (PROC / "stat").read_text()
        except OSError:
            return None
    for line in stat.splitlines():
        name, *values = line.split()
        if name == "cpu":
            ticks = [int(v) for v in values[:8]]  # user .. steal; guest time is inside user
            return sum(ticks), (ticks[_STEAL] if len(ticks) > _STEAL else 0)
    return None


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds of groups of processes and the machine's ticks, at one moment."""

    at: float  # time.monotonic()
    seconds: dict[str, dict[int, float]]  # group -> pid -> CPU seconds
    host: tuple[int, int] | None
    threads: dict[int, tuple[str, float]] = field(default_factory=dict)  # one process's, by tid


def snapshot(groups: Mapping[str, Sequence[int]], threads_of: int | None = None) -> CpuSnapshot:
    """The CPU seconds so far of every process of ``groups`` (name -> pids) that is alive, and
    of each thread of the process ``threads_of`` (if given)."""
    seconds: dict[str, dict[int, float]] = {}
    for name, pids in groups.items():
        seconds[name] = {}
        for pid in pids:
            s = cpu_seconds(pid)
            if s is not None:
                seconds[name][pid] = s
    threads = thread_seconds(threads_of) if threads_of is not None else {}
    return CpuSnapshot(time.monotonic(), seconds, host_ticks(), threads)


def cores_between(a: CpuSnapshot, b: CpuSnapshot) -> dict[str, float | None]:
    """Cores each group used from ``a`` to ``b`` (``<group>_cores``: CPU seconds over elapsed
    seconds, counting the processes alive at both; None where none was), and ``steal_pct``, the
    share of the machine's CPU time the hypervisor took meanwhile (None where it is not known)."""
    span = b.at - a.at
    out: dict[str, float | None] = {}
    for name, after in b.seconds.items():
        before = a.seconds.get(name, {})
        both = [p for p in after if p in before]
        used = sum(after[p] - before[p] for p in both)
        out[f"{name}_cores"] = round(used / span, 3) if span > 0 and both else None
    out["steal_pct"] = None
    if a.host and b.host and b.host[0] > a.host[0]:
        out["steal_pct"] = round(100 * (b.host[1] - a.host[1]) / (b.host[0] - a.host[0]), 1)
    return out


def thread_cores_between(a: CpuSnapshot, b: CpuSnapshot) -> dict[str, float]:
    """Cores the threads of ``threads_of`` used from ``a`` to ``b``, summed by thread name
    (the name at ``b``). A thread that started in between counts with all it used (its clock
    started at 0); one that ended in between is not known by name and is left out."""
    span = b.at - a.at
    out: dict[str, float] = {}
    if span <= 0:
        return out
    for tid, (name, after) in b.threads.items():
        before = a.threads[tid][1] if tid in a.threads else 0.0
        out[name] = out.get(name, 0.0) + (after - before) / span
    return {name: round(cores, 3) for name, cores in out.items()}
