"""StudioVAE: 8x spatial compression, causal-in-time streaming decoder with a bounded cache.

The encoder is per image (no time axis). The decoder sees the current latent frame plus the
``cache_frames`` previous latent frames, concatenated on channels, so frame t depends on
``z[t - cache_frames .. t]`` only. The cache is exactly those previous latents, so its size is
fixed and a stream decoded in pieces equals the stream decoded whole.

Speed: the decoder does its heavy work at H/4 (64x64 for 256x256 video) and pixel-shuffles x4 to
full resolution; full-resolution convs cost 5-30x more on a CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn


class VAEConfig(BaseModel):
    """StudioVAE sizes. The spatial factor is fixed at 8 (256x256 RGB -> C x 32 x 32)."""

    model_config = ConfigDict(extra="forbid")

    latent_channels: int = Field(8, ge=1, le=64)
    enc_channels: int = Field(64, ge=8, le=1024, description="encoder width at H/4")
    enc_latent_channels: int = Field(128, ge=8, le=1024, description="encoder width at H/8")
    enc_blocks: int = Field(2, ge=0, le=16, description="residual blocks per encoder level")
    dec_latent_channels: int = Field(128, ge=8, le=1024, description="decoder width at H/8")
    dec_channels: int = Field(64, ge=8, le=1024, description="decoder width at H/4")
    dec_latent_blocks: int = Field(2, ge=0, le=16, description="decoder residual blocks at H/8")
    dec_blocks: int = Field(1, ge=0, le=16, description="decoder residual blocks at H/4")
    cache_frames: int = Field(2, ge=0, le=16, description="past latent frames the decoder sees")
    # The preferred micro-batch; the decode stage uses the divisor of the schedule's chunk length
    # nearest to it (stages.decode.micro_batch), so whole chunks decode without padding frames.
    decode_batch: int = Field(
        3,
        ge=1,
        le=256,
        description="preferred frames per decoder call (calls are padded to one fixed size)",
    )
    latent_scale: float = Field(
        1.0, gt=0.0, description="encode returns mean * scale; decode divides by it"
    )

    @property
    def spatial_factor(self) -> int:
        return 8


class ResBlock(nn.Module):
    """conv-ReLU-conv with identity skip, no normalisation (TAESD style).

    Norm layers and SiLU cost as much as the convs here on a CPU (docs/benchmarks.md, "Figures
    behind code choices"), and a norm-free block has nothing that could mix frames of a batch.
    """

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1)
        # Small residual branch at init keeps activations bounded through the untrained stack.
        nn.init.normal_(self.conv2.weight, std=1e-3)
        nn.init.zeros_(self.conv2.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv2(F.relu(self.conv1(x)))


class Encoder(nn.Module):
    """(B, 3, H, W) -> (B, 2*C, H/8, W/8): pixel-unshuffle x4, convs, stride-2 conv, convs."""

    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        c1, c2 = cfg.enc_channels, cfg.enc_latent_channels
        self.stem = nn.Conv2d(3 * 16, c1, 3, padding=1)
        self.blocks1 = nn.Sequential(*[ResBlock(c1) for _ in range(cfg.enc_blocks)])
        self.down = nn.Conv2d(c1, c2, 3, stride=2, padding=1)
        self.blocks2 = nn.Sequential(*[ResBlock(c2) for _ in range(cfg.enc_blocks)])
        self.out = nn.Conv2d(c2, 2 * cfg.latent_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        x = F.pixel_unshuffle(x, 4)  # (B, 48, H/4, W/4)
        x = self.blocks1(F.relu(self.stem(x)))  # (B, c1, H/4, W/4)
        x = self.blocks2(F.relu(self.down(x)))  # (B, c2, H/8, W/8)
        return self.out(x)  # (B, 2C, H/8, W/8)


class Decoder(nn.Module):
    """(T, C*(K+1), h, w) -> (T, 3, 8h, 8w) in [-1, 1].

    Convs at latent resolution, 1x1 conv + pixel-shuffle x2, convs at 2h, conv + pixel-shuffle x4.
    """

    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        c_in = cfg.latent_channels * (cfg.cache_frames + 1)
        c1, c2 = cfg.dec_latent_channels, cfg.dec_channels
        self.stem = nn.Conv2d(c_in, c1, 3, padding=1)
        self.blocks1 = nn.Sequential(*[ResBlock(c1) for _ in range(cfg.dec_latent_blocks)])
        self.up = nn.Conv2d(c1, 4 * c2, 1)
        self.blocks2 = nn.Sequential(*[ResBlock(c2) for _ in range(cfg.dec_blocks)])
        self.out = nn.Conv2d(c2, 3 * 16, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks1(F.relu(self.stem(x)))  # (T, c1, h, w)
        x = F.pixel_shuffle(self.up(x), 2)  # (T, c2, 2h, 2w)
        x = self.out(self.blocks2(F.relu(x)))  # (T, 48, 2h, 2w)
        # tanh keeps even random-weight output a valid image.
        return torch.tanh(F.pixel_shuffle(x, 4).float())  # (T, 3, 8h, 8w)


class StudioVAE(nn.Module):
    """Image VAE with a causal streaming decoder.

    Latents live in *scaled* space: :meth:`encode` returns ``mean * latent_scale`` and
    :meth:`decode` divides by it, so everything outside the VAE (A2V, SR) sees the same scale.
    """

    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    def encode_dist(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior of unscaled latents.

        Args:
            images: (B, 3, H, W) in [-1, 1], H and W multiples of 8.
        Returns:
            ``(mean, logvar)``, each (B, C, H/8, W/8) float32, logvar clamped to [-30, 20].
        """
        moments = self.encoder(images.contiguous(memory_format=torch.channels_last)).float()
        mean, logvar = moments.chunk(2, dim=1)  # each (B, C, H/8, W/8)
        return mean, logvar.clamp(-30.0, 20.0)

    def encode(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) in [-1, 1] -> scaled latent mean (B, C, H/8, W/8) float32."""
        mean, _ = self.encode_dist(images)
        return mean * self.cfg.latent_scale

    def init_cache(self, z: Tensor) -> Tensor:
        """Stream-start cache: the first latent frame repeated (no false black history)."""
        return z[:1].expand(self.cfg.cache_frames, -1, -1, -1).clone()  # (K, C, h, w)

    def decode(
        self, z: Tensor, cache: Tensor | None = None, batch: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Decode latent frames causally.

        Args:
            z: (T, C, h, w) scaled latents in display order, T >= 1.
            cache: (K, C, h, w) returned by the previous call of this stream, or None at stream
                start (then the first frame stands in for the missing history).
            batch: frames per decoder call (default ``decode_batch``); keep it fixed for a stream.
        Returns:
            ``(frames, cache)``: frames (T, 3, 8h, 8w) float32 in [-1, 1] (any memory layout);
            cache (K, C, h, w), the last ``K = cache_frames`` latents seen (fixed size, float32).
        """
        x, new_cache = self.decoder_inputs(z, cache)
        t = z.shape[0]
        # oneDNN may pick different kernels for different batch sizes, so a frame's pixels could
        # depend on how the stream was split. Fixed micro-batches (padded) keep them identical.
        mb = self.cfg.decode_batch if batch is None else batch
        outs = []
        for s in range(0, t, mb):
            xb = x[s : s + mb]
            n = xb.shape[0]
            if n < mb:
                pad = xb[-1:].expand(mb - n, -1, -1, -1)
                xb = torch.cat([xb, pad], dim=0).contiguous(memory_format=torch.channels_last)
            outs.append(self.decoder(xb)[:n])
        # In the micro-batches' memory layout (an exported decoder's frames are channels-last).
        frames = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)  # (T, 3, 8h, 8w)
        return frames, new_cache

    def decoder_inputs(self, z: Tensor, cache: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """What :meth:`decode` feeds the decoder: ``(x, new_cache)``.

        x is (T, C*(K+1), h, w) channels-last, frame i's latents i-K .. i (oldest first) stacked
        on channels and unscaled; new_cache (K, C, h, w) as :meth:`decode` returns it.
        """
        k = self.cfg.cache_frames
        z = z.float()
        if cache is None:
            cache = self.init_cache(z)
        seq = torch.cat([cache.float(), z], dim=0)  # (K + T, C, h, w)
        t = z.shape[0]
        x = torch.cat([seq[j : j + t] for j in range(k + 1)], dim=1)  # (T, C*(K+1), h, w)
        x = (x / self.cfg.latent_scale).contiguous(memory_format=torch.channels_last)
        return x, seq[seq.shape[0] - k :].clone()
