"""A2V: the multi-step flow-matching DiT turns a chunk's inputs into low-res latents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from talkloop.pipeline.core.config import SamplerConfig
from talkloop.pipeline.core.graph import Phase
from talkloop.pipeline.core.stage import Stage, StageContext
from talkloop.pipeline.models.shared.sampling import euler_sample
from talkloop.pipeline.stages.context import AudioFeatureStage, IContextStage, NContextStage

if TYPE_CHECKING:
    from talkloop.pipeline.core.graph import Phase


class A2VStage(Stage):
    """Sample the generated positions; given positions (context, anchors) are dropped."""

    name = "a2v"
    reads = (
        "job",
        "given",
        "given_mask",
        "positions",
        "cond_audio",
        "noise",
        "a2v_reference",
        "text_embedding",
    )
    writes = ("latents",)
    needs = ("a2v",)

    def __init__(self, sampler: SamplerConfig) -> None:
        self.sampler = sampler

    def run(self, ctx: StageContext) -> None:
        self.run_batch([ctx])

    def run_batch(self, ctxs: Sequence[StageContext]) -> None:
        """One sampler run for every chunk of the same shape (frames, kind, prompt or none):
        each sample of a batch sees only its own inputs and noise."""
        groups: dict[tuple, list[StageContext]] = {}
        for ctx in ctxs:
            key = (
                tuple(ctx.read("given").shape),
                ctx.read("job").kind,
                ctx.read("text_embedding") is None,
            )
            groups.setdefault(key, []).append(ctx)
        for group in groups.values():
            self._sample(group)

    def _sample(self, ctxs: list[StageContext]) -> None:
        def stacked(field: str) -> torch.Tensor | None:
            values = [ctx.read(field) for ctx in ctxs]
            return None if values[0] is None else torch.cat(values)

        first = ctxs[0]
        mask = stacked("given_mask")
        out = euler_sample(
            first.module("a2v").net,
            x_given=stacked("given"),
            given_mask=mask,
            pos=stacked("positions"),
            ref=stacked("a2v_reference"),
            audio=stacked("cond_audio"),
            text=stacked("text_embedding"),
            noise=stacked("noise"),
            steps=self.sampler.i_steps if first.read("job").kind == "I" else self.sampler.steps,
            shift=self.sampler.shift,
            audio_guidance=self.sampler.audio_guidance,
        )  # (B, F, C, h, w)
        for b, ctx in enumerate(ctxs):
            ctx.write("latents", out[b, ~mask[b]].float())  # (generated, C, h, w)


def chunk_phases(sampler: SamplerConfig) -> dict[str, Phase]:
    """The ``n_chunk`` and ``i_chunk`` phases: audio features and the N/I context feed the A2V.

    Every family whose A2V is an :class:`A2VDiT` over its own latents shares them.
    """

    a2v = A2VStage(sampler)
    return {
        "n_chunk": Phase(
            "n_chunk",
            frozenset({"job", "seed", "audio_windows"}),
            [AudioFeatureStage(), NContextStage(), a2v],
        ),
        "i_chunk": Phase(
            "i_chunk",
            frozenset({"job", "seed", "next_latents", "next_audio"}),
            [IContextStage(), a2v],
        ),
    }
