"""``--backend auto`` and ``--dtype auto``: time the candidates on this machine once, cache the winner.

The timed work is a family's own probe (for example the networks' work for one N chunk of the
config's schedule), min of several runs, the candidates taking turns run by run: a burst of load
on a shared machine then slows every candidate alike instead of whichever was being timed. Timed
one after the other, a probe made while the test suite ran on the same 2 cores took ONNX Runtime
39 % longer and torch 12 % (torch won by 0.7 %), and live calls then ran the motion net on torch at
2.5 times its cost (docs/benchmarks.md, "Figures behind code choices"). A busy neighbour costs a
slower pick at worst, never a wrong result. The choice is cached in ``<cache>/auto-<key>.json``
(backend) or ``<cache>/dtype-<key>.json``, keyed by the CPU model and flags, the library versions
and the family's ``identity`` (its weights and the probe's shapes), and reused by every later
process.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from talkloop.pipeline.backends.cache import cache_dir, cached_file, key
from talkloop.pipeline.backends.runtime import available_backends, check_available
from talkloop.pipeline.core.config import cpu_info, native_bf16

if TYPE_CHECKING:
    from talkloop.pipeline.core.config import TalkloopConfig

log = logging.getLogger("talkloop.backends")

# backend -> a callable that runs the family's probe once on that backend
Probes = dict[str, Callable[[], object]]
# the candidates to time -> their probes
ProbeFactory = Callable[[tuple[str, ...]], Probes]


def _versions() -> dict[str, str]:

    out = {}
    for pkg in ("torch", "onnxruntime", "openvino"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = ""
    return out


def schedule_key(config: TalkloopConfig) -> str:
    """The shapes a family's probe runs (frame size, chunk schedule, sampler steps): part of a
    cached choice's key, since the best candidate differs between live and offline chunks."""
    s = config.schedule
    return (
        f"{config.video.width}x{config.video.height}:n{s.n_len}:c{s.ctx_len}"
        f":s{config.sampler.steps}"
    )


def timed(probe: Callable[[], object]) -> float:
    """Seconds of one call of ``probe``. A probe that returns a number has timed the part that
    counts itself (a session probe leaves out its set-up)."""
    t0 = time.perf_counter()
    own = probe()
    took = time.perf_counter() - t0
    return float(own) if isinstance(own, int | float) else took


def time_probes(probes: Probes, runs: int = 5) -> dict[str, float]:
    """Min seconds of ``runs`` calls of each probe, after one warm-up call of each; the probes
    take turns (one call of each, ``runs`` times), so that load that comes and goes meanwhile
    falls on all of them alike."""
    for probe in probes.values():
        probe()
    best = dict.fromkeys(probes, float("inf"))
    for _ in range(runs):
        for name, probe in probes.items():
            best[name] = min(best[name], timed(probe))
    return best


def fastest(
    what: str,
    identity: str,
    candidates: tuple[str, ...],
    make_probes: ProbeFactory,
    runs: int = 5,
) -> str:
    """The candidate whose probe ran fastest here, measured once and cached.

    Args:
        what: what is chosen, ``backend`` or ``dtype``: the cache file's prefix and the name of
            the choice inside it.
        identity: what else the choice depends on (the family, its weights' hash, the probe's
            shapes).
        candidates: the options to time.
        make_probes: builds the probe of each of the given candidates.
        runs: timed runs of each probe (the fastest counts).
    Returns:
        One of ``candidates``.
    """

    cpu = cpu_info()
    k = key(cpu.get("model name", ""), cpu.get("flags", ""), _versions(), identity, candidates)
    prefix = "auto" if what == "backend" else what  # backend choices kept their old file names
    path = cache_dir() / f"{prefix}-{k}.json"

    def measure(tmp) -> None:  # noqa: ANN001
        probes = make_probes(candidates)
        seconds = time_probes(probes, runs)
        choice = min(seconds, key=seconds.__getitem__)
        log.info("%s auto: %s (probe seconds %s)", what, choice, seconds)
        tmp.write_text(json.dumps({what: choice, "probe_s": seconds}, indent=2) + "\n")

    choice = json.loads(cached_file(path, measure).read_text()).get(what)
    return choice if choice in candidates else candidates[0]


def resolve_backend(requested: str, device: str, identity: str, make_probes: ProbeFactory) -> str:
    """The backend to run: ``requested``, or for ``auto`` the fastest here (cached).

    Args:
        requested: ``auto``, ``torch``, ``onnxruntime`` or ``openvino``.
        device: ``cpu`` or ``cuda``; exported graphs run on the CPU, so auto on CUDA is torch.
        identity: what else the choice depends on (the family and its weights' hash).
        make_probes: builds the probe of each of the given backends.
    """
    if requested != "auto":
        check_available(requested)
        return requested
    candidates = available_backends()
    if device != "cpu" or len(candidates) == 1:
        return "torch"
    return fastest("backend", identity, candidates, make_probes)


def resolve_dtype(
    requested: str, device: str, identity: str, make_probes: ProbeFactory
) -> Literal["bfloat16", "float32"]:
    """The compute dtype to run: ``requested``, or for ``auto`` the faster here (cached).

    On CUDA ``auto`` is bfloat16. On a CPU both are timed on the family's own probe where the
    CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere PyTorch emulates bf16, several
    times slower than float32 (docs/benchmarks.md), and float32 is taken without timing an emulation.
    """

    if requested != "auto":
        return requested  # type: ignore[return-value]
    if device != "cpu":
        return "bfloat16"
    if not native_bf16("cpu"):
        return "float32"
    # A probe is a whole session (init + two chunks): three runs of each are enough to rank.
    chosen = fastest("dtype", identity, ("float32", "bfloat16"), make_probes, runs=3)
    return chosen  # type: ignore[return-value]
