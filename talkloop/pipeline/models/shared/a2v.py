"""A2VDiT: audio-to-video flow-matching DiT on low-resolution latents.

One network does first chunks, continuations and interpolations (docs/architecture.md): every
frame carries its own timestep, so given frames (motion context, anchors) enter with t = 0 next
to the frames being generated, and the reference frame is one more t = 0 frame with a learned
"reference" temporal embedding instead of a position.

Rectified flow: ``x_t = (1 - t) x0 + t eps``, the network predicts the velocity ``eps - x0``;
t = 1 is pure noise. Latents are the VAE's *scaled* latents, average-pooled x2:
(C, 16, 16) for 256x256 video.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from talkloop.pipeline.models.shared.layers import (
    CrossAttention,
    Mlp,
    SelfAttention,
    TimestepEmbedder,
    patchify,
    sincos_1d,
    sincos_2d,
    unpatchify,
)


class A2VConfig(BaseModel):
    """A2V DiT sizes."""

    model_config = ConfigDict(extra="forbid")

    latent_channels: int = Field(8, ge=1, le=64)
    patch: int = Field(
        4, ge=1, le=8, description="spatial patch on the low-res latent (4: 16 tokens/frame)"
    )
    dim: int = Field(192, ge=16, le=4096)
    depth: int = Field(6, ge=1, le=64)
    heads: int = Field(3, ge=1, le=64)
    mlp_ratio: float = Field(4.0, gt=0.0, le=16.0)
    audio_dim: int = Field(128, ge=1, le=4096, description="width of the audio encoder features")
    text_dim: int = Field(384, ge=1, le=4096)
    audio_radius: float = Field(
        2.0, ge=0.0, le=64.0, description="frames attend to audio features within +-radius frames"
    )
    max_frames: int = Field(64, ge=1, le=4096, description="most frames (given + generated) a call")

    @model_validator(mode="after")
    def _check(self) -> A2VConfig:
        if self.dim % self.heads != 0 or (self.dim // self.heads) % 2 != 0:
            raise ValueError(f"dim={self.dim} must split into heads={self.heads} of even width")
        if self.dim % 4 != 0:
            raise ValueError(f"dim={self.dim} must be a multiple of 4 (2D sin-cos positions)")
        return self


def _modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1.0 + scale) + shift


class A2VBlock(nn.Module):
    """adaLN-Zero block: self-attention over all tokens, audio cross-attention, MLP.

    Modulation is per frame (every token of a frame shares its frame's timestep), computed once
    per frame and broadcast over the frame's tokens.
    """

    def __init__(self, cfg: A2VConfig) -> None:
        super().__init__()
        d = cfg.dim
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(d, cfg.heads)
        self.norm_ca = nn.LayerNorm(d, eps=1e-6)
        self.cross = CrossAttention(d, cfg.heads)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(d, int(d * cfg.mlp_ratio))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))

    def forward(self, x: Tensor, c: Tensor, audio_ctx: Tensor, audio_mask: Tensor) -> Tensor:
        """x (B, F+1, N, D) [ref first]; c (B, F+1, D); audio_ctx (B, F, D); mask (B, 1, F*N, F)."""
        b, f1, n, d = x.shape
        mods = self.ada(c)[:, :, None, :].chunk(6, dim=-1)  # 6 x (B, F+1, 1, D)
        sh1, sc1, g1, sh2, sc2, g2 = mods
        h = _modulate(self.norm1(x), sh1, sc1).reshape(b, f1 * n, d)
        x = x + g1 * self.attn(h).reshape(b, f1, n, d)
        # Audio cross-attention for the generated/given frames only: the reference frame has no
        # audio, and an all-masked query row would make SDPA return NaN.
        xf = x[:, 1:].reshape(b, (f1 - 1) * n, d)  # (B, F*N, D)
        ca = self.cross(self.norm_ca(xf), audio_ctx, audio_mask).reshape(b, f1 - 1, n, d)
        x = torch.cat([x[:, :1], x[:, 1:] + ca], dim=1)
        h = _modulate(self.norm2(x), sh2, sc2)
        return x + g2 * self.mlp(h)


class A2VDiT(nn.Module):
    """Flow-matching DiT: noisy low-res latent frames + reference + audio + text -> velocity."""

    def __init__(self, cfg: A2VConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, p, c = cfg.dim, cfg.patch, cfg.latent_channels
        self.x_embed = nn.Linear(c * p * p, d)
        self.t_embed = TimestepEmbedder(d)
        self.pos_proj = nn.Linear(d, d)  # sinusoid of float frame position -> temporal embedding
        self.ref_embed = nn.Parameter(torch.zeros(d))  # temporal embedding of the reference
        self.text_proj = nn.Sequential(nn.Linear(cfg.text_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.text_null = nn.Parameter(torch.zeros(d))
        self.audio_proj = nn.Sequential(nn.Linear(cfg.audio_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.audio_null = nn.Parameter(torch.zeros(d))
        self.blocks = nn.ModuleList([A2VBlock(cfg) for _ in range(cfg.depth)])
        self.norm_out = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.out = nn.Linear(d, c * p * p)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for emb in (self.ref_embed, self.text_null, self.audio_null):
            nn.init.normal_(emb, std=0.02)
        for lin in self.t_embed.mlp:
            if isinstance(lin, nn.Linear):
                nn.init.normal_(lin.weight, std=0.02)
        # adaLN-Zero: every residual branch and the output start at zero, so the untrained
        # network is the identity map on tokens and predicts velocity 0 (finite, bounded).
        for blk in self.blocks:
            nn.init.zeros_(blk.ada[-1].weight)
            nn.init.zeros_(blk.ada[-1].bias)
            nn.init.zeros_(blk.cross.proj.weight)
            nn.init.zeros_(blk.cross.proj.bias)
        nn.init.zeros_(self.ada_out[-1].weight)
        nn.init.zeros_(self.ada_out[-1].bias)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def _check(self, x: Tensor, t: Tensor, pos: Tensor, ref: Tensor) -> None:
        cfg = self.cfg
        if x.ndim != 5 or x.shape[2] != cfg.latent_channels:
            raise ValueError(f"x must be (B, F, {cfg.latent_channels}, h, w), got {tuple(x.shape)}")
        b, f, _, h, w = x.shape
        if h % cfg.patch or w % cfg.patch:
            raise ValueError(f"latent size {h}x{w} is not a multiple of patch={cfg.patch}")
        if f > cfg.max_frames:
            raise ValueError(f"{f} frames exceed max_frames={cfg.max_frames}")
        if t.shape != (b, f) or pos.shape != (b, f):
            raise ValueError(
                f"t and pos must be (B, F)=({b}, {f}), got {tuple(t.shape)} and {tuple(pos.shape)}"
            )
        if ref.shape != (b, cfg.latent_channels, h, w):
            raise ValueError(
                f"ref must be {(b, cfg.latent_channels, h, w)}, got {tuple(ref.shape)}"
            )

    def forward(
        self,
        x: Tensor,
        t: Tensor,
        pos: Tensor,
        ref: Tensor,
        audio: Tensor | None,
        text: Tensor | None,
        *,
        audio_keep: Tensor | None = None,
        text_keep: Tensor | None = None,
    ) -> Tensor:
        """Predict the flow velocity for every frame.

        Args:
            x: (B, F, C, h, w) latents; given frames clean, generated frames at their noise level.
            t: (B, F) per-frame timestep in [0, 1]; 0 for given frames.
            pos: (B, F) float frame positions relative to the chunk (context negative).
            ref: (B, C, h, w) low-res reference latent.
            audio: (B, F, audio_dim) features per frame, or None (all dropped -> null embedding).
            text: (B, text_dim) prompt embedding, or None (dropped -> null embedding).
            audio_keep, text_keep: optional (B,) bool; False drops that sample's audio / text.
                Lets classifier-free guidance and training dropout run in one batch.
        Returns:
            (B, F, C, h, w) velocity (``eps - x0``), dtype of the computation (bf16 under autocast).
        """
        self._check(x, t, pos, ref)
        cfg = self.cfg
        b, f, c, h, w = x.shape
        p, d = cfg.patch, cfg.dim
        gh, gw = h // p, w // p
        n = gh * gw

        frames = torch.cat([ref[:, None], x], dim=1)  # (B, F+1, C, h, w)
        tok = patchify(frames.reshape(b * (f + 1), c, h, w), p)  # (B*(F+1), N, C*p*p)
        tok = self.x_embed(tok).reshape(b, f + 1, n, d)  # (B, F+1, N, D)
        tok = tok + sincos_2d(gh, gw, d, device=x.device).to(tok.dtype)  # spatial
        t_pos = self.pos_proj(sincos_1d(pos, d))  # (B, F, D)
        temporal = torch.cat([self.ref_embed.expand(b, 1, d).to(t_pos.dtype), t_pos], dim=1)
        tok = tok + temporal[:, :, None, :]  # (B, F+1, N, D)

        # Conditioning per frame: its timestep (reference: t = 0) plus the prompt.
        t_all = torch.cat([torch.zeros_like(t[:, :1]), t], dim=1)  # (B, F+1)
        txt = self.text_null.expand(b, d) if text is None else self.text_proj(text)  # (B, D)
        if text is not None and text_keep is not None:
            txt = torch.where(text_keep[:, None], txt, self.text_null.to(txt.dtype))
        cond = self.t_embed(t_all) + txt[:, None, :]  # (B, F+1, D)

        # Audio tokens: one per frame, tagged with the frame's temporal embedding.
        if audio is None:
            a = self.audio_null.expand(b, f, d)
        else:
            a = self.audio_proj(audio)  # (B, F, D)
            if audio_keep is not None:
                a = torch.where(audio_keep[:, None, None], a, self.audio_null.to(a.dtype))
        a = a + t_pos
        # Band mask: frame i hears frames j with |pos_i - pos_j| <= radius (always itself).
        band = (pos[:, :, None] - pos[:, None, :]).abs() <= cfg.audio_radius + 1e-4  # (B, F, F)
        mask = band.repeat_interleave(n, dim=1)[:, None]  # (B, 1, F*N, F)

        for blk in self.blocks:
            tok = blk(tok, cond, a, mask)

        sh, sc = self.ada_out(cond)[:, 1:, None, :].chunk(2, dim=-1)  # (B, F, 1, D) each
        out = self.out(_modulate(self.norm_out(tok[:, 1:]), sh, sc))  # (B, F, N, C*p*p)
        out = unpatchify(out.reshape(b * f, n, c * p * p), c, h, w, p)  # (B*F, C, h, w)
        return out.reshape(b, f, c, h, w)


def lowres(latent: Tensor) -> Tensor:
    """VAE latent -> A2V latent: ``avg_pool2d(., 2)`` over the last two dims, any leading dims."""
    lead = latent.shape[:-3]
    x = latent.reshape(-1, *latent.shape[-3:])
    x = F.avg_pool2d(x, 2)
    return x.reshape(*lead, *x.shape[-3:])
