"""What a measurement's processes cost in CPU, and what the host took from them (Linux ``/proc``).

A late frame says that a call missed its time, not why: our code's cost and a busy host look the
same. A level of ``talkloop bench --calls`` therefore also reports, over a window in the middle of
its calls, the cores its server (with its render workers) and its clients used, and the share of
the machine's CPU time the hypervisor gave to others (``steal`` in ``/proc/stat``). The cores a
call costs predict the capacity of another machine of the kind; a steal share of several percent
says that this run's late frames were partly the host's (on a 2-core VM of 2026-12-06 it moved
between 3 and 28 % from one 5 s to the next while two calls ran, docs/benchmarks.md).

Elsewhere than Linux every figure is None.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_STEAL = 7  # the steal column of /proc/stat's "cpu" line, counting from user = 0


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first); None: no such
    process (or no /proc)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds the process ``pid`` has used (its threads included, its
    children not); None when it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a server and its render workers)."""
    parents: dict[int, list[int]] = {}
    for entry in PROC.glob("[0-9]*"):
        fields = _stat_fields(int(entry.name))
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


def snapshot(groups: Mapping[str, Sequence[int]]) -> CpuSnapshot:
    """The CPU seconds so far of every process of ``groups`` (name -> pids) that is alive."""
    seconds: dict[str, dict[int, float]] = {}
    for name, pids in groups.items():
        seconds[name] = {}
        for pid in pids:
            s = cpu_seconds(pid)
            if s is not None:
                seconds[name][pid] = s
    return CpuSnapshot(time.monotonic(), seconds, host_ticks())


def cores_between(a: CpuSnapshot, b: CpuSnapshot) -> dict[str, float | None]:
    """Cores each group used from ``a`` to ``b`` (``<group>_cores``: CPU seconds over elapsed
    seconds, counting the processes alive at both), and ``steal_pct``, the share of the
    machine's CPU time the hypervisor took meanwhile (None where it is not known)."""
    span = b.at - a.at
    out: dict[str, float | None] = {}
    for name, after in b.seconds.items():
        before = a.seconds.get(name, {})
        used = sum(after[p] - before[p] for p in after if p in before)
        out[f"{name}_cores"] = round(used / span, 3) if span > 0 and before else None
    out["steal_pct"] = None
    if a.host and b.host and b.host[0] > a.host[0]:
        out["steal_pct"] = round(100 * (b.host[1] - a.host[1]) / (b.host[0] - a.host[0]), 1)
    return out
