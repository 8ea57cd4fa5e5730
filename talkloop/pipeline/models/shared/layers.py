"""Building blocks of the networks (``talkloop/pipeline/models/*/``): sinusoidal embeddings, patchify, attention, MLP.

Nothing here keeps state between calls; position tables are recomputed per call (they are tiny)
so any grid size and any frame position works without a cache to invalidate.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def sincos_1d(pos: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """Sinusoidal embedding of float positions.

    Args:
        pos: (...) float positions (may be negative or fractional).
        dim: even embedding width.
    Returns:
        (..., dim) float32 embedding, ``[cos | sin]``.
    """
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=pos.device) / half
    )  # (half,)
    args = pos.float()[..., None] * freqs  # (..., half)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # (..., dim)


def sincos_2d(grid_h: int, grid_w: int, dim: int, device: torch.device | None = None) -> Tensor:
    """2D sin-cos position table for a ``grid_h x grid_w`` token grid (DiT/MAE style).

    Returns:
        (grid_h * grid_w, dim) float32, row-major (the order :func:`patchify` emits).
    """
    ys = torch.arange(grid_h, dtype=torch.float32, device=device)
    xs = torch.arange(grid_w, dtype=torch.float32, device=device)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")  # (gh, gw)
    emb_y = sincos_1d(gy.reshape(-1), dim // 2)  # (N, dim/2)
    emb_x = sincos_1d(gx.reshape(-1), dim // 2)  # (N, dim/2)
    return torch.cat([emb_y, emb_x], dim=-1)  # (N, dim)


def patchify(x: Tensor, p: int) -> Tensor:
    """(N, C, H, W) -> (N, (H/p)*(W/p), C*p*p), tokens in row-major grid order."""
    n, c, h, w = x.shape
    x = x.reshape(n, c, h // p, p, w // p, p)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (N, gh, gw, C, p, p)
    return x.reshape(n, (h // p) * (w // p), c * p * p)


def unpatchify(tokens: Tensor, c: int, h: int, w: int, p: int) -> Tensor:
    """(N, (H/p)*(W/p), C*p*p) -> (N, C, H, W); inverse of :func:`patchify`."""
    n = tokens.shape[0]
    x = tokens.reshape(n, h // p, w // p, c, p, p)
    x = x.permute(0, 3, 1, 4, 2, 5)  # (N, C, gh, p, gw, p)
    return x.reshape(n, c, h, w)


def _rms(norm: nn.RMSNorm, x: Tensor) -> Tensor:
    """RMSNorm in the activation dtype: casting the weight keeps the fused kernel under autocast
    (a dtype mismatch falls back to ~5 separate elementwise ops)."""
    return F.rms_norm(x, norm.normalized_shape, norm.weight.to(x.dtype), norm.eps)


class Mlp(nn.Module):
    """Two-layer GELU MLP."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SelfAttention(nn.Module):
    """Multi-head self-attention with QK RMS-norm (keeps logits bounded in bf16 training)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.RMSNorm(dim // heads, eps=1e-6)
        self.k_norm = nn.RMSNorm(dim // heads, eps=1e-6)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, N, Dh)
        q, k = _rms(self.q_norm, q), _rms(self.k_norm, k)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, N, Dh)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class CrossAttention(nn.Module):
    """Multi-head cross-attention from ``x`` (queries) to ``ctx`` (keys/values)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.q_norm = nn.RMSNorm(dim // heads, eps=1e-6)
        self.k_norm = nn.RMSNorm(dim // heads, eps=1e-6)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, ctx: Tensor, mask: Tensor | None = None) -> Tensor:
        b, n, d = x.shape
        m = ctx.shape[1]
        dh = d // self.heads
        q = self.q(x).reshape(b, n, self.heads, dh).transpose(1, 2)  # (B, H, N, Dh)
        kv = self.kv(ctx).reshape(b, m, 2, self.heads, dh)
        k, v = kv.permute(2, 0, 3, 1, 4)  # each (B, H, M, Dh)
        q, k = _rms(self.q_norm, q), _rms(self.k_norm, k)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, N, Dh)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class TimestepEmbedder(nn.Module):
    """Scalar timestep in [0, 1] -> (..., dim) conditioning vector (sinusoid + MLP)."""

    def __init__(self, dim: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        # Scale by 1000 so the sinusoid resolves small differences near t=0 (clean frames).
        return self.mlp(sincos_1d(t * 1000.0, self.freq_dim))


class FiLMBlock(nn.Module):
    """Residual conv block whose normalised activations are scaled and shifted by a style vector
    (the expression and mouth nets: ``x + conv(act(norm(x) * (1 + scale) + shift))``)."""

    def __init__(self, ch: int, style_dim: int, dilation: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(8, ch, affine=False)
        self.film = nn.Linear(style_dim, 2 * ch)
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=dilation, dilation=dilation)
        self.norm2 = nn.GroupNorm(8, ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1)
        self.act = nn.SiLU()

    def forward(self, x: Tensor, style: Tensor) -> Tensor:
        scale, shift = self.film(style)[:, :, None, None].chunk(2, dim=1)
        h = self.norm1(x) * (1.0 + scale) + shift
        h = self.conv1(self.act(h))
        h = self.conv2(self.act(self.norm2(h)))
        return x + h


class FiLMEditor(nn.Module):
    """Base of the latent editors (expression, mouth): ``z + delta(z, style)``.

    A conv in, FiLM residual blocks with dilations 1, 2, 4 (so a block sees a whole mouth and its
    cheeks on a 32x32 latent), and a zero-initialised conv out: untrained, an editor is exactly
    the identity. Subclasses add the network that turns their condition into ``style``.
    """

    def __init__(self, latent_channels: int, channels: int, blocks: int, style_dim: int) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(latent_channels, channels, 3, padding=1)
        self.blocks = nn.ModuleList(
            [FiLMBlock(channels, style_dim, dilation=(1, 2, 4)[i % 3]) for i in range(blocks)]
        )
        self.norm_out = nn.GroupNorm(8, channels)
        self.conv_out = nn.Conv2d(channels, latent_channels, 3, padding=1)
        nn.init.zeros_(self.conv_out.weight)
        nn.init.zeros_(self.conv_out.bias)

    def apply_style(self, z: Tensor, style: Tensor) -> Tensor:
        """(B, C, H, W) latents, (B, style_dim) styles -> (B, C, H, W) ``z + delta``."""
        h = self.conv_in(z)
        for blk in self.blocks:
            h = blk(h, style)
        return z + self.conv_out(F.silu(self.norm_out(h)))
