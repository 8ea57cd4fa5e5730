"""A2VDiT and its sampler/loss: one network for first chunks, continuations, interpolations."""

from __future__ import annotations

import pydantic
import pytest
import torch

from talkloop.pipeline.models.shared.a2v import A2VConfig, A2VDiT, lowres
from talkloop.pipeline.models.shared.sampling import (
    euler_sample,
    flow_matching_loss,
    sampling_schedule,
)

pytestmark = pytest.mark.unit

B, F, C, H, W = 2, 6, 8, 8, 8


def _model(tiny, live: bool = True) -> A2VDiT:
    torch.manual_seed(0)
    net = A2VDiT(tiny.a2v).eval()
    if live:
        # Overwrite the zero-initialised branches so every path carries signal.
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return net


def _inputs(tiny, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, F, C, H, W, generator=g)
    ref = torch.randn(B, C, H, W, generator=g)
    audio = torch.randn(B, F, tiny.a2v.audio_dim, generator=g)
    text = torch.randn(B, tiny.a2v.text_dim, generator=g)
    return x, ref, audio, text


PATTERNS = {
    # first chunk: nothing given
    "first": (torch.zeros(F, dtype=torch.bool), torch.arange(F).float()),
    # continuation: two motion-context frames before the chunk
    "continuation": (torch.arange(F) < 2, torch.arange(F).float() - 2),
    # interpolation: anchors at both ends
    "interpolation": (
        torch.tensor([True] + [False] * (F - 2) + [True]),
        torch.arange(F).float() - 1,
    ),
}


def _pattern(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """PATTERNS[name]'s given-frame mask and positions, for every batch row."""
    mask, pos = PATTERNS[name]
    return mask.expand(B, F), pos.expand(B, F)


def test_forward_shape_and_untrained_output_is_zero(tiny) -> None:
    net = _model(tiny, live=False)
    x, ref, audio, text = _inputs(tiny)
    t, pos = torch.rand(B, F), torch.arange(F).float().expand(B, F)
    v = net(x, t, pos, ref, audio, text)
    assert v.shape == (B, F, C, H, W)
    assert torch.count_nonzero(v) == 0  # adaLN-Zero: untrained velocity is exactly 0


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_sampler_keeps_given_frames_and_is_deterministic(tiny, pattern: str) -> None:
    net = _model(tiny)
    mask, pos = _pattern(pattern)
    x, ref, audio, text = _inputs(tiny)
    noise = torch.randn(B, F, C, H, W, generator=torch.Generator().manual_seed(1))
    out = euler_sample(net, x, mask, pos, ref, audio, text, noise, steps=3, shift=2.0)
    again = euler_sample(net, x, mask, pos, ref, audio, text, noise.clone(), steps=3, shift=2.0)
    assert out.shape == (B, F, C, H, W)
    assert torch.isfinite(out).all()
    assert torch.equal(out[mask], x[mask])
    assert torch.equal(out, again)
    if (~mask).any():
        assert not torch.equal(out[~mask], noise[~mask])


def test_sampler_under_bf16_autocast_keeps_given_frames(tiny) -> None:
    net = _model(tiny)
    mask, pos = _pattern("continuation")
    x, ref, audio, text = _inputs(tiny)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = euler_sample(net, x, mask, pos, ref, audio, text, torch.randn_like(x), steps=2)
    assert out.dtype == torch.float32
    assert torch.equal(out[mask], x[mask])


def test_audio_changes_the_output(tiny) -> None:
    net = _model(tiny)
    mask, pos = _pattern("first")
    x, ref, audio, text = _inputs(tiny)
    noise = torch.randn_like(x)
    a = euler_sample(net, x, mask, pos, ref, audio, text, noise, steps=2)
    b = euler_sample(net, x, mask, pos, ref, audio + 1.0, text, noise, steps=2)
    c = euler_sample(net, x, mask, pos, ref, None, text, noise, steps=2)
    assert not torch.allclose(a, b)
    assert not torch.allclose(a, c)


def test_audio_attention_is_banded(tiny) -> None:
    net = _model(tiny)
    x, ref, audio, text = _inputs(tiny)
    t, pos = torch.rand(B, F), torch.arange(F).float().expand(B, F)
    audio2 = audio.clone()
    audio2[:, 0] += 3.0  # frame 0's audio; radius 2 -> heard directly by frames 0..2
    with torch.no_grad():
        # One block: self-attention would otherwise spread the change to every frame.
        net.blocks = net.blocks[:1]
        v1 = net(x, t, pos, ref, audio2, text)
        v0 = net(x, t, pos, ref, audio, text)
    assert not torch.allclose(v0[:, 0], v1[:, 0])
    # Frames beyond the radius see the change only through self-attention after the cross-attn.
    diff_near = (v0[:, :3] - v1[:, :3]).abs().mean()
    diff_far = (v0[:, 3:] - v1[:, 3:]).abs().mean()
    assert diff_near > diff_far


def test_audio_guidance_runs_and_matters(tiny) -> None:
    net = _model(tiny)
    mask, pos = _pattern("continuation")
    x, ref, audio, text = _inputs(tiny)
    noise = torch.randn_like(x)
    plain = euler_sample(net, x, mask, pos, ref, audio, text, noise, steps=2)
    g1 = euler_sample(net, x, mask, pos, ref, audio, text, noise, steps=2, audio_guidance=1.0)
    g3 = euler_sample(net, x, mask, pos, ref, audio, text, noise, steps=2, audio_guidance=3.0)
    assert torch.equal(plain, g1)
    assert not torch.allclose(plain, g3)
    assert torch.equal(g3[mask], x[mask])


def test_keep_flags_match_dropping(tiny) -> None:
    net = _model(tiny)
    x, ref, audio, text = _inputs(tiny)
    t, pos = torch.rand(B, F), torch.arange(F).float().expand(B, F)
    with torch.no_grad():
        dropped = net(x, t, pos, ref, None, None)
        flagged = net(
            x,
            t,
            pos,
            ref,
            audio,
            text,
            audio_keep=torch.zeros(B, dtype=torch.bool),
            text_keep=torch.zeros(B, dtype=torch.bool),
        )
    assert torch.allclose(dropped, flagged, atol=1e-5)


def test_schedule_runs_from_noise_to_clean() -> None:
    ts = sampling_schedule(4, 3.0)
    assert ts[0] == 1.0 and ts[-1] == 0.0
    assert (ts[1:] < ts[:-1]).all()
    assert ts[2] > 0.5  # shift > 1 spends more of the grid near noise


def test_other_grid_sizes_work(tiny) -> None:
    net = _model(tiny)
    x = torch.randn(1, 3, C, 12, 6)
    v = net(
        x, torch.rand(1, 3), torch.arange(3).float()[None], torch.randn(1, C, 12, 6), None, None
    )
    assert v.shape == x.shape


def test_bad_shapes_are_rejected(tiny) -> None:
    net = _model(tiny)
    x, ref, audio, text = _inputs(tiny)
    with pytest.raises(ValueError, match="t and pos"):
        net(x, torch.rand(B, F - 1), torch.zeros(B, F), ref, audio, text)
    with pytest.raises(ValueError, match="max_frames"):
        big = torch.randn(1, tiny.a2v.max_frames + 1, C, H, W)
        n = big.shape[1]
        net(big, torch.rand(1, n), torch.zeros(1, n), ref[:1], None, None)


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_loss_is_finite_and_trains(tiny, pattern: str) -> None:
    net = _model(tiny, live=False).train()
    mask, pos = _pattern(pattern)
    x, ref, audio, text = _inputs(tiny)
    g = torch.Generator().manual_seed(7)  # not _inputs' seed: eps must differ from x0
    loss = flow_matching_loss(
        net, x, mask, pos, ref, audio, text, g, audio_drop_prob=0.5, text_drop_prob=0.5
    )
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in net.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(gr).all() for gr in grads)
    assert net.out.weight.grad.abs().sum() > 0


def test_loss_ignores_given_frames(tiny) -> None:
    net = _model(tiny)
    mask, pos = _pattern("continuation")
    x, ref, audio, text = _inputs(tiny)
    loss = flow_matching_loss(net, x, mask, pos, ref, audio, text, torch.Generator().manual_seed(7))
    # With every frame given there is nothing to generate, so nothing may enter the loss.
    all_given = torch.ones(B, F, dtype=torch.bool)
    zero = flow_matching_loss(
        net, x, all_given, pos, ref, audio, text, torch.Generator().manual_seed(7)
    )
    assert loss > 0
    assert zero == 0


def test_loss_weight_is_a_weighted_mean_over_positions(tiny) -> None:
    net = _model(tiny)
    mask, pos = _pattern("continuation")
    x, ref, audio, text = _inputs(tiny)

    def loss(weight: torch.Tensor | None) -> torch.Tensor:
        g = torch.Generator().manual_seed(7)
        return flow_matching_loss(net, x, mask, pos, ref, audio, text, g, weight=weight)

    # Uniform weights of any scale are the plain mean; weight on one cell scores that cell only.
    plain = loss(None)
    assert torch.allclose(loss(torch.full((B, F, 1, H, W), 8.0)), plain, rtol=1e-5)
    one_cell = torch.zeros(B, F, 1, H, W)
    one_cell[..., 0, 0] = 1.0
    other_cell = torch.zeros(B, F, 1, H, W)
    other_cell[..., -1, -1] = 1.0
    assert loss(one_cell) != loss(other_cell)
    assert loss(one_cell) != plain


def test_lowres_pools_by_two() -> None:
    z = torch.randn(3, 4, C, 32, 32)
    assert lowres(z).shape == (3, 4, C, 16, 16)
    assert torch.allclose(lowres(z)[0, 0, 0, 0, 0], z[0, 0, 0, :2, :2].mean())


@pytest.mark.parametrize(
    "bad", [{"dim": 30, "heads": 4}, {"patch": 0}, {"depth": 0}, {"audio_radius": -1.0}]
)
def test_config_rejects_bad_values(bad) -> None:
    with pytest.raises(pydantic.ValidationError):
        A2VConfig(**bad)
