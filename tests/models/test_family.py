"""The studio family: root config, network construction, one chunk through every network."""

from __future__ import annotations

import pydantic
import pytest
import torch

from talkloop.pipeline.models.shared.a2v import lowres
from talkloop.pipeline.models.shared.sampling import euler_sample
from talkloop.pipeline.models.studio.family import NETWORK_KEYS, StudioConfig, build_networks

pytestmark = pytest.mark.unit


def test_build_networks_keys_and_determinism(tiny, text_encoder) -> None:
    torch.manual_seed(3)
    a = build_networks(tiny)
    torch.manual_seed(3)
    b = build_networks(tiny)
    assert (
        tuple(a)
        == NETWORK_KEYS
        == (
            "vae",
            "audio_encoder",
            "text_encoder",
            "expression",
            "a2v",
            "sr",
            "mouth",
        )
    )
    for key in NETWORK_KEYS:
        sa, sb = a[key].state_dict(), b[key].state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a["text_encoder"].state_dict() == {}


def test_one_chunk_through_untrained_networks(tiny, text_encoder) -> None:
    torch.manual_seed(0)
    nets = build_networks(tiny)
    vae, aenc, a2v, sr = nets["vae"], nets["audio_encoder"], nets["a2v"], nets["sr"]
    t = 6
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref_hr = vae.encode(torch.rand(1, 3, 64, 64) * 2 - 1)  # (1, 8, 8, 8)
        ref = lowres(ref_hr)  # (1, 8, 4, 4)
        windows = torch.randn(t, tiny.audio.window_samples) * 0.1
        mel, _ = aenc.normalise(aenc.log_mel(windows), aenc.init_norm_state())
        audio = aenc(mel)[None]  # (1, T, dim)
        text = nets["text_encoder"].encode(["smiling"])
        noise = torch.randn(1, t, 8, 4, 4)
        lat = euler_sample(
            a2v,
            torch.zeros_like(noise),
            torch.zeros(1, t, dtype=torch.bool),
            torch.arange(t).float()[None],
            ref,
            audio,
            text,
            noise,
            steps=2,
        )
        hr = sr(lat[0], ref_hr)
        frames, _ = vae.decode(hr)
    assert frames.shape == (t, 3, 64, 64)
    assert torch.isfinite(frames).all() and frames.abs().max() <= 1.0


def test_default_config_builds_consistently() -> None:
    cfg = StudioConfig.default()
    assert cfg.a2v.audio_dim == cfg.audio.dim
    assert cfg.a2v.latent_channels == cfg.vae.latent_channels == cfg.sr.latent_channels


def test_mismatched_sub_configs_are_rejected() -> None:
    with pytest.raises(pydantic.ValidationError, match="audio_dim"):
        StudioConfig(audio={"dim": 64})
    with pytest.raises(pydantic.ValidationError, match="mouth.audio_dim=64 must equal"):
        StudioConfig(mouth={"audio_dim": 64})
    with pytest.raises(pydantic.ValidationError, match="latent_channels"):
        StudioConfig(vae={"latent_channels": 4})
    with pytest.raises(pydantic.ValidationError):
        StudioConfig(unknown={})


@pytest.mark.parametrize(
    ("name", "condition_dim", "says"),
    [("expression", 384, "prompts will not change the face"), ("mouth", 128, "no explicit mouth")],
)
def test_weights_trained_before_an_optional_module_still_load(
    name: str, condition_dim: int, says: str, tmp_path, caplog
) -> None:
    """A folder without the files of a module added later loads with that module as the identity
    (sized from the folder's other networks) and says what is lost; half a pair is an error."""
    import shutil

    from talkloop.pipeline.models.registry import load_modules
    from talkloop.pipeline.models.studio.family import INSTALLED_WEIGHTS

    from support import tiny_config

    for f in INSTALLED_WEIGHTS.iterdir():
        if f.suffix in (".json", ".safetensors") and not f.name.startswith(f"{name}."):
            shutil.copy(f, tmp_path / f.name)
    config = tiny_config(model={"weights": str(tmp_path), "untrained": False, "preset": "default"})
    with caplog.at_level("WARNING", logger="talkloop.models"):
        modules = load_modules(config)
    assert f"no {name} weights" in caplog.text and says in caplog.text
    z = torch.randn(2, 8, 32, 32)
    with torch.no_grad():
        assert torch.equal(modules[name].net(z, torch.randn(2, condition_dim)), z)
    shutil.copy(INSTALLED_WEIGHTS / f"{name}.json", tmp_path / f"{name}.json")
    with pytest.raises(Exception, match=name):
        load_modules(config)
