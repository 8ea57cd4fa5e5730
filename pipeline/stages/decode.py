"""Decode: the streaming VAE decoder turns high-res latents into RGB frames, in display order."""

from __future__ import annotations

import torch

from pipeline.core.stage import Stage, StageContext


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """(T, 3, H, W) in [-1, 1] -> (T, H, W, 3) uint8."""
    x = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).contiguous()


class DecodeStage(Stage):
    name = "decode"
    reads = ("hr_latents", "decoder_cache")
    writes = ("frames", "decoder_cache")
    needs = ("vae",)

    def run(self, ctx: StageContext) -> None:
        images, cache = ctx.module("vae").net.decode(
            ctx.read("hr_latents"), ctx.read("decoder_cache")
        )
        ctx.write("decoder_cache", cache)
        ctx.write("frames", to_uint8(images).numpy())
