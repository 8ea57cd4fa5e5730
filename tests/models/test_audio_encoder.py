"""AudioEncoder: front end, streaming normalisation, features."""

from __future__ import annotations

import math

import pydantic
import pytest
import torch

from talkloop.pipeline.models.shared.audio_encoder import AudioEncoder, AudioEncoderConfig

pytestmark = pytest.mark.unit


def _enc(tiny) -> AudioEncoder:
    torch.manual_seed(0)
    return AudioEncoder(tiny.audio).eval()


def _windows(cfg: AudioEncoderConfig, t: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, cfg.window_samples, generator=g) * 0.1).float()


def test_sizes_follow_config() -> None:
    cfg = AudioEncoderConfig()
    assert cfg.window_samples == 2560
    assert cfg.lookahead_samples == 640
    assert cfg.n_steps == 14


def test_shapes(tiny) -> None:
    enc = _enc(tiny)
    cfg = tiny.audio
    mel = enc.log_mel(_windows(cfg, 6))
    assert mel.shape == (6, cfg.n_mels, cfg.n_steps)
    normed, state = enc.normalise(mel, enc.init_norm_state())
    assert normed.shape == mel.shape
    assert state.shape == (2, cfg.n_mels)
    feats = enc(normed)
    assert feats.shape == (6, cfg.dim)
    assert torch.isfinite(feats).all()


def test_log_mel_finds_a_tone(tiny) -> None:
    enc = _enc(tiny)
    cfg = tiny.audio
    n = torch.arange(cfg.window_samples, dtype=torch.float32)
    low = torch.sin(2 * math.pi * 300 * n / cfg.sample_rate)
    high = torch.sin(2 * math.pi * 4000 * n / cfg.sample_rate)
    mel = enc.log_mel(torch.stack([low, high])).mean(dim=2)  # (2, n_mels)
    assert mel[0].argmax() < mel[1].argmax()


def test_normalisation_is_split_invariant(tiny) -> None:
    enc = _enc(tiny)
    mel = enc.log_mel(_windows(tiny.audio, 13))
    whole, whole_state = enc.normalise(mel, enc.init_norm_state())
    for splits in ([1, 12], [5, 8], [4, 4, 4, 1]):
        state, parts, s = enc.init_norm_state(), [], 0
        for n in splits:
            out, state = enc.normalise(mel[s : s + n], state)
            parts.append(out)
            s += n
        assert torch.equal(torch.cat(parts), whole)
        assert torch.equal(state, whole_state)


def test_normalisation_tracks_level(tiny) -> None:
    enc = _enc(tiny)
    loud = enc.log_mel(_windows(tiny.audio, 200) * 10.0)
    normed, _ = enc.normalise(loud, enc.init_norm_state())
    # After the EMA has settled, a steady signal is centred near zero.
    assert normed[-20:].mean().abs() < 0.5


@pytest.mark.parametrize(
    "bad", [{"n_mels": 0}, {"ema_decay": 1.0}, {"window_ms": 10.0}, {"extra": True}]
)
def test_config_rejects_bad_values(bad) -> None:
    with pytest.raises(pydantic.ValidationError):
        AudioEncoderConfig(**bad)
