"""Portrait motion generator: config, normalisation, sampling with the N/I masks, shipped weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from talkloop.pipeline.core.config import SamplerConfig, ScheduleConfig
from talkloop.pipeline.core.errors import CheckpointError
from talkloop.pipeline.core.schedule import Timeline
from talkloop.pipeline.models.portrait.motion import (
    FIELD_RANGES,
    PortraitMotionConfig,
    build_motion,
    load_motion,
    load_motion_config,
)
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS
from talkloop.pipeline.models.shared.sampling import euler_sample
from talkloop.pipeline.synth.dataset import make_clip
from talkloop.pipeline.train.metrics import lipsync

pytestmark = pytest.mark.unit

SHIPPED = Path(__file__).parents[3] / "talkloop" / "pipeline" / "models" / "portrait" / "weights"
MEAN = np.linspace(-0.2, 0.3, 16)
STD = np.linspace(0.01, 0.5, 16)


def _config() -> PortraitMotionConfig:
    return PortraitMotionConfig.tiny().with_stats(MEAN, STD)


def test_config_round_trips_through_json_and_a_weights_folder(tmp_path: Path) -> None:
    cfg = _config()
    assert PortraitMotionConfig.model_validate_json(cfg.model_dump_json()) == cfg
    torch.manual_seed(3)
    module = build_motion(cfg)
    with torch.no_grad():
        for p in module.net.parameters():
            p.normal_()
    module.save(tmp_path)
    assert load_motion_config(tmp_path) == cfg
    loaded = load_motion(tmp_path)
    for name, tensor in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_config_rejects_bad_statistics_and_sizes() -> None:
    with pytest.raises(ValueError, match="std must be >="):
        PortraitMotionConfig(std=(0.0,) * 16)
    with pytest.raises(ValueError, match="mean must be 16 finite floats"):
        PortraitMotionConfig(mean=(0.0,) * 15)
    with pytest.raises(ValueError, match="latent_channels"):
        PortraitMotionConfig(latent_channels=8)
    # A spiky field whose std is ~0 is floored, not rejected, when statistics are measured.
    std = STD.copy()
    std[FRAME_FIELDS.index("tongue")] = 0.0
    assert min(PortraitMotionConfig().with_stats(MEAN, std).std) > 0


def test_loading_a_folder_without_a_motion_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="a2v.json"):
        load_motion(tmp_path)


def test_normalise_and_denormalise_invert() -> None:
    cfg = _config()
    rng = np.random.default_rng(0)
    low = np.array([FIELD_RANGES[f][0] for f in FRAME_FIELDS])
    high = np.array([FIELD_RANGES[f][1] for f in FRAME_FIELDS])
    params = rng.uniform(low, high, size=(3, 7, 16)).astype(np.float32)
    latents = cfg.normalise(params)
    assert latents.shape == (3, 7, 16, 1, 1) and latents.dtype == torch.float32
    np.testing.assert_allclose(cfg.denormalise(latents), params, atol=1e-5)
    # (x - mean) / std per field.
    np.testing.assert_allclose(
        latents[0, 0, :, 0, 0].numpy(), (params[0, 0] - MEAN) / STD, rtol=1e-4
    )
    # The neutral rest (all zeros) is the reference latent.
    np.testing.assert_allclose(cfg.rest_latent()[0, :, 0, 0].numpy(), -MEAN / STD, rtol=1e-5)


def test_denormalise_clips_to_the_valid_ranges() -> None:
    cfg = _config()
    wild = cfg.normalise(np.full((2, 16), 50.0, np.float32))
    out = cfg.denormalise(wild)
    assert out.max() <= 1.0 and out[:, FRAME_FIELDS.index("yaw")].max() == pytest.approx(0.35)
    assert cfg.denormalise(wild, clip=False).min() > 1.0


@pytest.mark.parametrize(
    ("mask_front", "mask_back", "frames"),
    [(0, False, 2), (2, False, 7), (1, True, 4)],  # N0, N chunk with 2 context frames, I chunk
)
def test_untrained_net_samples_finite_parameters_and_keeps_given_frames(
    randomise, mask_front: int, mask_back: bool, frames: int
) -> None:
    cfg = _config()
    net = randomise(build_motion(cfg).net)  # every branch live (adaLN-Zero starts at zero)
    g = torch.Generator().manual_seed(0)
    given = torch.randn(1, frames, 16, 1, 1, generator=g)
    mask = torch.zeros(1, frames, dtype=torch.bool)
    mask[0, :mask_front] = True
    mask[0, -1] = mask_back
    pos = torch.arange(frames, dtype=torch.float32)[None] - mask_front
    out = euler_sample(
        net,
        given,
        mask,
        pos,
        cfg.rest_latent(),
        torch.randn(1, frames, cfg.audio_dim, generator=g),
        torch.randn(1, 384, generator=g),
        torch.randn(1, frames, 16, 1, 1, generator=g),
        steps=3,
        shift=3.0,
    )
    assert out.shape == (1, frames, 16, 1, 1) and torch.isfinite(out).all()
    assert torch.equal(out[mask], given[mask])
    assert not torch.allclose(out[~mask], given[~mask])
    params = cfg.denormalise(out[0])
    assert params.shape == (frames, 16) and np.isfinite(params).all()


@pytest.fixture(scope="module")
def shipped_runner():
    from talkloop.pipeline.models.portrait.evaluate import load_runner

    if not (SHIPPED / "a2v.safetensors").is_file():
        pytest.fail(f"no shipped portrait motion weights in {SHIPPED}")
    return load_runner(SHIPPED, dtype="float32")


def test_shipped_weights_open_the_mouth_when_the_truth_does(shipped_runner) -> None:
    clip = make_clip("test", 0, 0, render=False)
    gen = shipped_runner.generate(clip.audio, clip.prompt, ScheduleConfig(), SamplerConfig())
    assert gen.params.shape == (clip.num_frames, 16)
    mo = FRAME_FIELDS.index("mouth_open")
    figures = lipsync([gen.params[:, mo]], [clip.params["mouth_open"]], clip.fps, 40.0)
    assert figures["lipsync_corr"] > 0.5, figures


def test_runner_publishes_segments_in_the_timeline_display_order(shipped_runner) -> None:
    clip = make_clip("test", 1, 0, render=False)
    schedule = ScheduleConfig(first_len=2, n_len=5, i_len=2, ctx_len=2)
    gen = shipped_runner.generate(clip.audio, "", schedule, SamplerConfig(steps=2, i_steps=1))
    expected = [s.start for s in Timeline(schedule).display_order(clip.num_frames) if s.start > 0]
    assert gen.seams == expected
    assert np.isfinite(gen.params).all()
