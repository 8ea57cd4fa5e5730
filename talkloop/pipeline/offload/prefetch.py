"""Stage-to-stage prefetch: while a stage runs, the next stage's model starts loading.

The pipeline knows the order of its stages; this hook, called by ``Pipeline.run_phase`` before
each stage, marks the offloaded modules the stage uses as active and issues the copies of the
first blocks of the next offloaded module in the chunk cycle (``n_chunk`` -> ``i_chunk`` ->
``publish`` -> ``n_chunk`` ...), so they overlap the current stage's compute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from talkloop.pipeline.offload.offloaded import BlockOffloader

CHUNK_CYCLE = ("n_chunk", "i_chunk", "publish")


class StagePrefetcher:
    """Callable ``(phase_name, stage) -> None`` for ``Pipeline.stage_hooks``.

    Args:
        phases: the pipeline's phases.
        offloaders: the offloaded modules by name.
        first_blocks: blocks of the next module to prefetch (``model.stage_prefetch_blocks``).
    """

    def __init__(
        self, phases: Mapping[str, Any], offloaders: Mapping[str, BlockOffloader], first_blocks: int
    ) -> None:
        self.offloaders = dict(offloaders)
        self.first_blocks = first_blocks
        self.cycle: list[tuple[str, str, tuple[str, ...]]] = [
            (p, s.name, tuple(s.needs))
            for p in CHUNK_CYCLE
            if p in phases
            for s in phases[p].stages
        ]

    def next_module(self, phase: str, stage_name: str, needs: Sequence[str]) -> str | None:
        """The first offloaded module, after this stage in the cycle, that this stage does not use."""
        try:
            start = next(
                k for k, (p, s, _) in enumerate(self.cycle) if p == phase and s == stage_name
            )
        except StopIteration:
            start = -1  # init / prompt: the cycle comes next
        n = len(self.cycle)
        for step in range(1, n + 1):
            for name in self.cycle[(start + step) % n][2]:
                if name in self.offloaders and name not in needs:
                    return name
        return None

    def __call__(self, phase: str, stage: Any) -> None:
        needs = tuple(stage.needs)
        for name, off in self.offloaders.items():
            off.active = name in needs
        nxt = self.next_module(phase, stage.name, needs)
        if nxt is not None and self.first_blocks > 0:
            self.offloaders[nxt].prefetch_first(self.first_blocks)


def stage_prefetcher(pipeline: Any) -> StagePrefetcher | None:
    """The hook for ``pipeline``, or None when no module is offloaded."""
    offloaders = {
        name: m.runtime
        for name, m in pipeline.modules.items()
        if isinstance(getattr(m, "runtime", None), BlockOffloader)
    }
    if not offloaders:
        return None
    return StagePrefetcher(pipeline.phases, offloaders, pipeline.config.model.stage_prefetch_blocks)
