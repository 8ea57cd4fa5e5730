"""SR: one step from low-res to high-res latents, conditioned on the reference."""

from __future__ import annotations

from talkloop.pipeline.core.stage import Stage, StageContext


class SRStage(Stage):
    name = "sr"
    reads = ("segment_latents", "ref_latent_hr")
    writes = ("sr_latents",)
    needs = ("sr",)

    def run(self, ctx: StageContext) -> None:
        z_lr = ctx.read("segment_latents")  # (T, C, h, w) in display order
        ctx.write("sr_latents", ctx.module("sr").net(z_lr, ctx.read("ref_latent_hr")).float())
