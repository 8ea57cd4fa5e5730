"""Narrowing a trained decoder (pipeline.train.refit_decoder): pruning, distillation, the tool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.models.studio.data import clip_paths, ensure_dataset
from talkloop.pipeline.models.studio.family import STUDIO_MODULES, StudioConfig, build_networks
from talkloop.pipeline.models.studio.recipe import PhaseConfig
from talkloop.pipeline.models.studio.refit_decoder import (
    distil,
    distil_data,
    main,
    prune_decoder,
    psnr,
    score,
)
from talkloop.pipeline.models.studio.vae import Decoder, StudioVAE, VAEConfig

pytestmark = pytest.mark.unit


def _trained_like(cfg: VAEConfig, seed: int = 0) -> StudioVAE:
    """A VAE whose decoder weights are all non-trivial (the residual branches are not ~0)."""
    torch.manual_seed(seed)
    vae = StudioVAE(cfg)
    with torch.no_grad():
        for m in vae.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.normal_(m.weight, std=(1.0 / m.weight[0].numel()) ** 0.5)
                torch.nn.init.normal_(m.bias, std=0.05)
    return vae.eval()


CFG = VAEConfig(
    dec_latent_channels=32, dec_channels=16, dec_latent_blocks=2, dec_blocks=1, cache_frames=2
)


def _inputs(n: int = 8, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, CFG.latent_channels * (CFG.cache_frames + 1), 8, 8, generator=g)
    return x.contiguous(memory_format=torch.channels_last)


def test_pruning_to_the_same_widths_copies_the_decoder() -> None:
    vae = _trained_like(CFG)
    x = _inputs()
    same = prune_decoder(vae.decoder, CFG, x)
    with torch.no_grad():
        assert torch.equal(same(x), vae.decoder(x))


def test_pruning_keeps_the_channels_that_carry_the_output() -> None:
    """Two channels of the residual stream and two inside each block are made dead (never
    active, or read by nothing): pruning those away must leave the output as it was."""
    vae = _trained_like(CFG)
    dead, dead_mid = [3, 17], [5, 9]
    with torch.no_grad():
        d = vae.decoder
        d.stem.weight[dead] = 0.0
        d.stem.bias[dead] = -1.0  # relu(-1) = 0: the channel starts at 0
        d.up.weight[:, dead] = 0.0
        for b in d.blocks1:
            b.conv2.weight[dead] = 0.0
            b.conv2.bias[dead] = 0.0
            b.conv1.weight[:, dead] = 0.0
            b.conv1.weight[dead_mid] = 0.0
            b.conv1.bias[dead_mid] = -1.0
    x = _inputs()
    narrow = CFG.model_copy(update={"dec_latent_channels": 30})
    pruned = prune_decoder(vae.decoder, narrow, x)
    assert pruned.stem.out_channels == 30
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), vae.decoder(x), atol=1e-5, rtol=1e-5)


def test_pruning_beats_a_fresh_decoder_and_distillation_closes_the_gap() -> None:
    vae = _trained_like(CFG)
    x = _inputs(24)
    with torch.no_grad():
        target = vae.decoder(x)
    narrow = CFG.model_copy(update={"dec_latent_channels": 24, "dec_channels": 12})
    pruned = prune_decoder(vae.decoder, narrow, x)
    torch.manual_seed(5)
    fresh = Decoder(narrow)
    with torch.no_grad():
        p_pruned, p_fresh = psnr(pruned(x), target), psnr(fresh(x), target)
    assert p_pruned > p_fresh + 3.0, (p_pruned, p_fresh)

    from talkloop.pipeline.models.studio.refit_decoder import DistilData

    data = DistilData(
        x=x,
        teacher=target.half(),
        truth=torch.zeros(24, 64, 64, 3, dtype=torch.uint8),
        weights=torch.ones(24, 64, 64, dtype=torch.uint8),
        mouth_box=torch.tensor([[16.0, 16.0, 48.0, 48.0]]).expand(24, 4),
    )
    before = score(pruned, data)["psnr_vs_trained_db"]
    distil(pruned, data, PhaseConfig(steps=60, batch=8, lr=2e-3), seed=0)
    after = score(pruned, data)
    assert after["psnr_vs_trained_db"] > before + 1.0, (before, after)
    assert not pruned.training


def test_pruning_refuses_to_widen_or_change_depth() -> None:
    vae = _trained_like(CFG)
    x = _inputs(2)
    with pytest.raises(ConfigError, match="narrows"):
        prune_decoder(vae.decoder, CFG.model_copy(update={"dec_channels": 32}), x)
    with pytest.raises(ConfigError, match="block counts"):
        prune_decoder(vae.decoder, CFG.model_copy(update={"dec_blocks": 2}), x)


def test_distil_data_is_a_causal_stream(tmp_path: Path) -> None:
    folder = ensure_dataset(tmp_path / "clips", 1, 64, 0, workers=1)
    cfg = StudioConfig.tiny().vae
    vae = _trained_like(cfg)
    data = distil_data(vae, clip_paths(folder), windows_per_clip=2, length=5, seed=0)
    k = cfg.cache_frames
    assert data.x.shape == (2 * (5 - k), cfg.latent_channels * (k + 1), 8, 8)
    assert data.teacher.shape == (2 * (5 - k), 3, 64, 64) and data.teacher.dtype == torch.float16
    assert data.truth.shape == (2 * (5 - k), 64, 64, 3) and data.weights.shape == (6, 64, 64)
    # Frame i of a window sees frames i-K .. i: the newest latent is the frame's own.
    own = vae.encode(data.truth[:1].permute(0, 3, 1, 2).float() / 127.5 - 1.0)
    torch.testing.assert_close(
        data.x[:1, -cfg.latent_channels :] * cfg.latent_scale, own, atol=1e-4, rtol=1e-4
    )
    with pytest.raises(ConfigError, match="no frame after"):
        distil_data(vae, clip_paths(folder), 1, k, 0)


def test_the_tool_writes_a_loadable_folder_with_the_encoder_untouched(tmp_path: Path) -> None:
    family = StudioConfig.tiny()
    nets = build_networks(family)
    src = tmp_path / "weights"
    for name, field in STUDIO_MODULES.items():
        Module(name, getattr(family, field), nets[name]).save(src)
    out = tmp_path / "narrow"
    args = ["--weights", str(src), "--out", str(out), "--data", str(tmp_path / "clips")]
    args += ["--size", "64", "--clips", "2", "--characters", "2", "--test-clips", "1"]
    args += ["--windows", "2", "--window", "5", "--steps", "4", "--channels", "12", "8"]
    assert main(args) == 0
    assert not (tmp_path / "narrow.partial").exists()
    vcfg = json.loads((out / "vae.json").read_text())
    assert (vcfg["dec_latent_channels"], vcfg["dec_channels"]) == (12, 8)
    old, new = load_file(str(src / "vae.safetensors")), load_file(str(out / "vae.safetensors"))
    for key, value in old.items():
        if key.startswith("encoder."):
            assert torch.equal(new[key], value.half()), key
    assert new["decoder.stem.weight"].shape[0] == 12
    report = json.loads((out / "refit_decoder.json").read_text())
    assert report["refit"]["steps"] == 4 and report["refit"]["channels"] == [12, 8]
    assert set(report["trained"]) >= {"psnr_vs_truth_db", "psnr_vs_truth_mouth_db", "channels"}
    for row in ("pruned", "refit"):
        assert set(report[row]) >= {"psnr_vs_trained_db", "psnr_vs_truth_mouth_db"}

    from talkloop.pipeline.core.config import build_config
    from talkloop.pipeline.models.registry import load_modules

    config = build_config(
        video={"width": 64, "height": 64},
        model={"family": "studio", "weights": str(out), "backend": "torch", "dtype": "float32"},
    )
    modules = load_modules(config)
    assert modules["vae"].net.decoder.stem.out_channels == 12
    with pytest.raises(ConfigError, match="exists"):
        main(args)
    other = [*args[:3], str(tmp_path / "other"), *args[4:]]
    with pytest.raises(ConfigError, match="--channels 12 4"):
        main([*other[:-2], "12", "4"])
    with pytest.raises(ConfigError, match="--windows must be >= 1, got 0"):
        main([*other, "--windows", "0"])
    with pytest.raises(ConfigError, match="--lr: .*got 2.0"):
        main([*other, "--lr", "2"])
    assert not (tmp_path / "other").exists() and not (tmp_path / "other.partial").exists()
    # Without --steps, a budget: 20 timed steps on a copy decide the count (>= 20).
    budget = [a for a in other if a not in ("--steps", "4")] + ["--minutes", "0.001"]
    assert main(budget) == 0
    budgeted = json.loads((tmp_path / "other" / "refit_decoder.json").read_text())
    assert budgeted["refit"]["steps"] >= 20 and not (tmp_path / "other.partial").exists()
