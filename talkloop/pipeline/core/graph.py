"""The phase graph: which stages run in which phase, and the check that every field a stage reads
has a producer and every module it needs is loaded (at construction, not in minute 40)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from talkloop.pipeline.core.errors import PipelineError
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.core.stage import Stage
from talkloop.pipeline.models.spec import StateField


@dataclass
class Phase:
    """A list of stages and the work fields the pipeline provides to them."""

    name: str
    inputs: frozenset[str]
    stages: Sequence[Stage]


def check_graph(
    phases: Mapping[str, Phase], modules: Mapping[str, Module], fields: Sequence[StateField]
) -> None:
    """Raise PipelineError naming the first stage that reads a field nobody produces or needs a
    module that is not loaded. ``fields``: the session's state fields (the rest is work)."""
    session = {f.name for f in fields}
    starts_empty = {f.name for f in fields if f.starts_empty}
    init = phases.get("init")
    from_init = {f for s in init.stages for f in s.writes} if init else set()
    for phase in phases.values():
        available = set(phase.inputs) | starts_empty
        if phase.name != "init":
            available |= from_init & session
        for stage in phase.stages:
            for need in stage.needs:
                if need not in modules:
                    raise PipelineError(
                        f"stage {stage.name!r} (phase {phase.name!r}) needs module {need!r}, "
                        f"which is not loaded (loaded: {', '.join(sorted(modules)) or 'none'})"
                    )
            for f in stage.reads:
                if f not in available:
                    raise PipelineError(
                        f"stage {stage.name!r} (phase {phase.name!r}) reads {f!r}, but no earlier "
                        f"stage writes it and it is not an input of the phase "
                        f"(inputs: {', '.join(sorted(phase.inputs))})"
                    )
            available |= set(stage.writes)
    for required in ("init", "n_chunk", "i_chunk", "publish"):
        if required not in phases:
            raise PipelineError(f"pipeline has no {required!r} phase")
    if "frames" not in {f for s in phases["publish"].stages for f in s.writes}:
        raise PipelineError("no stage of phase 'publish' writes 'frames'")
    if "latents" not in {f for s in phases["n_chunk"].stages for f in s.writes}:
        raise PipelineError("no stage of phase 'n_chunk' writes 'latents'")
