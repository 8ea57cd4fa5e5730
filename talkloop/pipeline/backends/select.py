"""``--backend auto``: time the available backends on this machine once, cache the winner.

The timed work is a family's own probe (for studio: the networks' work for one N chunk of the
config's schedule), min of several runs, so a busy neighbour on a shared machine costs a slower
pick at worst, never a wrong result. The choice is cached in ``<cache>/auto-<key>.json``, keyed by
the CPU model and flags, the library versions and the family's ``identity`` (for studio: its
weights and the probe's shapes), and reused by every later process.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from talkloop.pipeline.backends.cache import cache_dir, cached_file, key
from talkloop.pipeline.backends.runtime import available_backends, check_available

log = logging.getLogger("talkloop.backends")

# backend -> a callable that runs the family's probe once on that backend
Probes = dict[str, Callable[[], object]]


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "onnxruntime", "openvino"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = ""
    return out


def time_probe(probe: Callable[[], object], runs: int = 5) -> float:
    """Min seconds of ``runs`` calls of ``probe`` after one warm-up call."""
    probe()
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        probe()
        best = min(best, time.perf_counter() - t0)
    return best


def resolve_backend(
    requested: str, device: str, identity: str, make_probes: Callable[[tuple[str, ...]], Probes]
) -> str:
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
    from talkloop.pipeline.core.config import cpu_info

    cpu = cpu_info()
    k = key(cpu.get("model name", ""), cpu.get("flags", ""), _versions(), identity, candidates)
    path = cache_dir() / f"auto-{k}.json"

    def measure(tmp) -> None:  # noqa: ANN001
        probes = make_probes(candidates)
        seconds = {name: time_probe(probe) for name, probe in probes.items()}
        choice = min(seconds, key=seconds.__getitem__)
        log.info("backend auto: %s (probe seconds %s)", choice, seconds)
        tmp.write_text(json.dumps({"backend": choice, "probe_s": seconds}, indent=2) + "\n")

    choice = json.loads(cached_file(path, measure).read_text())["backend"]
    return choice if choice in candidates else "torch"
