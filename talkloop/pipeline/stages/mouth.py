"""Mouth: each frame's audio feature sets the mouth of its high-res latent (MouthNet)."""

from __future__ import annotations

from talkloop.pipeline.core.stage import Stage, StageContext


class MouthStage(Stage):
    name = "mouth"
    reads = ("sr_latents", "segment_audio")
    writes = ("hr_latents",)
    needs = ("mouth",)

    def run(self, ctx: StageContext) -> None:
        z = ctx.read("sr_latents")  # (T, C, H, W) in display order
        audio = ctx.read("segment_audio")  # (T, D_audio), the same frames
        ctx.write("hr_latents", ctx.module("mouth").net(z, audio).float())
