"""Training smoke test: tiny preset, a handful of 64 px clips, a few steps of every phase."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.registry import build_pipeline
from talkloop.pipeline.models.studio.recipe import PHASES, TrainConfig
from talkloop.pipeline.models.studio.train import Trainer, train
from talkloop.pipeline.synth.dataset import make_clip, write_clip

from support import CollectSink, tiny_config

pytestmark = pytest.mark.unit  # ~5 s on an idle 2-core machine


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three tiny training clips on disk, with the index ``--data`` expects."""
    folder = tmp_path_factory.mktemp("clips")
    rows = []
    for i in range(3):
        clip = make_clip("train", i, 0, size=64)
        write_clip(clip, folder)
        rows.append(json.dumps({"clip_id": clip.clip_id, "prompt": clip.prompt}))
    (folder / "index.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def _recipe(**phase_steps: int) -> TrainConfig:
    cfg = TrainConfig.recipe("tiny")
    update = {p: getattr(cfg, p).model_copy(update={"steps": n}) for p, n in phase_steps.items()}
    return cfg.model_copy(update=update)


def test_every_phase_overfits_a_fixed_batch(clips: Path, tmp_path: Path) -> None:
    trainer = Trainer(_recipe(), tmp_path, data=clips, progress=False)
    trainer.prepare_pixels()
    curves = {"vae": trainer.overfit("vae", 30)}
    trainer.prepare_latents()
    for phase in PHASES[1:]:
        curves[phase] = trainer.overfit(phase, 30)
    for phase, losses in curves.items():
        assert all(np.isfinite(losses)), phase
        # The last few steps are clearly below the first: the phase learns its batch.
        assert np.mean(losses[-5:]) < 0.8 * losses[0], (phase, losses[0], losses[-5:])


def test_decoder_phase_trains_the_decoder_and_leaves_the_latents_alone(
    clips: Path, tmp_path: Path
) -> None:
    """The decoder phase may run on any finished weights: the encoder (so every latent the other
    networks learned on) must come out bit for bit the same, the decoder must change, and the
    phase's own batch size is the one used."""
    cfg = _recipe(decoder=6)
    cfg = cfg.model_copy(update={"decoder": cfg.decoder.model_copy(update={"batch": 3})})
    assert cfg.vae.batch != 3
    trainer = Trainer(cfg, tmp_path, data=clips, progress=False)
    trainer.prepare_pixels()
    trainer.prepare_latents()
    vae = trainer.nets["vae"]
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    calls: list[int] = []
    forward = vae.decoder.forward

    def spy(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return forward(x)

    vae.decoder.forward = spy
    trainer.run_phase("decoder", *trainer._phase("decoder"))
    assert calls == [3 * cfg.vae_decode_frames] * 6
    after = vae.state_dict()
    for key, value in before.items():
        if key.startswith("encoder."):
            assert torch.equal(after[key], value), key
    moved = [k for k in before if k.startswith("decoder.") and not torch.equal(after[k], before[k])]
    assert moved, "the decoder phase changed no decoder weight"
    assert all(p.grad is None for p in vae.encoder.parameters())


def test_resume_continues_the_same_run(clips: Path, tmp_path: Path) -> None:
    steps = {"vae": 12, "decoder": 3, "a2v": 8, "sr": 0, "readout": 0, "expression": 0, "mouth": 0}
    cfg = _recipe(**steps).model_copy(update={"checkpoint_every": 4})
    whole = train(cfg, tmp_path / "whole", data=clips, progress=False)

    broken = Trainer(cfg, tmp_path / "broken", data=clips, progress=False)

    def stop(phase: str, step: int) -> None:
        if phase == "a2v" and step == 5:  # after the step-4 checkpoint
            raise KeyboardInterrupt

    broken.on_step = stop
    with pytest.raises(KeyboardInterrupt):
        broken.run()
    resumed = Trainer(cfg, tmp_path / "broken", data=clips, resume=True, progress=False)
    assert resumed.done == ["vae", "decoder"] and resumed.resume_state is not None
    assert resumed.resume_state["step"] == 4
    resumed.run()
    for name in ("vae", "a2v", "audio_encoder"):
        a = load_file(str(whole / f"{name}.safetensors"))
        b = load_file(str(tmp_path / "broken" / f"{name}.safetensors"))
        for key in a:
            torch.testing.assert_close(a[key].float(), b[key].float(), atol=2e-3, rtol=1e-2)
    with pytest.raises(Exception, match="--resume"):
        Trainer(cfg, tmp_path / "broken", data=clips, progress=False)


def test_saved_weights_load_and_render(clips: Path, tmp_path: Path) -> None:
    out = train(
        _recipe(vae=10, decoder=10, a2v=10, sr=10, readout=10, expression=10, mouth=10),
        tmp_path / "w",
        data=clips,
        progress=False,
    )
    phases = list(PHASES)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["phases_done"] == phases
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert {row["phase"] for row in log} == set(phases)
    assert all(np.isfinite(row["loss"]) for row in log)

    from talkloop.pipeline.models.registry import load_modules

    config = tiny_config(model={"weights": str(out), "untrained": False})
    modules = load_modules(config)
    assert modules["vae"].config.latent_scale == pytest.approx(summary["latent_scale"])
    assert modules["vae"].config.latent_scale != 1.0  # set from the latent std
    clip = make_clip("test", 0, 0, size=64)
    sink = CollectSink()
    session = build_pipeline(config, modules).open_session(clip.reference, clip.prompt, [sink])
    session.render([clip.audio[:16000]])
    frames = sink.all_frames()
    assert frames.shape == (25, 64, 64, 3) and frames.dtype == np.uint8
    assert frames.std() > 1.0  # not a constant image


def test_a2v_prompts_redescribe_each_clips_style_with_training_phrases(
    clips: Path, tmp_path: Path
) -> None:
    """Variant 0 is the clip's own prompt; the others are fresh training-bank descriptions of the
    same style (so the model learns the words, not one sentence per clip)."""
    from talkloop.pipeline.models.studio.train import PROMPT_VARIANTS
    from talkloop.pipeline.synth.style import describe

    trainer = Trainer(_recipe(), tmp_path, data=clips, progress=False)
    trainer.prepare_pixels()
    seen: list[str] = []
    encode = trainer.nets["text_encoder"].encode

    def spy(texts: list[str]) -> torch.Tensor:
        seen.extend(texts)
        return encode(texts)

    trainer.nets["text_encoder"].encode = spy
    emb, has = trainer._text_embeddings(trainer.arrays)
    n = len(trainer.arrays)
    assert emb.shape == (n, PROMPT_VARIANTS, 384) and has.shape == (n, PROMPT_VARIANTS)
    for k, a in enumerate(trainer.arrays):
        mine = seen[k * PROMPT_VARIANTS : (k + 1) * PROMPT_VARIANTS]
        assert mine[0] == (a.prompt if a.prompt.strip() else "-")
        rng = np.random.default_rng([trainer.cfg.seed, k, 0x7E47])
        again = [describe(a.style, rng) for _ in range(PROMPT_VARIANTS - 1)]
        assert mine[1:] == [p if p.strip() else "-" for p in again]
        assert has[k].tolist() == [bool(p.strip()) for p in [a.prompt, *again]]
    assert len(set(seen)) > n  # the variants really differ from the clips' own prompts


def test_generated_clips_share_characters_so_the_face_does_not_tell_the_style(
    tmp_path: Path,
) -> None:
    """With every face in several clips (``clips_per_character``), only the prompt says which
    style a clip has; one clip per face would let a network memorise "this face smiles"."""
    from talkloop.pipeline.models.studio.data import clip_paths, ensure_dataset
    from talkloop.pipeline.synth.dataset import load_clip

    cfg = TrainConfig.recipe("tiny", clips=4, clips_per_character=4)
    assert cfg.characters == 1 and TrainConfig.recipe("default").characters == 100
    folder = ensure_dataset(tmp_path, cfg.clips, 64, 0, workers=1, characters=cfg.characters)
    loaded = [load_clip(p) for p in clip_paths(folder)]
    assert len({c.character.seed for c in loaded}) == 1
    assert len({c.style for c in loaded}) == 4
    # The finished folder is reused as it is, but never for another character pool.
    assert ensure_dataset(tmp_path, 4, 64, 0, workers=1, characters=1) == folder
    with pytest.raises(ConfigError, match="characters 1 .asked: 4."):
        ensure_dataset(tmp_path, 4, 64, 0, workers=1, characters=4)


def test_readout_renders_vary_the_smile_within_each_face() -> None:
    """The readout's smile target must not be readable from the face alone: within one character
    it varies frame by frame over most of [-1, 1]."""
    from talkloop.pipeline.models.studio.data import readout_renders

    first = list(readout_renders(3, 8, 64, seed=0))
    assert len(first) == 3
    for frames, targets, crop in first:
        assert frames.shape == (8, 64, 64, 3) and frames.dtype == np.uint8
        assert targets.shape == (8, 2) and crop.shape == (3,)
        smile = targets[:, 1]
        assert smile.min() >= -1.0 and smile.max() <= 1.0 and smile.std() > 0.25
    # Different faces, not one face repeated.
    assert not np.array_equal(first[0][0][0], first[1][0][0])


def test_expression_pairs_change_the_face_only_where_the_prompt_names_a_smile() -> None:
    """A prompt with smile words targets that smile; any other prompt (or none) targets the
    reference itself, so the net learns to leave a face alone when the prompt says nothing."""
    from talkloop.pipeline.models.studio.data import expression_pairs
    from talkloop.pipeline.synth.style import field_phrases

    smiling = field_phrases("smile", True, False)
    serious = field_phrases("smile", False, False)
    counts = {"smiling": 0, "serious": 0, "neither": 0}
    for ref, targets, prompts in expression_pairs(12, 4, 64, seed=0):
        assert ref.shape == (64, 64, 3) and targets.shape == (4, 64, 64, 3)
        assert len(prompts) == 4
        for target, prompt in zip(targets, prompts, strict=True):
            change = np.abs(target.astype(int) - ref).max()
            # Serious phrases first: "not smiling" contains "smiling".
            if any(w in prompt for w in serious):
                counts["serious"] += 1  # from a slight frown to the reference's own face
            elif any(w in prompt for w in smiling):
                counts["smiling"] += 1
                assert change > 20, prompt  # a smile is plain to see
            else:
                counts["neither"] += 1
                assert change == 0, prompt
    assert min(counts.values()) >= 5, counts


def test_mouth_pairs_differ_only_around_the_mouth() -> None:
    """The wrong frame is the right one with another mouth: same pose, eyes and background, the
    difference only around the mouth and jaw; a few pairs keep the right mouth."""
    from talkloop.pipeline.models.studio.data import mouth_pairs

    kept = moved = 0
    for pair in mouth_pairs(6, 8, 64, seed=0):
        assert pair.wrong.shape == pair.right.shape == (8, 64, 64, 3)
        assert pair.reference.shape == (64, 64, 3) and pair.shape.shape == (8, 6)
        assert pair.weights.shape == (8, 64, 64) and pair.weights.max() == 8.0
        diff = np.abs(pair.wrong.astype(int) - pair.right).max(axis=-1)  # (F, H, W)
        for f in range(8):
            if diff[f].max() == 0:
                kept += 1
                continue
            # Every visibly changed pixel is in the lower half of the face (lips, teeth, jaw).
            ys, xs = np.nonzero(diff[f] > 8)
            if not len(ys):  # pulled towards a shape much like its own
                continue
            moved += 1
            face = np.argwhere(pair.weights[f] >= 2.0)
            (y0, x0), (y1, x1) = face.min(axis=0), face.max(axis=0)
            assert ys.min() >= (y0 + y1) / 2 and ys.max() <= y1 + 1, f
            assert xs.min() >= x0 and xs.max() <= x1, f
    assert kept >= 1 and moved >= 30


def test_resume_of_a_checkpoint_from_before_the_expression_phase(
    clips: Path, tmp_path: Path
) -> None:
    """A checkpoint without expression weights resumes and trains that phase; one that claims the
    phase done without its weights is refused."""
    from talkloop.pipeline.core.errors import CheckpointError
    from talkloop.pipeline.models.studio.train import CHECKPOINT

    cfg = _recipe(vae=4, a2v=2, sr=2, readout=2, expression=3, mouth=2)
    trainer = Trainer(cfg, tmp_path / "w", data=clips, progress=False)
    trainer.prepare_pixels()
    trainer.run_phase("vae", *trainer._phase("vae"))
    path = tmp_path / "w" / "checkpoint" / CHECKPOINT
    state = torch.load(path, weights_only=False)
    del state["nets"]["expression"]
    torch.save(state, path)
    resumed = Trainer(cfg, tmp_path / "w", data=clips, resume=True, progress=False)
    assert resumed.done == ["vae"]
    resumed.run()
    assert "expression" in resumed.done
    assert (tmp_path / "w" / "expression.safetensors").is_file()

    state = torch.load(path, weights_only=False)
    del state["nets"]["expression"]
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="'expression' is done but its weights are missing"):
        Trainer(cfg, tmp_path / "w", data=clips, resume=True, progress=False)
