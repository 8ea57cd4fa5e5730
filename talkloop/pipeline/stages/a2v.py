"""A2V: the multi-step flow-matching DiT turns a chunk's inputs into low-res latents."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
        mask = ctx.read("given_mask")
        out = euler_sample(
            ctx.module("a2v").net,
            x_given=ctx.read("given"),
            given_mask=mask,
            pos=ctx.read("positions"),
            ref=ctx.read("a2v_reference"),
            audio=ctx.read("cond_audio"),
            text=ctx.read("text_embedding"),
            noise=ctx.read("noise"),
            steps=self.sampler.i_steps if ctx.read("job").kind == "I" else self.sampler.steps,
            shift=self.sampler.shift,
            audio_guidance=self.sampler.audio_guidance,
        )  # (1, F, C, h, w)
        ctx.write("latents", out[0, ~mask[0]].float())  # (generated, C, h, w)


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
