"""Portrait motion training: a tiny run lowers the loss and writes a folder that loads; the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from talkloop.pipeline.cli import main
from talkloop.pipeline.core.config import SamplerConfig, ScheduleConfig
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.portrait.evaluate import load_runner
from talkloop.pipeline.models.portrait.motion import build_motion, load_motion
from talkloop.pipeline.models.portrait.train import (
    FROZEN_FROM,
    MotionTrainConfig,
    audio_features,
    load_audio_encoder,
    load_data,
    sample_batch,
    train_motion,
    validation_loss,
)
from talkloop.pipeline.models.studio import SPEC as STUDIO_SPEC
from talkloop.pipeline.synth.dataset import make_clip

pytestmark = pytest.mark.unit  # ~20 s: espeak for a few clips, the text encoder, 20 steps


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[MotionTrainConfig, Path]:
    cfg = MotionTrainConfig.tiny()
    out = tmp_path_factory.mktemp("motion")
    train_motion(cfg, out, progress=False)
    return cfg, out


def _data(cfg: MotionTrainConfig, out: Path):
    meta = {
        "split": "train",
        "count": cfg.clips,
        "seed": cfg.seed,
        "variants": cfg.prompt_variants,
        "min_frames": cfg.max_frames,
        "festival_share": cfg.festival_share,
    }
    data = load_data(out / "motion_data.npz", meta)
    assert data is not None, "the run did not cache its training arrays"
    return data


def test_tiny_run_lowers_the_loss_and_writes_a_loadable_folder(run) -> None:
    cfg, out = run
    trained = load_motion(out)
    torch.manual_seed(cfg.seed)
    fresh = build_motion(trained.config).net  # the same init, before any step
    data = _data(cfg, out)
    before = validation_loss(fresh, data, cfg)
    after = validation_loss(trained.net, data, cfg)
    assert after < 0.9 * before, (before, after)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert max(r.get("step", 0) for r in log) == cfg.steps
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps_done"] == cfg.steps
    # Statistics measured on the clips, in FRAME_FIELDS order, std floored above zero.
    params = data.params.double()
    np.testing.assert_allclose(trained.config.mean, params.mean(0).numpy(), rtol=1e-5, atol=1e-7)
    assert min(trained.config.std) > 0


def test_folder_carries_the_frozen_shared_audio_encoder(run) -> None:
    """The trained folder carries the shipped audio encoder unchanged: the same bytes in the
    portrait and the studio folders (one shared encoder)."""
    _, out = run
    for suffix in (".json", ".safetensors"):
        shipped = (FROZEN_FROM / f"audio_encoder{suffix}").read_bytes()
        assert (out / f"audio_encoder{suffix}").read_bytes() == shipped
        assert (STUDIO_SPEC.weights / f"audio_encoder{suffix}").read_bytes() == shipped
    runner = load_runner(out, dtype="float32")
    clip = make_clip("test", 0, 0, render=False)
    gen = runner.generate(clip.audio, "", ScheduleConfig(), SamplerConfig())
    assert gen.params.shape == (clip.num_frames, 16) and np.isfinite(gen.params).all()


def test_features_are_what_the_audio_feature_stage_computes_chunk_by_chunk() -> None:
    from talkloop.pipeline.core.module import Module
    from talkloop.pipeline.core.schedule import Timeline
    from talkloop.pipeline.core.stage import StageContext
    from talkloop.pipeline.models.shared.audio_encoder import audio_windows
    from talkloop.pipeline.stages.context import AudioFeatureStage

    encoder = load_audio_encoder()
    clip = make_clip("train", 0, 0, render=False)
    whole = audio_features(clip.audio, clip.num_frames, clip.fps, encoder)  # (T, D)
    cfg = encoder.cfg
    windows = audio_windows(
        clip.audio,
        clip.num_frames,
        clip.fps,
        cfg.sample_rate,
        cfg.window_samples,
        cfg.lookahead_samples,
    ).numpy()
    modules = {"audio_encoder": Module("audio_encoder", cfg, encoder)}
    stage, norm, parts = AudioFeatureStage(), None, []
    for n in Timeline(ScheduleConfig(first_len=2, n_len=5, i_len=2)).n_chunks(clip.num_frames):
        work = {"audio_windows": windows[n.start : n.stop], "audio_norm": norm}
        stage.run(StageContext(stage, work, None, modules, frozenset()))
        norm = work["audio_norm"]
        parts.append(work["chunk_audio"])
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-5, atol=1e-5)


def test_batches_follow_the_three_mask_patterns(run) -> None:
    cfg, out = run
    data = _data(cfg, out)
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(60):
        b = sample_batch(data, cfg, g, load_motion(out).config)
        seen.add(b.pattern)
        front = int(b.mask[0].long().cumprod(0).sum())  # given frames in front
        if b.pattern == 0:
            assert not b.mask.any()
        elif b.pattern == 1:
            assert 1 <= front <= cfg.max_ctx and not b.mask[:, front:].any()
        else:
            assert front == 1 and b.mask[:, -1].all() and not b.mask[:, 1:-1].any()
        assert torch.equal(b.pos[0], torch.arange(b.mask.shape[1]) - float(front))
    assert seen == {0, 1, 2}


def test_cli_trains_the_portrait_family(tmp_path: Path, capsys) -> None:
    out = tmp_path / "w"
    code = main(
        [
            "train",
            "--family",
            "portrait",
            "--out",
            str(out),
            "--steps",
            "2",
            "--clips",
            "3",
            "--quiet",
        ]
    )
    assert code == 0
    assert "portrait motion weights" in capsys.readouterr().out
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps_done"] == 2 and summary["clips_used"] == 3
    load_motion(out)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--steps-a2v", "3"], "--steps-a2v"),
        (["--steps", "-1"], "--steps must be >= 0"),
        (["--clips", "0"], "--clips must be >= 1"),
        (["--festival-share", "1.5"], "--festival-share must be in"),
        (["--preset", "tiny"], "--preset"),
    ],
)
def test_cli_refuses_studio_options_and_bad_values(tmp_path: Path, extra, message) -> None:
    out = tmp_path / "w"
    with pytest.raises(ConfigError, match=message):
        from talkloop.pipeline.cli import build_parser
        from talkloop.pipeline.train.cli import cmd_train

        cmd_train(
            build_parser().parse_args(["train", "--family", "portrait", "--out", str(out), *extra])
        )
    assert not out.exists()
