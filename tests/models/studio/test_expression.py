"""ExpressionNet: the prompt's expression on the reference latent, and the stage that runs it."""

from __future__ import annotations

import pytest
import torch

from talkloop.pipeline.models.registry import build_pipeline
from talkloop.pipeline.models.studio.expression import ExpressionConfig, ExpressionNet

from support import make_reference, tiny_config

pytestmark = pytest.mark.unit


def test_untrained_net_leaves_the_reference_exactly_as_it_is() -> None:
    torch.manual_seed(0)
    net = ExpressionNet(ExpressionConfig(channels=16, blocks=2, style_dim=16))
    z, text = torch.randn(2, 8, 8, 8), torch.randn(2, 384)
    assert torch.equal(net(z, text), z)


def test_live_net_output_depends_on_the_prompt(randomise) -> None:
    net = randomise(ExpressionNet(ExpressionConfig(channels=16, blocks=2, style_dim=16)))
    z, text = torch.randn(1, 8, 8, 8), torch.randn(2, 384)
    with torch.no_grad():
        a, b = net(z, text[:1]), net(z, text[1:])
        assert torch.equal(a, net(z, text[:1]))
    assert a.shape == z.shape and not torch.allclose(a, b)


def test_bad_shapes_are_named() -> None:
    net = ExpressionNet(ExpressionConfig(channels=16, blocks=1, style_dim=16))
    with pytest.raises(ValueError, match="z must be"):
        net(torch.randn(1, 4, 8, 8), torch.randn(1, 384))
    with pytest.raises(ValueError, match="text must be"):
        net(torch.randn(2, 8, 8, 8), torch.randn(1, 384))


def test_session_reference_follows_the_prompt_and_returns_without_one(tiny_modules) -> None:
    """The stage edits the encoded reference only when there is a prompt; clearing the prompt
    mid-session gives back the reference exactly as encoded."""
    pipeline = build_pipeline(tiny_config(), tiny_modules)
    session = pipeline.open_session(make_reference(), "a cheerful presenter, smiling", [])
    state = session.state
    assert state.fields["ref_latent"] is not None and state.fields["ref_latent_hr"] is not None
    assert not torch.allclose(state.fields["ref_latent_hr"], state.fields["ref_latent"])
    torch.testing.assert_close(
        state.fields["a2v_reference"],
        torch.nn.functional.avg_pool2d(state.fields["ref_latent_hr"], 2),
    )
    pipeline.run_phase("prompt", {"prompt": ""}, state)
    assert torch.equal(state.fields["ref_latent_hr"], state.fields["ref_latent"])
    session.close()
