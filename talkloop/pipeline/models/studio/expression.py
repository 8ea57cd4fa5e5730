"""ExpressionNet: the prompt's expression, painted onto the reference latent before animation.

The A2V copies the reference's expression into every frame: on held-out characters rendered with
smile -0.4 / 0 / 0.8 in the reference, the smile read from the generated video followed it
(about -0.25 / 0.05 / 0.53 over three faces). What it barely learns is the same smile from the
prompt: in its flow-matching loss a clip's smile is a small fraction of the error, so its
response to smile words stayed around 1 % of the true difference however it was trained.

So the prompt acts where it is cheap to learn and easy to check: this small conv net edits the
reference latent, ``z' = z + delta(z, text)``, and the edited latent is the reference of A2V and
SR. The studio renders the exact target (the same face, neutral pose, with the prompt's smile), so
the net trains on pairs and nothing else. An empty prompt leaves the reference untouched.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from talkloop.pipeline.models.shared.layers import FiLMEditor


class ExpressionConfig(BaseModel):
    """ExpressionNet sizes."""

    model_config = ConfigDict(extra="forbid")

    latent_channels: int = Field(8, ge=1, le=64)
    text_dim: int = Field(384, ge=1, le=4096)
    channels: int = Field(48, ge=8, le=1024)
    blocks: int = Field(3, ge=1, le=32)
    style_dim: int = Field(128, ge=8, le=4096)


class ExpressionNet(FiLMEditor):
    """``(reference latent, prompt embedding) -> edited reference latent`` of the same shape."""

    def __init__(self, cfg: ExpressionConfig) -> None:
        super().__init__(cfg.latent_channels, cfg.channels, cfg.blocks, cfg.style_dim)
        self.cfg = cfg
        sd = cfg.style_dim
        self.style = nn.Sequential(nn.Linear(cfg.text_dim, sd), nn.SiLU(), nn.Linear(sd, sd))

    def forward(self, z: Tensor, text: Tensor) -> Tensor:
        """Edit the reference.

        Args:
            z: (B, C, H, W) scaled VAE latent of the reference image.
            text: (B, text_dim) prompt embedding.
        Returns:
            (B, C, H, W) edited latent, ``z + delta``.
        """
        c = self.cfg
        if z.ndim != 4 or z.shape[1] != c.latent_channels:
            raise ValueError(f"z must be (B, {c.latent_channels}, H, W), got {tuple(z.shape)}")
        if text.shape != (z.shape[0], c.text_dim):
            raise ValueError(f"text must be ({z.shape[0]}, {c.text_dim}), got {tuple(text.shape)}")
        return self.apply_style(z, self.style(text.to(z.dtype)))
