"""SRDiT: shapes, residual on the bilinear upsample, loss."""

from __future__ import annotations

import pydantic
import pytest
import torch
import torch.nn.functional as F

from talkloop.pipeline.models.studio.sr import SRConfig, SRDiT, sr_loss

pytestmark = pytest.mark.unit


def _sr(tiny) -> SRDiT:
    torch.manual_seed(0)
    return SRDiT(tiny.sr).eval()


def test_untrained_sr_is_bilinear_upsampling(tiny) -> None:
    sr = _sr(tiny)
    z = torch.randn(5, 8, 8, 8)
    with torch.no_grad():
        out = sr(z, torch.randn(1, 8, 16, 16))
    assert out.shape == (5, 8, 16, 16)
    up = F.interpolate(z, scale_factor=2.0, mode="bilinear", align_corners=False)
    assert torch.equal(out, up)


def test_residual_depends_on_reference(tiny, randomise) -> None:
    sr = randomise(_sr(tiny))
    z = torch.randn(3, 8, 8, 8)
    up = F.interpolate(z, scale_factor=2.0, mode="bilinear", align_corners=False)
    with torch.no_grad():
        a = sr(z, torch.randn(1, 8, 16, 16))
        b = sr(z, torch.randn(3, 8, 16, 16))
    assert not torch.allclose(a, up)
    assert not torch.allclose(a, b)
    assert torch.isfinite(a).all()


def test_frames_are_independent(tiny, randomise) -> None:
    sr = randomise(_sr(tiny))
    z, ref = torch.randn(4, 8, 8, 8), torch.randn(1, 8, 16, 16)
    with torch.no_grad():
        whole = sr(z, ref)
        first = sr(z[:1], ref)
    assert torch.allclose(whole[:1], first, atol=1e-5)


def test_loss_weighting_and_backward(tiny) -> None:
    sr = _sr(tiny).train()
    z = torch.randn(2, 8, 16, 16)
    ref = torch.randn(1, 8, 16, 16)
    plain = sr_loss(sr, z, ref)
    ones = sr_loss(sr, z, ref, torch.ones(2, 1, 16, 16))
    assert torch.allclose(plain, ones)
    w = torch.zeros(2, 1, 16, 16)
    w[:, :, 4:8, 4:8] = 1.0
    weighted = sr_loss(sr, z, ref, w)
    assert torch.isfinite(weighted) and not torch.allclose(weighted, plain)
    weighted.backward()
    assert sr.out.weight.grad.abs().sum() > 0


def test_bad_reference_shape_is_rejected(tiny) -> None:
    with pytest.raises(ValueError, match="ref_hr"):
        _sr(tiny)(torch.randn(3, 8, 8, 8), torch.randn(2, 8, 16, 16))


@pytest.mark.parametrize("bad", [{"dim": 0}, {"dim": 34, "heads": 2}, {"mlp_ratio": 0.0}])
def test_config_rejects_bad_values(bad) -> None:
    with pytest.raises(pydantic.ValidationError):
        SRConfig(**bad)
