"""SRDiT: one step from x2-upsampled low-res latents to high-res latents.

Frames are independent (batch = frames, attention within a frame): temporal coherence comes from
the A2V and the causal VAE decoder. The network predicts a residual on the bilinear upsample, and
its output layer starts at zero, so an untrained SR is exactly bilinear upsampling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from talkloop.pipeline.models.shared.layers import (
    Mlp,
    SelfAttention,
    patchify,
    sincos_2d,
    unpatchify,
)


class SRConfig(BaseModel):
    """SR DiT sizes."""

    model_config = ConfigDict(extra="forbid")

    latent_channels: int = Field(8, ge=1, le=64)
    patch: int = Field(2, ge=1, le=8, description="patch size on the high-res latent")
    dim: int = Field(96, ge=16, le=4096)
    depth: int = Field(2, ge=1, le=64)
    heads: int = Field(2, ge=1, le=64)
    mlp_ratio: float = Field(4.0, gt=0.0, le=16.0)

    @model_validator(mode="after")
    def _check(self) -> SRConfig:
        if self.dim % self.heads != 0 or (self.dim // self.heads) % 2 != 0:
            raise ValueError(f"dim={self.dim} must split into heads={self.heads} of even width")
        if self.dim % 4 != 0:
            raise ValueError(f"dim={self.dim} must be a multiple of 4 (2D sin-cos positions)")
        return self


class SRBlock(nn.Module):
    """Pre-LN transformer block (no timestep: SR is a single deterministic step)."""

    def __init__(self, cfg: SRConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.attn = SelfAttention(cfg.dim, cfg.heads)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.mlp = Mlp(cfg.dim, int(cfg.dim * cfg.mlp_ratio))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SRDiT(nn.Module):
    """(T, C, h, w) low-res latents + high-res reference -> (T, C, 2h, 2w) high-res latents."""

    def __init__(self, cfg: SRConfig) -> None:
        super().__init__()
        self.cfg = cfg
        c, p, d = cfg.latent_channels, cfg.patch, cfg.dim
        self.embed = nn.Linear(2 * c * p * p, d)  # [upsampled | reference] patches
        self.blocks = nn.ModuleList([SRBlock(cfg) for _ in range(cfg.depth)])
        self.norm_out = nn.LayerNorm(d, eps=1e-6)
        self.out = nn.Linear(d, c * p * p)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.zeros_(self.out.weight)  # residual starts at 0: untrained SR = bilinear
        nn.init.zeros_(self.out.bias)

    def forward(self, z_lr: Tensor, ref_hr: Tensor) -> Tensor:
        """Upsample and refine.

        Args:
            z_lr: (T, C, h, w) low-res latents (A2V output).
            ref_hr: (1 or T, C, 2h, 2w) high-res reference latent.
        Returns:
            (T, C, 2h, 2w) float32 high-res latents.
        """
        cfg = self.cfg
        if z_lr.ndim != 4 or z_lr.shape[1] != cfg.latent_channels:
            raise ValueError(
                f"z_lr must be (T, {cfg.latent_channels}, h, w), got {tuple(z_lr.shape)}"
            )
        t, c, h, w = z_lr.shape
        hh, ww = 2 * h, 2 * w
        if ref_hr.ndim != 4 or ref_hr.shape[0] not in (1, t) or ref_hr.shape[1:] != (c, hh, ww):
            raise ValueError(
                f"ref_hr must be (1 or {t}, {c}, {hh}, {ww}), got {tuple(ref_hr.shape)}"
            )
        p, d = cfg.patch, cfg.dim
        if hh % p or ww % p:
            raise ValueError(f"high-res size {hh}x{ww} is not a multiple of patch={p}")
        up = F.interpolate(z_lr.float(), scale_factor=2.0, mode="bilinear", align_corners=False)
        x = torch.cat([up, ref_hr.float().expand(t, -1, -1, -1)], dim=1)  # (T, 2C, 2h, 2w)
        tok = self.embed(patchify(x, p))  # (T, N, D)
        tok = tok + sincos_2d(hh // p, ww // p, d, device=x.device).to(tok.dtype)
        for blk in self.blocks:
            tok = blk(tok)
        res = self.out(self.norm_out(tok))  # (T, N, C*p*p)
        return up + unpatchify(res, c, hh, ww, p).float()  # (T, C, 2h, 2w)


def sr_loss(model: SRDiT, z_hr: Tensor, ref_hr: Tensor, weight_map: Tensor | None = None) -> Tensor:
    """Weighted MSE of SR from the x2-downsampled target back to the target.

    Args:
        z_hr: (T, C, 2h, 2w) target high-res latents; the input is ``avg_pool2d(z_hr, 2)``, the
            same low-res definition the A2V is trained on.
        ref_hr: (1 or T, C, 2h, 2w).
        weight_map: (T, 1, 2h, 2w) per-pixel weights (e.g. 1 + face + mouth), or None (uniform).
    Returns:
        Scalar float32 loss (weighted mean).
    """
    z_hr = z_hr.float()
    pred = model(F.avg_pool2d(z_hr, 2), ref_hr)
    err = (pred - z_hr).square()  # (T, C, 2h, 2w)
    if weight_map is None:
        return err.mean()
    w = weight_map.float().expand_as(err)
    return (err * w).sum() / w.sum().clamp_min(1e-8)
