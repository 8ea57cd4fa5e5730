"""Rectified-flow sampling and training loss for :class:`A2VDiT`.

Convention: ``x_t = (1 - t) x0 + t eps``, velocity ``v = eps - x0``, t = 1 is noise. Given frames
(motion context, anchors) sit at t = 0 with their clean values; only the others are generated.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pydantic import BaseModel, Field
from torch import Tensor

from talkloop.pipeline.models.shared.a2v import A2VDiT


def shift_time(t: Tensor, shift: float) -> Tensor:
    """SD3 time shift ``t' = s t / (1 + (s - 1) t)``; s > 1 spends more steps near noise."""
    return shift * t / (1.0 + (shift - 1.0) * t)


def sampling_schedule(steps: int, shift: float) -> Tensor:
    """(steps + 1,) float32 timesteps from 1 down to 0 after the shift."""
    return shift_time(torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float32), shift)


@torch.no_grad()
def euler_sample(
    model: A2VDiT,
    x_given: Tensor,
    given_mask: Tensor,
    pos: Tensor,
    ref: Tensor,
    audio: Tensor | None,
    text: Tensor | None,
    noise: Tensor,
    steps: int,
    shift: float = 1.0,
    audio_guidance: float = 1.0,
) -> Tensor:
    """Euler integration from t = 1 to t = 0 for the frames not given.

    Args:
        model: the A2V network.
        x_given: (B, F, C, h, w) clean values at given positions (other positions are ignored).
        given_mask: (B, F) bool, True where the frame is given.
        pos: (B, F) float frame positions relative to the chunk.
        ref: (B, C, h, w) low-res reference latent.
        audio: (B, F, audio_dim) or None.
        text: (B, text_dim) or None.
        noise: (B, F, C, h, w) starting noise, drawn (seeded) by the caller.
        steps: Euler steps (>= 1).
        shift: SD3 time shift (1.0 = uniform grid).
        audio_guidance: classifier-free guidance scale on audio; 1.0 costs no extra pass, any
            other value runs the conditional and audio-dropped passes in one doubled batch.
    Returns:
        (B, F, C, h, w) float32 latents; given positions equal ``x_given`` exactly.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    if given_mask.dtype != torch.bool or given_mask.shape != x_given.shape[:2]:
        raise ValueError(
            f"given_mask must be bool {tuple(x_given.shape[:2])}, got "
            f"{given_mask.dtype} {tuple(given_mask.shape)}"
        )
    # A network whose forward is an exported graph (models/shared/a2v_graph.py) runs the whole
    # loop below as one graph.
    graph_sample = getattr(model.__dict__.get("forward"), "sample", None)
    if graph_sample is not None:
        return graph_sample(
            x_given, given_mask, pos, ref, audio, text, noise, steps, shift, audio_guidance
        )
    return euler_steps(
        model, x_given, given_mask, pos, ref, audio, text, noise, steps, shift, audio_guidance
    )


def euler_steps(
    model: Callable[..., Tensor],
    x_given: Tensor,
    given_mask: Tensor,
    pos: Tensor,
    ref: Tensor,
    audio: Tensor | None,
    text: Tensor | None,
    noise: Tensor,
    steps: int,
    shift: float,
    audio_guidance: float,
) -> Tensor:
    """:func:`euler_sample`'s loop on its checked inputs; ``model`` is anything called like
    :meth:`A2VDiT.forward` (what an exported sampler graph traces)."""
    x_given = x_given.float()
    gm = given_mask[:, :, None, None, None]  # (B, F, 1, 1, 1)
    x = torch.where(gm, x_given, noise.float())  # (B, F, C, h, w)
    ts = sampling_schedule(steps, shift)
    guided = audio is not None and audio_guidance != 1.0
    b = x.shape[0]
    if guided:
        keep = torch.cat([torch.ones(b, dtype=torch.bool), torch.zeros(b, dtype=torch.bool)])
        pos2, ref2 = pos.repeat(2, 1), ref.repeat(2, 1, 1, 1)
        audio2 = audio.repeat(2, 1, 1)
        text2 = None if text is None else text.repeat(2, 1)
    for i in range(steps):
        t_cur, t_next = ts[i].item(), ts[i + 1].item()
        t_frame = torch.where(given_mask, 0.0, t_cur).to(x.dtype)  # (B, F)
        if guided:
            v2 = model(
                x.repeat(2, 1, 1, 1, 1),
                t_frame.repeat(2, 1),
                pos2,
                ref2,
                audio2,
                text2,
                audio_keep=keep,
            ).float()
            v_c, v_u = v2[:b], v2[b:]
            v = v_u + audio_guidance * (v_c - v_u)
        else:
            v = model(x, t_frame, pos, ref, audio, text).float()
        x = x + (t_next - t_cur) * v
        # Given frames never move: reset them exactly after every step.
        x = torch.where(gm, x_given, x)
    return x


def flow_matching_loss(
    model: A2VDiT,
    x0: Tensor,
    given_mask: Tensor,
    pos: Tensor,
    ref: Tensor,
    audio: Tensor | None,
    text: Tensor | None,
    generator: torch.Generator | None = None,
    *,
    given_noise_max: float = 0.05,
    audio_drop_prob: float = 0.0,
    text_drop_prob: float = 0.0,
    text_present: Tensor | None = None,
    weight: Tensor | None = None,
) -> Tensor:
    """Rectified-flow loss on the generated frames.

    One logit-normal timestep per sample for its generated frames; given frames get a light
    noise augmentation, ``t ~ U(0, given_noise_max)`` per frame, so errors in context frames at
    inference do not compound. Audio/text dropout (per sample) trains the null embeddings that
    classifier-free guidance needs.

    Args:
        x0: (B, F, C, h, w) clean low-res latents. given_mask: (B, F) bool. Others as
            :meth:`A2VDiT.forward`. generator: draws every random number (reproducible).
        text_present: optional (B,) bool; False marks samples without a prompt, which always
            get the null text embedding (what inference uses for an empty prompt).
        weight: optional (B, F, 1, h, w) non-negative spatial weights; each frame's error is
            the weighted mean over its positions (the trainer weights face and mouth up, so the
            few latent cells of a mouth are not drowned by background).
    Returns:
        Scalar float32 MSE between predicted and target velocity over generated positions.
    """
    b, f = x0.shape[:2]
    dev = x0.device
    x0 = x0.float()
    eps = torch.randn(x0.shape, generator=generator, device=dev)
    t_gen = torch.sigmoid(torch.randn(b, 1, generator=generator, device=dev))  # (B, 1)
    t_given = torch.rand(b, f, generator=generator, device=dev) * given_noise_max  # (B, F)
    t = torch.where(given_mask, t_given, t_gen.expand(b, f))  # (B, F)
    tt = t[:, :, None, None, None]
    xt = (1.0 - tt) * x0 + tt * eps
    audio_keep = torch.rand(b, generator=generator, device=dev) >= audio_drop_prob
    text_keep = torch.rand(b, generator=generator, device=dev) >= text_drop_prob
    if text_present is not None:
        text_keep = text_keep & text_present
    v = model(xt, t, pos, ref, audio, text, audio_keep=audio_keep, text_keep=text_keep).float()
    sq = (v - (eps - x0)).square()
    if weight is None:
        err = sq.mean(dim=(2, 3, 4))  # (B, F)
    else:
        w = weight.float().expand_as(sq)
        err = (sq * w).sum(dim=(2, 3, 4)) / w.sum(dim=(2, 3, 4)).clamp_min(1e-8)
    gen = (~given_mask).float()
    return (err * gen).sum() / gen.sum().clamp_min(1.0)


class MaskRecipe(BaseModel):
    """How an A2V trainer draws its mask patterns (docs/architecture.md): first chunks with no
    given frames, N chunks after a motion context, I chunks between two anchors."""

    p_first: float = Field(0.2, ge=0.0, le=1.0, description="share of N0 steps (no given frames)")
    p_interp: float = Field(0.3, ge=0.0, le=1.0, description="share of I-chunk steps")
    max_ctx: int = Field(2, ge=1, le=16, description="most motion-context frames")
    max_gen: int = Field(24, ge=2, le=256, description="most generated frames of an N step")
    max_interior: int = Field(4, ge=1, le=64, description="most interior frames of an I step")
    given_noise_max: float = Field(0.05, ge=0.0, le=0.5)
