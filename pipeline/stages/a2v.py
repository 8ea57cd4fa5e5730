"""A2V: the multi-step flow-matching DiT turns a chunk's inputs into low-res latents."""

from __future__ import annotations

from pipeline.core.config import SamplerConfig
from pipeline.core.stage import Stage, StageContext
from pipeline.models.studio.sampling import euler_sample


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
        "ref_latent_lr",
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
            ref=ctx.read("ref_latent_lr"),
            audio=ctx.read("cond_audio"),
            text=ctx.read("text_embedding"),
            noise=ctx.read("noise"),
            steps=self.sampler.i_steps if ctx.read("job").kind == "I" else self.sampler.steps,
            shift=self.sampler.shift,
            audio_guidance=self.sampler.audio_guidance,
        )  # (1, F, C, h, w)
        ctx.write("latents", out[0, ~mask[0]].float())  # (generated, C, h, w)
