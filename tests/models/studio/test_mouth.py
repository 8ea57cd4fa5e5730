"""MouthNet: the speech's mouth on the generated latents, and the stage that runs it."""

from __future__ import annotations

import pytest
import torch

from talkloop.pipeline.models.registry import build_pipeline
from talkloop.pipeline.models.studio.mouth import MOUTH_FIELDS, MouthConfig, MouthNet

from support import CollectSink, make_reference, tiny_config

pytestmark = pytest.mark.unit

CFG = MouthConfig(audio_dim=16, hidden=16, channels=16, blocks=2, style_dim=16)


def test_untrained_net_leaves_the_latents_exactly_as_they_are() -> None:
    torch.manual_seed(0)
    net = MouthNet(CFG)
    z, audio = torch.randn(3, 8, 8, 8), torch.randn(3, 16)
    assert torch.equal(net(z, audio), z)
    assert net.shape_of(audio).shape == (3, len(MOUTH_FIELDS))


def test_live_net_follows_each_frames_audio_alone(randomise) -> None:
    """Frame t's output depends on frame t's latent and audio only, so however a stream is cut
    into segments each frame gets the same mouth."""
    net = randomise(MouthNet(CFG))
    z, audio = torch.randn(4, 8, 8, 8), torch.randn(4, 16)
    with torch.no_grad():
        whole = net(z, audio)
        other = net(z, torch.cat([audio[:2], torch.randn(2, 16)]))
        parts = torch.cat([net(z[:1], audio[:1]), net(z[1:], audio[1:])])
    assert not torch.allclose(whole, z)
    torch.testing.assert_close(other[:2], whole[:2])
    assert not torch.allclose(other[2:], whole[2:])
    torch.testing.assert_close(parts, whole)


def test_bad_shapes_are_named() -> None:
    net = MouthNet(CFG)
    with pytest.raises(ValueError, match="z must be"):
        net(torch.randn(2, 4, 8, 8), torch.randn(2, 16))
    with pytest.raises(ValueError, match="audio must be"):
        net(torch.randn(2, 8, 8, 8), torch.randn(2, 12))
    with pytest.raises(ValueError, match="2 latent frames but 3 audio features"):
        net(torch.randn(2, 8, 8, 8), torch.randn(3, 16))
    with pytest.raises(ValueError, match="shape must be"):
        net.edit(torch.randn(2, 8, 8, 8), torch.randn(2, 3))


def test_published_frames_go_through_the_mouth_stage_with_their_own_audio(
    tiny_modules, monkeypatch
) -> None:
    """Every published segment reaches the mouth net with one audio feature per latent frame."""
    seen: list[tuple[int, int]] = []
    net = tiny_modules["mouth"].net
    forward = net.forward

    def spy(z: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        seen.append((z.shape[0], audio.shape[0]))
        return forward(z, audio)

    monkeypatch.setattr(net, "forward", spy)
    sink = CollectSink()
    session = build_pipeline(tiny_config(), tiny_modules).open_session(make_reference(), "", [sink])
    session.render([torch.randn(16000 * 2).numpy() * 0.1])
    assert seen and all(a == b for a, b in seen)
    assert sum(a for a, _ in seen) == sink.all_frames().shape[0]
