"""The phase graph: which stages run in which phase, and the check that every field a stage reads
has a producer and every module it needs is loaded (at construction, not in minute 40)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.errors import PipelineError
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.core.stage import Stage
from talkloop.pipeline.core.state import SESSION_FIELDS

# Session fields that start as None and are valid that way ("start of stream").
SESSION_START_VALUES = frozenset(
    {"context_latents", "context_audio", "audio_norm", "decoder_cache"}
)


@dataclass
class Phase:
    """A list of stages and the work fields the pipeline provides to them."""

    name: str
    inputs: frozenset[str]
    stages: Sequence[Stage]


def default_phases(config: TalkloopConfig) -> dict[str, Phase]:
    """The stages of the configured model family (``talkloop/pipeline/models/registry.py``)."""
    from talkloop.pipeline.models.registry import phases

    return phases(config)


def check_graph(phases: Mapping[str, Phase], modules: Mapping[str, Module]) -> None:
    """Raise PipelineError naming the first stage that reads a field nobody produces or needs a
    module that is not loaded."""
    init = phases.get("init")
    from_init = {f for s in init.stages for f in s.writes} if init else set()
    for phase in phases.values():
        available = set(phase.inputs) | (SESSION_START_VALUES & SESSION_FIELDS)
        if phase.name != "init":
            available |= from_init & SESSION_FIELDS
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
