"""Pipeline: connects stages, owns each session's rolling memory and drives the chunk schedule.

A pipeline has five phases, each a list of stages over named fields (the family's, from
``registry.build_pipeline``):

- ``init``    (once per session): reference image and prompt -> the family's conditioning;
- ``prompt``  (when the prompt changes): the new text embedding (and what depends on it);
- ``n_chunk`` (per N chunk): audio windows -> features -> the chunk's latents;
- ``i_chunk`` (per I chunk): the new N chunk + the previous anchor -> the interior latents;
- ``publish`` (per display segment): latents in display order -> RGB frames (the family's own
  stages: a decoder, a renderer).

The phase graph and its check are in ``graph.py``; a session's loop is in ``session.py``.
Streaming and batch are the same loop: ``Session.step`` runs the next N chunk (and the I chunk
before it) as soon as its audio is there and publishes to the sinks. Batch mode pulls audio from
a finite source as fast as it can; streaming mode is fed by ``push_audio`` from another thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.errors import PipelineError
from talkloop.pipeline.core.graph import Phase, check_graph
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.core.records import StreamInfo
from talkloop.pipeline.core.schedule import Timeline
from talkloop.pipeline.core.session import Session
from talkloop.pipeline.core.stage import Stage, StageContext
from talkloop.pipeline.core.state import SHARED_FIELDS, SessionState
from talkloop.pipeline.models.spec import get_spec
from talkloop.pipeline.offload.prefetch import stage_prefetcher
from talkloop.pipeline.outputs.sink import Sink


class Pipeline:
    """Stages + modules for one config. Sessions share the modules, never state.

    Args:
        config: the root config.
        modules: loaded modules by name.
        phases: stage lists per phase (a family's, from
            :func:`talkloop.pipeline.models.registry.build_pipeline`, or a test's own).
    """

    def __init__(
        self,
        config: TalkloopConfig,
        modules: Mapping[str, Module],
        phases: Mapping[str, Phase],
    ) -> None:
        self.config = config
        self.modules = dict(modules)
        self.phases = dict(phases)
        # What a session keeps between chunks: the shared chunk stages' fields, the family's own.
        spec = get_spec(config.model.family)
        self.state_fields = SHARED_FIELDS + spec.state_fields
        # The family's publish makes each frame from that frame's latents alone: a batch of
        # live chunks is published in waves (every first frame, then the rest).
        self.publish_per_frame = spec.publish_per_frame
        self.session_fields = frozenset(f.name for f in self.state_fields)
        check_graph(self.phases, self.modules, self.state_fields)
        # Whether a chunk's publish keeps anything for the next chunk (a video decoder's cache):
        # if not, a session's next chunk may be made while this one's frames are rendered.
        self.publish_keeps_state = any(
            name in self.session_fields
            for stage in self.phases["publish"].stages
            for name in stage.writes
        )
        self.timeline = Timeline(config.schedule)
        self.compute_dtype = _compute_dtype(config, self.modules)
        enc = self.modules["audio_encoder"].config if "audio_encoder" in self.modules else None
        if (
            enc is not None
            and getattr(enc, "sample_rate", config.audio.sample_rate) != config.audio.sample_rate
        ):
            raise PipelineError(
                f"the audio encoder expects {enc.sample_rate} Hz but audio.sample_rate is "
                f"{config.audio.sample_rate}; set audio.sample_rate={enc.sample_rate}"
            )
        self.window_samples = int(getattr(enc, "window_samples", 0))
        self.lookahead_samples = int(getattr(enc, "lookahead_samples", 0))
        self.info = StreamInfo(
            config.video.width, config.video.height, config.video.fps, config.audio.sample_rate
        )
        # Called with (phase name, stage) before each stage runs: the offload layer prefetches
        # the next stage's model here (talkloop/pipeline/offload/prefetch.py).
        self.stage_hooks: list[Callable[[str, Stage], None]] = []

        prefetcher = stage_prefetcher(self)
        if prefetcher is not None:
            self.stage_hooks.append(prefetcher)

    def open_session(
        self,
        reference: np.ndarray,
        prompt: str = "",
        sinks: Sequence[Sink] = (),
        seed: int | None = None,
    ) -> Session:
        """Start a session: encode the reference and prompt, open the sinks."""
        return Session(self, reference, prompt, sinks, self.config.seed if seed is None else seed)

    # -- running phases ---------------------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.compute_dtype == "bfloat16":
            if self.config.model.device == "cuda":  # host-side ops stay under CPU autocast
                stack = contextlib.ExitStack()
                stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
                stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
                return stack
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def run_phase(
        self,
        name: str,
        work: dict[str, Any],
        state: SessionState,
        timings: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        """Run the stages of phase ``name`` over ``work`` (its input fields) and the state.

        ``timings``, if given, accumulates seconds per "phase/stage" key (a fixed set of keys).
        """
        return self.run_phase_batch(name, [work], [state], [timings])[0]

    def run_phase_batch(
        self,
        name: str,
        works: Sequence[dict[str, Any]],
        states: Sequence[SessionState],
        timings: Sequence[dict[str, float] | None],
    ) -> Sequence[dict[str, Any]]:
        """:meth:`run_phase` for several sessions at once, stage by stage: each stage gets all
        of their contexts (``Stage.run_batch``: one forward for the batch where a stage can).
        A batched stage's seconds are shared out equally between the sessions' ``timings``."""
        with torch.inference_mode(), self.autocast():
            for stage in self.phases[name].stages:
                t0 = time.perf_counter()
                for hook in self.stage_hooks:
                    hook(name, stage)
                stage.run_batch(
                    [
                        StageContext(stage, work, state, self.modules, self.session_fields)
                        for work, state in zip(works, states, strict=True)
                    ]
                )
                share = (time.perf_counter() - t0) / len(works)
                key = f"{name}/{stage.name}"
                for seconds in timings:
                    if seconds is not None:
                        seconds[key] = seconds.get(key, 0.0) + share
        return works


def _compute_dtype(config: TalkloopConfig, modules: Mapping[str, Module]) -> str:
    """``model.dtype``; for ``auto``, what it resolved to when the modules loaded."""
    if config.model.dtype != "auto":
        return config.model.dtype
    chosen = {m.compute_dtype for m in modules.values() if m.compute_dtype is not None}
    if len(chosen) != 1:
        raise PipelineError(
            "model.dtype is auto but the modules were not loaded by the family's load_modules, "
            "which resolves it (or they disagree: "
            f"{sorted(chosen)}); pass dtype='float32' or 'bfloat16'"
        )
    return chosen.pop()
