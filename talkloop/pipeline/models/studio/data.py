"""Training data: studio clips on disk -> the arrays every phase samples from.

Clips are read once for the pixel phase (a bank of short frame windows for the VAE; the readout
renders its own frames) and once more after VAE training to encode every frame (A2V and SR train
on latents). Frames of whole clips never stay in memory: 400 clips at 256x256 would be ~13 GB.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.portrait.params import FrameParams
from talkloop.pipeline.models.shared.audio_encoder import audio_windows
from talkloop.pipeline.models.studio.mouth import MOUTH_FIELDS
from talkloop.pipeline.synth.character import Character, sample_character
from talkloop.pipeline.synth.dataset import (
    Clip,
    box_weights,
    load_clip,
    make_clip,
    region_weights,
    write_clip,
)
from talkloop.pipeline.synth.renderer import Renderer
from talkloop.pipeline.synth.splits import character_seed
from talkloop.pipeline.synth.style import (
    SMILE_RANGE,
    Style,
    describe,
    is_described,
    sample_style,
    smile_of_style,
)


def clip_paths(folder: Path) -> list[Path]:
    """Clip bases (no suffix) listed in ``folder/index.jsonl``, in index order."""
    index = folder / "index.jsonl"
    if not index.is_file():
        raise FileNotFoundError(f"{index} not found: write clips with `talkloop synth dataset`")
    rows = [json.loads(line) for line in index.read_text().splitlines() if line.strip()]
    return [folder / r["clip_id"] for r in rows]


def _write_one(job: tuple[str, int, int, int, str, int | None]) -> dict[str, object]:
    split, index, seed, size, folder, characters = job
    clip = make_clip(split, index, seed, size=size, characters=characters)
    write_clip(clip, folder)
    return {"clip_id": clip.clip_id, "frames": clip.num_frames, "prompt": clip.prompt}


def ensure_dataset(
    folder: Path,
    clips: int,
    size: int,
    seed: int,
    split: str = "train",
    workers: int = 2,
    progress: Callable[[int], None] | None = None,
    characters: int | None = None,
) -> Path:
    """Write ``clips`` clips of ``split`` to ``folder`` unless its index already lists them.

    ``characters`` limits the clips to the split's first N characters (see ``make_clip``).

    Clip generation is CPU-bound Python + espeak (docs/benchmarks.md, "Figures behind code
    choices"), so it runs in ``workers`` processes; the index is written last, so a half-written
    folder is redone.
    The parameters go to ``dataset.json``: a finished folder made with other ones is refused
    rather than trained on (e.g. a resumed run whose character pool changed).
    """
    folder.mkdir(parents=True, exist_ok=True)
    index, made_with = folder / "index.jsonl", folder / "dataset.json"
    params = {"split": split, "seed": seed, "size": size, "characters": characters}
    if index.is_file() and len(index.read_text().splitlines()) >= clips:
        old = json.loads(made_with.read_text()) if made_with.is_file() else params
        changed = [
            f"{k} {old.get(k)!r} (asked: {v!r})" for k, v in params.items() if old.get(k) != v
        ]
        if changed:
            raise ConfigError(
                f"{folder} already holds clips made with other settings: {', '.join(changed)}; "
                "use another --out folder"
            )
        return folder
    jobs = [(split, i, seed, size, str(folder), characters) for i in range(clips)]
    rows: list[dict[str, object]] = []
    if workers > 1:
        with mp.get_context("spawn").Pool(workers) as pool:
            for row in pool.imap(_write_one, jobs):
                rows.append(row)
                if progress:
                    progress(len(rows))
    else:
        for job in jobs:
            rows.append(_write_one(job))
            if progress:
                progress(len(rows))
    made_with.write_text(json.dumps(params) + "\n")
    index.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def neutral_boxes(character: Character, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Face and mouth boxes ``(4,)`` of the character's neutral pose (what the reference shows)."""
    face, mouth, _ = Renderer(character, size).boxes(FrameParams.neutral(1))
    return face[0], mouth[0]


def mouth_crop_box(face: np.ndarray, mouth: np.ndarray) -> np.ndarray:
    """Square crop ``(cx, cy, side)`` around the neutral mouth, wide enough for head motion."""
    cx, cy = (mouth[0] + mouth[2]) / 2, (mouth[1] + mouth[3]) / 2
    side = 0.75 * (face[2] - face[0])
    return np.array([cx, cy, side], np.float32)


def mouth_crop(character: Character, size: int) -> np.ndarray:
    """The readout's mouth crop ``(cx, cy, side)`` for frames of ``character`` at ``size`` px."""
    return mouth_crop_box(*neutral_boxes(character, size))


def _training_poses(
    k: int, frames: int, size: int, seed: int, salt: int
) -> tuple[Clip, np.random.Generator, FrameParams]:
    """Training clip ``k`` of the stream ``seed + salt`` (parameters only, no audio
    augmentation), a generator for further draws and ``frames`` of its frames' parameters."""
    clip = make_clip("train", k, seed + salt, size=size, render=False, augment=False)
    rng = np.random.default_rng([seed, k, salt])
    n = min(frames, clip.num_frames)
    take = np.sort(rng.choice(clip.num_frames, size=n, replace=False))
    return clip, rng, FrameParams(clip.params.values[take].copy())


def readout_renders(
    count: int, frames_per_clip: int, size: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Frames for training the readout: ``count`` training-split characters, posed and lit as in
    training clips, but with the smile drawn per frame, uniform in [-1, 1].

    In a clip the smile is one style for the whole clip and every character shows few clips, so a
    readout trained on clip frames learns which face it sees, not how much it smiles (on held-out
    faces its smile output barely followed the rendered smile, sometimes the wrong way). Here the
    smile is independent of face, pose and mouth, so the only way to predict it is to read it.

    Yields, per character: frames ``(F, H, W, 3)`` uint8, targets ``(F, 2)`` float32
    ``[mouth_open, smile]`` and the mouth crop ``(3,)``.
    """
    for k in range(count):
        clip, rng, params = _training_poses(k, frames_per_clip, size, seed, 0x5E11E)
        params["smile"] = rng.uniform(-1.0, 1.0, size=len(params)).astype(np.float32)
        frames = Renderer(clip.character, size).render(params).frames
        targets = np.stack([params["mouth_open"], params["smile"]], axis=1).astype(np.float32)
        yield frames, targets, mouth_crop(clip.character, size)


def expression_pairs(
    count: int, styles_per_character: int, size: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray, list[str]]]:
    """Training pairs for the expression net: a face's reference and the same face as a prompt
    describes it.

    Per training-split character: its neutral reference, and for each of ``styles_per_character``
    random styles a training prompt and the neutral pose rendered with that style's smile. A
    prompt that does not put the smile into words (or is empty) targets the reference itself:
    then the net must leave the face as it is.

    Yields, per character: the reference ``(H, W, 3)`` uint8, targets ``(S, H, W, 3)`` uint8 and
    the S prompts.
    """
    for k in range(count):
        rng = np.random.default_rng([seed, k, 0xE4B8E])
        character = sample_character(character_seed("train", int(rng.integers(1 << 40))))
        smiles = np.zeros(styles_per_character + 1, np.float32)
        prompts = []
        for j in range(styles_per_character):
            style = sample_style(rng)
            prompt = describe(style, rng)
            if prompt and is_described(style.smile):
                smiles[j + 1] = np.clip(smile_of_style(style.smile), *SMILE_RANGE)
            prompts.append(prompt)
        params = FrameParams.from_tracks(len(smiles), smile=smiles)
        frames = Renderer(character, size).render(params).frames
        yield frames[0], frames[1:], prompts


def mouth_shape(params: FrameParams) -> np.ndarray:
    """(T, len(MOUTH_FIELDS)) float32: the mouth part of per-frame parameters."""
    return np.stack([params[f] for f in MOUTH_FIELDS], axis=1).astype(np.float32)


@dataclass
class MouthPairs:
    """One character's frames for the mouth editor: the same poses with a wrong and the right
    mouth."""

    reference: np.ndarray  # (H, W, 3) uint8 neutral reference
    wrong: np.ndarray  # (F, H, W, 3) uint8 frames with an altered mouth
    right: np.ndarray  # (F, H, W, 3) uint8 the same frames with the clip's mouth
    shape: np.ndarray  # (F, len(MOUTH_FIELDS)) float32 the right mouth's shape
    weights: np.ndarray  # (F, H, W) float32 region weights of the right frames (face 2, mouth 8)


def mouth_pairs(
    count: int, frames_per_character: int, size: int, seed: int
) -> Iterator[MouthPairs]:
    """Training pairs for the mouth editor, ``count`` training-split characters.

    Poses, expressions and mouths come from a generated training clip of each character. The
    wrong mouth imitates what the A2V makes: the right shape pulled part of the way towards
    another frame's shape or a closed mouth (how far is uniform in [0.2, 1]); one frame in eight
    keeps the right mouth, so a mouth that is already right stays as it is.
    """
    for k in range(count):
        clip, rng, right = _training_poses(k, frames_per_character, size, seed, 0x3007)
        n = len(right)
        target = mouth_shape(right)  # (F, M)
        others = mouth_shape(clip.params)[rng.integers(clip.num_frames, size=n)]  # (F, M)
        others[rng.random(n) < 0.4] = 0.0  # closed
        pull = rng.uniform(0.2, 1.0, size=(n, 1)).astype(np.float32)
        pull[rng.random(n) < 0.125] = 0.0
        wrong = FrameParams(right.values.copy())
        for j, field in enumerate(MOUTH_FIELDS):
            wrong[field] = (1 - pull[:, 0]) * target[:, j] + pull[:, 0] * others[:, j]
        renderer = Renderer(clip.character, size)
        out = renderer.render(right)
        weights = box_weights(out.face_box, out.mouth_box, *out.frames.shape[1:3])
        yield MouthPairs(
            reference=renderer.render_neutral(),
            wrong=renderer.render(wrong).frames,
            right=out.frames,
            shape=target,
            weights=weights,
        )


@dataclass
class ClipArrays:
    """One clip reduced to what the latent phases sample from (all per frame, T frames)."""

    clip_id: str
    mel: Tensor  # (T, n_mels, n_steps) float32, streaming-normalised from the clip start
    prompt: str
    style: Style  # what the prompt describes (training re-describes it with other phrases)
    crop: np.ndarray  # (3,) mouth crop (cx, cy, side) in pixels
    weights_lr: Tensor  # (T, 1, h, w) float16 region weights at latent resolution
    mouth: Tensor  # (T, len(MOUTH_FIELDS)) float32 rendered mouth shape (the mouth head's target)
    latents: Tensor | None = None  # (T, C, h, w) float16 scaled VAE latents
    ref_latent: Tensor | None = None  # (C, h, w) float32 scaled latent of the reference

    @property
    def num_frames(self) -> int:
        return int(self.mel.shape[0])


@dataclass
class PixelBank:
    """Short windows of consecutive frames for the VAE (the readout has its own renders)."""

    frames: Tensor  # (N, W, H, W, 3) uint8
    weights: Tensor  # (N, W, H, W) uint8 region weights (1, 2, 8)
    crop: Tensor  # (N, 3) mouth crop (cx, cy, side)


def clip_arrays(clip: Clip, encoder: torch.nn.Module, latent_factor: int) -> ClipArrays:
    """Audio features, labels and latent-resolution weights of a rendered clip."""
    cfg = encoder.cfg
    t = clip.num_frames
    win = audio_windows(
        clip.audio, t, clip.fps, clip.sample_rate, cfg.window_samples, cfg.lookahead_samples
    )
    with torch.no_grad():
        mel = encoder.log_mel(win)
        mel, _ = encoder.normalise(mel, encoder.init_norm_state())
    w = torch.from_numpy(region_weights(clip))[:, None]  # (T, 1, H, W)
    w_lr = F.avg_pool2d(w, latent_factor).half()  # (T, 1, h, w)
    size = clip.frames.shape[1]
    return ClipArrays(
        clip_id=clip.clip_id,
        mel=mel,
        prompt=clip.prompt,
        style=clip.style,
        crop=mouth_crop(clip.character, size),
        weights_lr=w_lr,
        mouth=torch.from_numpy(mouth_shape(clip.params)),
    )


def sample_windows(clip: Clip, count: int, length: int, rng: np.random.Generator) -> list[int]:
    """Start frames of ``count`` windows of ``length`` consecutive frames (spread over the clip)."""
    last = max(0, clip.num_frames - length)
    return sorted(int(s) for s in rng.integers(0, last + 1, size=count))


def load_all(
    paths: list[Path],
    encoder: torch.nn.Module,
    latent_factor: int,
    windows_per_clip: int,
    window_len: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[ClipArrays], PixelBank]:
    """First pass over the clips: per-clip arrays plus the pixel bank (deterministic in seed)."""
    arrays: list[ClipArrays] = []
    frames, weights, crops = [], [], []
    for k, path in enumerate(paths):
        clip = load_clip(path)
        if clip.frames is None:
            raise ValueError(f"{path}: clip has no frames (written with render=False?)")
        a = clip_arrays(clip, encoder, latent_factor)
        arrays.append(a)
        rng = np.random.default_rng([seed, k, 0xBA4C])
        rw = region_weights(clip).astype(np.uint8)
        for s in sample_windows(clip, windows_per_clip, window_len, rng):
            sl = slice(s, s + window_len)
            frames.append(torch.from_numpy(clip.frames[sl].copy()))
            weights.append(torch.from_numpy(rw[sl].copy()))
            crops.append(torch.from_numpy(a.crop))
        if progress:
            progress(k + 1)
    bank = PixelBank(
        frames=torch.stack(frames),
        weights=torch.stack(weights),
        crop=torch.stack(crops),
    )
    return arrays, bank


def to_images(frames_uint8: Tensor) -> Tensor:
    """(..., H, W, 3) uint8 -> (N, 3, H, W) float32 in [-1, 1]."""
    x = frames_uint8.reshape(-1, *frames_uint8.shape[-3:]).permute(0, 3, 1, 2).float()
    return x / 127.5 - 1.0


@torch.no_grad()
def encode_clips(
    paths: list[Path],
    arrays: list[ClipArrays],
    vae: torch.nn.Module,
    batch: int = 32,
    bf16: bool = False,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Second pass: scaled VAE latents of every frame and of the reference, stored fp16
    (computed under bf16 autocast when ``bf16``)."""
    for k, (path, a) in enumerate(zip(paths, arrays, strict=True)):
        clip = load_clip(path)
        frames = torch.from_numpy(clip.frames)
        zs = []
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for s in range(0, frames.shape[0], batch):
                zs.append(vae.encode(to_images(frames[s : s + batch])).float())
            ref = vae.encode(to_images(torch.from_numpy(clip.reference)[None])).float()
        a.latents = torch.cat(zs).half().contiguous()  # (T, C, h, w)
        a.ref_latent = ref[0].contiguous()
        if progress:
            progress(k + 1)


def latent_cache_state(arrays: list[ClipArrays]) -> dict[str, Tensor]:
    """Latents of every clip as a flat dict (saved next to checkpoints for resume)."""
    out: dict[str, Tensor] = {}
    for a in arrays:
        assert a.latents is not None and a.ref_latent is not None  # set by encode_clips
        out[f"{a.clip_id}/latents"] = a.latents
        out[f"{a.clip_id}/ref"] = a.ref_latent
    return out


def restore_latents(arrays: list[ClipArrays], state: dict[str, Tensor]) -> bool:
    """Fill latents from a cache; False if any clip is missing (then re-encode)."""
    if not all(f"{a.clip_id}/latents" in state for a in arrays):
        return False
    for a in arrays:
        a.latents, a.ref_latent = state[f"{a.clip_id}/latents"], state[f"{a.clip_id}/ref"]
    return True
