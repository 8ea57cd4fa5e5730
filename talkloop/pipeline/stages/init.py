"""Init stages: run once per session (prompt and expression again whenever the prompt changes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from talkloop.pipeline.core.stage import Stage, StageContext


def image_to_tensor(image) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (1, 3, H, W) float in [-1, 1]."""
    x = torch.from_numpy(image).permute(2, 0, 1).unsqueeze(0).float()
    return x / 127.5 - 1.0


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


class PromptStage(Stage):
    """Embed the text prompt; an empty prompt means "no text conditioning" (learned null)."""

    name = "prompt"
    reads = ("prompt",)
    writes = ("text_embedding",)
    needs = ("text_encoder",)

    def run(self, ctx: StageContext) -> None:
        prompt: str = ctx.read("prompt")
        if not prompt.strip():
            ctx.write("text_embedding", None)
            return
        emb = ctx.module("text_encoder").net.encode([prompt])  # (1, 384)
        ctx.write("text_embedding", emb.float())


class ExpressionStage(Stage):
    """Give the reference the prompt's expression: high-res latents for SR, pooled ones for A2V.

    Runs after the prompt stage, at the start and whenever the prompt changes. With no prompt the
    reference stays exactly as encoded.
    """

    name = "expression"
    reads = ("ref_latent", "text_embedding")
    writes = ("ref_latent_hr", "ref_latent_lr")
    needs = ("expression",)

    def run(self, ctx: StageContext) -> None:
        z = ctx.read("ref_latent")
        text = ctx.read("text_embedding")
        if text is not None:
            z = ctx.module("expression").net(z, text).float()
        ctx.write("ref_latent_hr", z)
        ctx.write("ref_latent_lr", F.avg_pool2d(z, 2))  # (1, C, h/2, w/2)
