"""The studio family's own stages: reference and expression (once per session and prompt), then
per segment SR, mouth and the streaming VAE decoder.

The shared stages (prompt, audio features, chunk context, A2V) are in
:mod:`talkloop.pipeline.stages`; :func:`talkloop.pipeline.models.studio.family.phases` puts
both in order.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from talkloop.pipeline.core.stage import Stage, StageContext


def image_to_tensor(image) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (1, 3, H, W) float in [-1, 1]."""
    x = torch.from_numpy(image).permute(2, 0, 1).unsqueeze(0).float()
    return x / 127.5 - 1.0


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """(T, 3, H, W) in [-1, 1] -> (T, H, W, 3) uint8.

    Transposed once into a fresh buffer, then scaled in place, rather than a new tensor per
    operation (docs/benchmarks.md has the timing).
    """
    t, c, h, w = images.shape
    x = torch.empty((t, h, w, c), dtype=torch.float32)
    x.copy_(images.permute(0, 2, 3, 1))
    return x.clamp_(-1, 1).add_(1).mul_(127.5).round_().to(torch.uint8)


@functools.cache  # called per chunk with the same two numbers for a whole session
def micro_batch(chunk_frames: int, preferred: int) -> int:
    """The divisor of ``chunk_frames`` nearest ``preferred`` (the larger one on a tie).

    A stream's decoder calls all have one batch size (padded), so a frame's pixels never depend
    on how the stream was cut. A size that divides the chunk length pads nothing but the first
    and last chunks; the per-frame cost of the decoder is flat over small batches, so padding
    is pure loss (docs/benchmarks.md).
    """
    divisors = [d for d in range(1, chunk_frames + 1) if chunk_frames % d == 0]
    return min(divisors, key=lambda d: (abs(d - preferred), -d))


class ReferenceStage(Stage):
    """Encode the reference image once into its VAE latent."""

    name = "reference"
    reads = ("reference_image",)
    writes = ("ref_latent",)
    needs = ("vae",)

    def run(self, ctx: StageContext) -> None:
        vae = ctx.module("vae").net
        z = vae.encode(image_to_tensor(ctx.read("reference_image"))).float()  # (1, C, h, w)
        ctx.write("ref_latent", z)


class ExpressionStage(Stage):
    """Give the reference the prompt's expression: high-res latents for SR, pooled ones for A2V.

    Runs after the prompt stage, at the start and whenever the prompt changes. With no prompt the
    reference stays exactly as encoded.
    """

    name = "expression"
    reads = ("ref_latent", "text_embedding")
    writes = ("ref_latent_hr", "a2v_reference")
    needs = ("expression",)

    def run(self, ctx: StageContext) -> None:
        z = ctx.read("ref_latent")
        text = ctx.read("text_embedding")
        if text is not None:
            z = ctx.module("expression").net(z, text).float()
        ctx.write("ref_latent_hr", z)
        ctx.write("a2v_reference", F.avg_pool2d(z, 2))  # (1, C, h/2, w/2)


class SRStage(Stage):
    """One step from low-res to high-res latents, conditioned on the reference."""

    name = "sr"
    reads = ("segment_latents", "ref_latent_hr")
    writes = ("sr_latents",)
    needs = ("sr",)

    def run(self, ctx: StageContext) -> None:
        z_lr = ctx.read("segment_latents")  # (T, C, h, w) in display order
        ctx.write("sr_latents", ctx.module("sr").net(z_lr, ctx.read("ref_latent_hr")).float())


class MouthStage(Stage):
    """Each frame's audio feature sets the mouth of its high-res latent (MouthNet)."""

    name = "mouth"
    reads = ("sr_latents", "segment_audio")
    writes = ("hr_latents",)
    needs = ("mouth",)

    def run(self, ctx: StageContext) -> None:
        z = ctx.read("sr_latents")  # (T, C, H, W) in display order
        audio = ctx.read("segment_audio")  # (T, D_audio), the same frames
        ctx.write("hr_latents", ctx.module("mouth").net(z, audio).float())


class DecodeStage(Stage):
    """The streaming VAE decoder turns high-res latents into RGB frames, in display order.

    ``chunk_frames``: the schedule's N-chunk length, the size of every full published segment
    (the decoder's micro-batch is chosen to divide it)."""

    name = "decode"
    reads = ("hr_latents", "decoder_cache")
    writes = ("frames", "decoder_cache")
    needs = ("vae",)

    def __init__(self, chunk_frames: int) -> None:
        self.chunk_frames = chunk_frames

    def run(self, ctx: StageContext) -> None:
        vae = ctx.module("vae").net
        batch = micro_batch(self.chunk_frames, vae.cfg.decode_batch)
        images, cache = vae.decode(ctx.read("hr_latents"), ctx.read("decoder_cache"), batch)
        ctx.write("decoder_cache", cache)
        ctx.write("frames", to_uint8(images).numpy())
