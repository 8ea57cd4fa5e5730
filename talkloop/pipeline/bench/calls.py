"""Calls per node: how many live calls at once this machine carries (``talkloop bench --calls N``).

For n = 1, 2, ... up to N: ``talkloop serve --max-sessions n`` on the bundled default avatar of
the family, with the video and model flags the bench was given (``serve_flags``: the frame size,
the steps, ...), and n scripted calls at once (``talkloop.rtc.client``), each client in its own
process as a browser would be, but on the same cores as the server (a real node does not spend
the clients' decoding: the figure is a floor). The n calls start at one moment, once every client
has loaded. A level passes when every call has at most 1 % of its frame slots late or missed and
no chunk was skipped, in every one of its runs (``--level-runs``: a shared VM's speed drifts
within minutes, and one run of a level says little about the next); the first level that fails
ends the measurement. The largest level that passed is this machine's capacity: printed with the
CPU, written to ``OUT/calls.json`` and cached for ``talkloop worker --slots auto``
(``~/.cache/talkloop/backends/capacity-<key>.json``, keyed by the CPU model and flags and the
servers' flags: the family, the frame size and any other flag given). Each level also reports
what its calls cost, measured over the middle of the calls: the cores its server (with its render
workers) and its clients used, per call, the share of the CPU time the host took meanwhile
(``talkloop/pipeline/bench/cpu.py``), and how the server's cores split between the parts of a
call (``SERVER_PARTS``, by the names the server gives its threads).

The calls stay on loopback. ICE skips 127.0.0.1, so as root the bench runs them in a private
network namespace on 127.0.0.2 (``talkloop bench`` starts it, as ``--live`` does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from talkloop.pipeline.backends.cache import atomic_path, cache_dir, key
from talkloop.pipeline.bench.cpu import (
    MAIN_THREAD,
    CpuSnapshot,
    cores_between,
    snapshot,
    thread_cores_between,
    with_descendants,
)
from talkloop.pipeline.core.config import cpu_info
from talkloop.rtc.client import wait_serving

LATE_PCT_MAX = 1.0  # a call with more late or missed frame slots than this fails its level
# Between two audio frames reaching a client, more than three 20 ms packets' time: the server sent
# late (its event loop or encoder waited), what the late count, taken in the server when a frame
# is due, does not see. Reported, not a criterion: a receiver's jitter buffer hides a few.
AUDIO_GAP_S = 0.06
# The part of a level's calls whose CPU is measured: past the calls' start (ICE, DTLS, the
# encoders' first keyframes), before their end.
CPU_WINDOW = (0.25, 0.9)
SERVER_EXIT_S = 60.0  # how long a level's server may take to exit after SIGTERM
# The server's threads by the start of their names (``talkloop serve`` gives the OS its threads'
# Python names), the first match: the part of the calls each does. Its render workers are
# processes of their own (``render_workers``); a thread none matches, or one that ended while
# measured, counts as ``other``.
SERVER_PARTS = (
    (MAIN_THREAD, "event_loop"),  # signalling, every call's RTP, RTCP and SRTP, the pacing
    ("engine-publish", "publish"),  # a chunk's frames: sent to the render workers, published
    ("engine", "engine"),  # each turn's motion net and audio features, for every call in it
    ("asyncio", "executor"),  # asyncio's executor: aiortc's encoders (I420, x264, Opus)
    ("audio-decoder", "microphone"),  # aiortc's Opus decoding of a call's microphone
    ("mic-", "microphone"),  # a call's decoded microphone frames to float mono
    ("talkloop-control", "control"),  # opening and closing calls
)


def capacity_file(serve_args: list[str]) -> Path:
    """Where the capacity measured on this CPU for servers run with ``serve_args``
    (``serve_flags``) is kept."""
    cpu = cpu_info()
    return (
        cache_dir()
        / f"capacity-{key(cpu.get('model name', ''), cpu.get('flags', ''), *serve_args)}.json"
    )


def measured_capacity(serve_args: list[str]) -> int | None:
    """The calls per node ``talkloop bench --calls`` measured here for servers run with
    ``serve_args`` (None: never)."""
    try:
        return int(json.loads(capacity_file(serve_args).read_text())["calls"])
    except (OSError, ValueError, KeyError):
        return None


def one_call(data: dict) -> dict:
    """The figures of one client's record (``talkloop.rtc.client`` output)."""
    stats = data["stats"][-1] if data["stats"] else {}
    t = data["video_times"]
    sent = stats.get("frames_sent") or 0
    overrun = stats.get("overrun_frames") or 0
    late = stats.get("late_frames") or 0
    slots = sent + overrun
    return {
        "frames_sent": sent,
        "late_frames": late,
        "overrun_frames": overrun,
        "skipped_frames": stats.get("skipped_frames") or 0,
        "rtf": stats.get("rtf"),
        # what the server computed with: the backend `auto` chose (timed once, cached) and dtype
        "runtime": stats.get("runtime"),
        # chunks per turn of the server's engine (above 1: calls shared the motion net's forward)
        "chunks_per_turn": (stats.get("engine") or {}).get("chunks_per_turn"),
        "video": data["session"].get("video"),  # the size and rate the server sent the call
        # every frame slot of the call that did not show a new frame on time
        "late_pct": round(100 * (late + overrun) / slots, 2) if slots else 100.0,
        "arrival_fps": round((len(t) - 1) / (t[-1] - t[0]), 2) if len(t) > 1 else 0.0,
        # how evenly the media reached the client (the server's delivery, after the late count)
        "audio_gaps": int(np.count_nonzero(np.diff(data["audio_times"]) > AUDIO_GAP_S)),
        "longest_audio_gap_ms": longest_gap_ms(data["audio_times"]),
        "longest_video_gap_ms": longest_gap_ms(t),
        "errors": data["errors"],
    }


def longest_gap_ms(times: list[float]) -> float | None:
    """The longest wait between two arrivals (ms; None for fewer than two)."""
    return round(1000 * float(np.diff(times).max()), 1) if len(times) > 1 else None


def passes(level: dict) -> bool:
    """Every call of the level kept up: <= 1 % late or missed, no skipped chunk, no error."""
    return all(
        c["late_pct"] <= LATE_PCT_MAX and not c["skipped_frames"] and not c["errors"]
        for c in level["per_call"]
    )


def start_together(clients: list[subprocess.Popen]) -> None:
    """Start the calls of ``clients`` (``talkloop.rtc.client --ready``) at one moment, once every
    one of them has loaded: a client still loading would take seconds of CPU from the calls
    already running, which the calls of a real node (browsers elsewhere) do not.

    Raises:
        RuntimeError: a client exited before it was ready (the others are stopped: none is left
            waiting for a start that will not come).
    """
    for c in clients:
        assert c.stdin is not None and c.stdout is not None
        if c.stdout.readline().strip() != "ready":
            for other in clients:
                other.kill()
            raise RuntimeError(f"a bench client exited with {c.wait()} before its call started")
    for c in clients:
        c.stdin.write("go\n")
        c.stdin.close()


def run_level(
    n: int, seconds: float, serve_args: list[str], out: Path, host: str, run: int = 1
) -> dict:
    """One level: a server run with ``serve_args`` and ``n`` slots, and ``n`` calls of
    ``seconds`` at once; ``run``: which run of the level it is (its files in ``out`` are named
    for it from the second on)."""
    port = 8100 + n
    cmd = [sys.executable, "-m", "talkloop", "serve", "--host", host, "--port", str(port)]
    cmd += ["--max-sessions", str(n), *serve_args]
    tag = f"{n}" if run == 1 else f"{n}-run{run}"
    with open(out / f"serve-{tag}.log", "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            try:
                wait_serving(f"http://{host}:{port}", server, timeout=300)
            except RuntimeError as err:
                log.flush()
                tail = (out / f"serve-{tag}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{err}; its output ended with:\n{tail}") from None
            url = f"ws://{host}:{port}/ws"
            files = [out / f"call-{tag}-{i}.json" for i in range(n)]
            clients = [
                subprocess.Popen(
                    [sys.executable, "-m", "talkloop.rtc.client", url, str(seconds), str(f)]
                    + ["--ready"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for f in files
            ]
            start_together(clients)
            cost = measure_cost(server.pid, [c.pid for c in clients], seconds)
            for c in clients:
                c.wait(timeout=seconds + 300)
            calls = [one_call(json.loads(f.read_text())) for f in files]
        finally:
            stop_server(server, out / f"serve-{tag}.log")
    return {"calls": n, "run": run, "per_call": calls, "cost": cost}


def stop_server(server: subprocess.Popen, log: Path, timeout: float = SERVER_EXIT_S) -> None:
    """End a level's ``talkloop serve`` with SIGTERM, as a service manager does.

    Raises:
        RuntimeError: it had not exited ``timeout`` seconds later (it is killed: no server is
            left running between levels). A server that does not stop is a fault of the code
            measured, not a figure: a stuck chunk keeps its calls from closing.
    """
    server.terminate()
    try:
        server.wait(timeout=timeout)
    except subprocess.TimeoutExpired as err:
        server.kill()
        server.wait()
        raise RuntimeError(
            f"talkloop serve (pid {server.pid}) had not exited {timeout:g} s after SIGTERM and "
            f"was killed; its output: {log}"
        ) from err


def measure_cost(server: int, clients: list[int], seconds: float) -> dict[str, float | None]:
    """The cores the server (its render workers included) and the clients of a level use over
    ``CPU_WINDOW`` of its ``seconds``-long calls, which started now, per call too, and the
    host's steal share meanwhile (``talkloop/pipeline/bench/cpu.py``)."""
    time.sleep(CPU_WINDOW[0] * seconds)
    groups = {"server": with_descendants(server), "client": clients}
    first = snapshot(groups, threads_of=server)
    time.sleep((CPU_WINDOW[1] - CPU_WINDOW[0]) * seconds)
    last = snapshot(groups, threads_of=server)
    cost: dict = dict(cores_between(first, last))
    used = [cost["server_cores"], cost["client_cores"]]
    cost["cores_per_call"] = None if None in used else round(sum(used) / len(clients), 3)
    cost["server_parts"] = server_parts(first, last, server)
    return cost


def server_parts(first: CpuSnapshot, last: CpuSnapshot, server: int) -> dict[str, float]:
    """The cores the server's parts (``SERVER_PARTS``, and its render workers) used between the
    two snapshots, each part's threads summed; empty where the threads are not known. A thread
    no part names, and what threads that ended in between used (the server's own CPU time keeps
    it; their names went with them), count as ``other``."""
    span = last.at - first.at
    threads = thread_cores_between(first, last)
    before, after = first.seconds["server"], last.seconds["server"]
    if not threads or span <= 0 or server not in before or server not in after:
        return {}
    parts: dict[str, float] = {}
    workers = sum(after[p] - before[p] for p in after if p in before and p != server)
    parts["render_workers"] = workers / span
    for name, cores in threads.items():
        part = next((part for start, part in SERVER_PARTS if name.startswith(start)), "other")
        parts[part] = parts.get(part, 0.0) + cores
    ended = (after[server] - before[server]) / span - sum(threads.values())
    parts["other"] = parts.get("other", 0.0) + max(0.0, ended)
    return {part: round(cores, 3) for part, cores in sorted(parts.items(), key=lambda x: -x[1])}


def print_level(level: dict, runs: int) -> None:
    """A line per call of ``level`` (run ``level["run"]`` of ``runs``)."""
    n = level["calls"]
    name = f"{n} call(s)" if runs == 1 else f"{n} call(s), run {level['run']} of {runs}"
    for i, c in enumerate(level["per_call"]):
        print(
            f"{name}, call {i + 1}: {c['late_pct']} % late or missed "
            f"({c['late_frames']} late, {c['overrun_frames']} overrun of "
            f"{c['frames_sent'] + c['overrun_frames']} slots), skipped {c['skipped_frames']}, "
            f"arrival {c['arrival_fps']} fps, audio gaps over {AUDIO_GAP_S * 1000:g} ms "
            f"{c['audio_gaps']} (longest {c['longest_audio_gap_ms']} ms, video's "
            f"{c['longest_video_gap_ms']}), rtf {c['rtf']}, "
            f"chunks per turn {c['chunks_per_turn']}, errors {len(c['errors'])}",
            flush=True,
        )


def measure_calls(
    max_calls: int,
    seconds: float,
    serve_args: list[str],
    out: Path,
    host: str = "127.0.0.2",
    runs: int = 1,
) -> dict:
    """Levels 1..``max_calls`` of servers run with ``serve_args`` (``serve_flags``: the family
    first), each ``runs`` times, until a level fails one of its runs; the result, also written
    and cached."""
    family = serve_args[serve_args.index("--family") + 1]
    out.mkdir(parents=True, exist_ok=True)
    cpu = cpu_info().get("model name", "unknown CPU")
    levels, capacity = [], 0
    for n in range(1, max_calls + 1):
        level_runs = [run_level(n, seconds, serve_args, out, host, k) for k in range(1, runs + 1)]
        for level in level_runs:
            level["passed"] = passes(level)
            levels.append(level)
            print_level(level, runs)
        if not all(level["passed"] for level in level_runs):
            break
        capacity = n
    result = {
        "calls": capacity,
        "family": family,
        "serve_args": serve_args,
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "seconds": seconds,
        "level_runs": runs,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "levels": levels,
    }
    (out / "calls.json").write_text(json.dumps(result, indent=2) + "\n")
    cache = capacity_file(serve_args)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(cache) as tmp:
        tmp.write_text(json.dumps({k: v for k, v in result.items() if k != "levels"}) + "\n")
    print(
        f"calls per node ({' '.join(serve_args)}, {cpu}, {result['cores']} cores, clients on the "
        "same cores): "
        f"{capacity} with every call <= {LATE_PCT_MAX:g} % late or missed and no skipped chunk"
        + (f" in each of {runs} runs" if runs > 1 else "")
    )
    return result


def main(argv: list[str]) -> int:
    """``python -m talkloop.pipeline.bench.calls SPEC RESULT`` (how ``talkloop bench`` runs it)."""
    spec = json.loads(Path(argv[0]).read_text())
    result = measure_calls(
        spec["max_calls"],
        spec["seconds"],
        spec["serve_args"],
        Path(spec["out"]),
        spec["host"],
        spec["level_runs"],
    )
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
