"""Synthetic clips: a character speaking one or two sentences, with exact per-frame ground truth.

``make_clip(split, index, seed)`` is a pure function of its arguments, so ``iter_clips`` can feed
a training loop on the fly and ``write_dataset`` can store the very same clips on disk. Audio is
float32 mono at 16 kHz; frame ``j`` covers the samples of ``talkloop.pipeline.core.clock``'s frame ``j``.
"""

from __future__ import annotations

import itertools
import json
import os
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from talkloop.pipeline.audio.espeak import Speech, speak
from talkloop.pipeline.audio.festival import festival_speak
from talkloop.pipeline.audio.io import load_audio, resample, write_wav
from talkloop.pipeline.core.clock import frame_at_sample, frames_for_samples
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS, FrameParams
from talkloop.pipeline.synth.augment import augment as augment_audio
from talkloop.pipeline.synth.augment import speed_perturb
from talkloop.pipeline.synth.character import Character, sample_character
from talkloop.pipeline.synth.motion import motion_params
from talkloop.pipeline.synth.renderer import Renderer
from talkloop.pipeline.synth.sentences import sentence_bank
from talkloop.pipeline.synth.splits import (
    SPLITS,
    character_seed,
    check_split,
    sentence_indices,
    voices,
)
from talkloop.pipeline.synth.style import STYLE_FIELDS, Style, describe, sample_style
from talkloop.pipeline.synth.visemes import is_vowel, mouth_tracks

SAMPLE_RATE = 16000
FORMAT_VERSION = 1
# Festival voices some training clips speak with (``festival_share``); never a test voice of
# talkloop's evaluation (tests/data/voices: Festival's kal and slt, flite's).
FESTIVAL_VOICES = ("ked_diphone",)


@dataclass
class Clip:
    """One training example. Arrays are per frame unless noted; boxes are pixels (x0, y0, x1, y1)."""

    clip_id: str
    split: str
    character: Character
    voice: str
    rate: int  # words per minute (espeak's; Festival's duration stretch is 175 / rate)
    sentences: list[str]
    sentence_ids: list[int]
    audio: np.ndarray  # (n,) float32 at sample_rate (augmented if augmentation was on)
    params: FrameParams  # (T, F)
    face_box: np.ndarray  # (T, 4) float32
    mouth_box: np.ndarray  # (T, 4) float32
    eye_box: np.ndarray  # (T, 2, 4) float32
    phonemes: list[str]
    phoneme_starts: np.ndarray  # (P,) int64 sample indices at sample_rate
    stress_frames: np.ndarray  # (S,) int64 frames of stressed vowels
    style: Style
    prompt: str
    fps: int
    sample_rate: int = SAMPLE_RATE
    frames: np.ndarray | None = None  # (T, H, W, 3) uint8; None when not rendered
    reference: np.ndarray | None = None  # (H, W, 3) uint8 neutral pose of the character
    augmentation: dict[str, float] = field(default_factory=dict)

    @property
    def num_frames(self) -> int:
        """T."""
        return len(self.params)


def _rng(split: str, index: int, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, SPLITS.index(split), index, 0xC11])


def _speech(
    texts: list[str], say: Callable[[str], Speech], rng: np.random.Generator
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Speak each text with ``say`` and join them with silences; timings in 16 kHz samples."""
    parts: list[np.ndarray] = [np.zeros(int(rng.uniform(0.15, 0.8) * SAMPLE_RATE), np.float32)]
    phonemes: list[str] = []
    starts: list[np.ndarray] = []
    offset = len(parts[0])
    for k, text in enumerate(texts):
        sp = say(text)
        audio = resample(sp.audio, sp.sample_rate, SAMPLE_RATE)
        st = np.floor(sp.starts * (len(audio) / max(1, len(sp.audio)))).astype(np.int64)
        parts.append(audio)
        phonemes += sp.phonemes
        starts.append(np.minimum(st, len(audio)) + offset)
        offset += len(audio)
        gap = rng.uniform(0.25, 1.0) if k + 1 < len(texts) else rng.uniform(0.2, 0.8)
        parts.append(np.zeros(int(gap * SAMPLE_RATE), np.float32))
        phonemes.append("_")  # the gap is a pause
        starts.append(np.array([offset], np.int64))
        offset += len(parts[-1])
    return np.concatenate(parts), phonemes, np.concatenate(starts)


def _stress_frames(phonemes: list[str], starts: np.ndarray, n: int, fps: int) -> np.ndarray:
    """Frames of stressed syllables: vowels clearly longer than the clip's median vowel."""
    ends = np.append(starts[1:], n)
    vowels = [(s, e - s) for p, s, e in zip(phonemes, starts, ends, strict=True) if is_vowel(p)]
    if not vowels:
        return np.zeros(0, np.int64)
    med = float(np.median([d for _, d in vowels]))
    picked = [s for s, d in vowels if d > 1.25 * med]
    return np.array([frame_at_sample(int(s), fps, SAMPLE_RATE) for s in picked], np.int64)


def make_clip(
    split: str,
    index: int,
    seed: int = 0,
    *,
    size: int | tuple[int, int] = 256,
    fps: int = 25,
    render: bool = True,
    augment: bool | None = None,
    characters: int | None = None,
    festival_share: float = 0.0,
) -> Clip:
    """Build clip ``index`` of ``split`` (deterministic in all arguments).

    Args:
        split: "train", "val" or "test": characters, sentences and voices come from that split.
        index: clip number; any int >= 0.
        seed: dataset seed (different seeds give different clip streams).
        size: frame side or (width, height).
        fps: video frame rate.
        render: draw the frames (False: parameters, boxes and audio only; much faster).
        augment: audio augmentation and speed perturbation; default on for train only.
        characters: draw characters from the first N seeds of the split (None: the whole range).
        festival_share: the share of clips a Festival diphone voice says (train split only:
            ``FESTIVAL_VOICES``; needs Debian's festival and the voices' packages), the rest
            espeak-ng. 0 draws nothing extra: the clips are those of before.

    Returns:
        The clip.
    """
    check_split(split)
    rng = _rng(split, index, seed)
    do_aug = (split == "train") if augment is None else augment
    k = int(rng.integers(characters if characters else 1 << 40))
    character = sample_character(character_seed(split, k))
    voice = str(rng.choice(voices(split)))
    rate = int(rng.integers(130, 231))
    pitch, prange = int(rng.integers(25, 76)), int(rng.integers(20, 81))
    pool = sentence_indices(split)
    ids = [int(i) for i in rng.choice(pool, size=1 if rng.random() < 0.65 else 2, replace=False)]
    texts = [sentence_bank()[i] for i in ids]
    if festival_share > 0.0 and split == "train" and rng.random() < festival_share:
        # A recorded speaker's diphones; its rate and intonation from the same draws.
        name = str(rng.choice(FESTIVAL_VOICES))
        voice = f"festival:{name}"

        def say(text: str) -> Speech:
            return festival_speak(text, name, 175 / rate, 65 + 1.3 * pitch, 5 + 0.3 * prange)
    else:

        def say(text: str) -> Speech:
            return speak(text, voice, rate, pitch, prange)

    audio, phonemes, starts = _speech(texts, say, rng)
    info: dict[str, float] = {}
    if do_aug and rng.random() < 0.5:
        info["speed"] = float(rng.uniform(0.9, 1.1))
        audio, starts = speed_perturb(audio, starts, SAMPLE_RATE, info["speed"])
    style = sample_style(rng)
    mouth = mouth_tracks(
        phonemes, starts, len(audio), SAMPLE_RATE, fps, articulation=0.75 + 0.45 * style.energy
    )
    stress = _stress_frames(phonemes, starts, len(audio), fps)
    params = motion_params(mouth, stress, style, fps, rng)
    prompt = describe(style, rng, held_out=split != "train")
    if do_aug and rng.random() < 0.85:
        audio, extra = augment_audio(audio, rng, SAMPLE_RATE)
        info.update(extra)
    renderer = Renderer(character, size)
    if render:
        out = renderer.render(params)
        frames, boxes = out.frames, (out.face_box, out.mouth_box, out.eye_box)
        reference = renderer.render_neutral()
    else:
        frames, reference, boxes = None, None, renderer.boxes(params)
    return Clip(
        clip_id=f"{split}-{seed}-{index:07d}",
        split=split,
        character=character,
        voice=voice,
        rate=rate,
        sentences=texts,
        sentence_ids=ids,
        audio=audio.astype(np.float32),
        params=params,
        face_box=boxes[0],
        mouth_box=boxes[1],
        eye_box=boxes[2],
        phonemes=phonemes,
        phoneme_starts=starts,
        stress_frames=stress,
        style=style,
        prompt=prompt,
        fps=fps,
        frames=frames,
        reference=reference,
        augmentation=info,
    )


def iter_clips(
    split: str, seed: int = 0, *, start: int = 0, count: int | None = None, **options: object
) -> Iterator[Clip]:
    """Clips ``start, start + 1, ...`` of ``split`` (endless when ``count`` is None).

    ``options`` are passed to ``make_clip`` (size, fps, render, augment, characters). For
    several data-loader workers, give each a disjoint ``start``/``count`` range or seed.
    """
    indices = itertools.count(start) if count is None else range(start, start + count)
    for index in indices:
        yield make_clip(split, index, seed, **options)  # type: ignore[arg-type]


def region_weights(clip: Clip, face: float = 2.0, mouth: float = 8.0) -> np.ndarray:
    """Per-pixel loss weights ``(T, H, W)`` float32: 1 outside, ``face`` in the face box,
    ``mouth`` in the mouth box (recommended starting point for reconstruction losses)."""
    if clip.frames is None:
        raise ValueError("region_weights needs a rendered clip (render=True)")
    t, h, w = clip.frames.shape[:3]
    return box_weights(clip.face_box, clip.mouth_box, h, w, face, mouth)


def box_weights(
    face_box: np.ndarray,
    mouth_box: np.ndarray,
    height: int,
    width: int,
    face: float = 2.0,
    mouth: float = 8.0,
) -> np.ndarray:
    """``region_weights`` from per-frame boxes ``(T, 4)`` (x0, y0, x1, y1) in pixels."""
    out = np.ones((face_box.shape[0], height, width), np.float32)
    ys, xs = np.arange(height)[None, :, None] + 0.5, np.arange(width)[None, None, :] + 0.5
    for box, value in ((face_box, face), (mouth_box, mouth)):
        x0, y0, x1, y1 = (box[:, i, None, None] for i in range(4))
        inside = (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)
        out = np.where(inside, np.maximum(out, value), out)
    return out


# -- on disk ------------------------------------------------------------------------------------


def write_clip(clip: Clip, folder: str | os.PathLike[str]) -> Path:
    """Write ``<id>.wav``, ``<id>.npz`` (frames and arrays) and ``<id>.json`` into ``folder``."""
    folder = Path(folder)
    base = folder / clip.clip_id
    write_wav(base.with_suffix(".wav"), clip.audio, clip.sample_rate)
    arrays: dict[str, np.ndarray] = {
        "params": clip.params.values,
        "face_box": clip.face_box,
        "mouth_box": clip.mouth_box,
        "eye_box": clip.eye_box,
        "phoneme_starts": clip.phoneme_starts,
        "stress_frames": clip.stress_frames,
        "style": clip.style.vector(),
    }
    if clip.frames is not None and clip.reference is not None:
        arrays["frames"] = clip.frames
        arrays["reference"] = clip.reference
    tmp = base.with_suffix(".tmp.npz")
    _savez_fast(tmp, arrays)
    tmp.replace(base.with_suffix(".npz"))
    meta = {
        "format": FORMAT_VERSION,
        "clip_id": clip.clip_id,
        "split": clip.split,
        "fps": clip.fps,
        "sample_rate": clip.sample_rate,
        "num_frames": clip.num_frames,
        "num_samples": int(len(clip.audio)),
        "param_fields": list(FRAME_FIELDS),
        "style_fields": list(STYLE_FIELDS),
        "style": clip.style.to_dict(),
        "prompt": clip.prompt,
        "voice": clip.voice,
        "rate": clip.rate,
        "sentences": clip.sentences,
        "sentence_ids": clip.sentence_ids,
        "phonemes": clip.phonemes,
        "augmentation": clip.augmentation,
        "character": clip.character.to_dict(),
    }
    base.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return base


def _savez_fast(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # np.savez_compressed uses zlib level 6: much slower than level 1 on flat cartoon frames for
    # a file barely smaller (docs/benchmarks.md, "Figures behind code choices"). np.load reads
    # either.
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, arr in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)


def load_clip(path: str | os.PathLike[str]) -> Clip:
    """Read a clip written by ``write_clip`` (``path`` with or without a suffix)."""
    base = Path(path)
    if base.suffix in (".json", ".npz", ".wav"):
        base = base.with_suffix("")
    meta = json.loads(base.with_suffix(".json").read_text())
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"{base}.json: format {meta.get('format')}, expected {FORMAT_VERSION}")
    with np.load(base.with_suffix(".npz")) as z:
        arrays = {k: z[k] for k in z.files}
    audio = load_audio(base.with_suffix(".wav"), meta["sample_rate"])
    ch = meta["character"]
    character = Character(**{k: tuple(v) if isinstance(v, list) else v for k, v in ch.items()})
    return Clip(
        clip_id=meta["clip_id"],
        split=meta["split"],
        character=character,
        voice=meta["voice"],
        rate=meta["rate"],
        sentences=meta["sentences"],
        sentence_ids=meta["sentence_ids"],
        audio=audio,
        params=FrameParams(arrays["params"]),
        face_box=arrays["face_box"],
        mouth_box=arrays["mouth_box"],
        eye_box=arrays["eye_box"],
        phonemes=meta["phonemes"],
        phoneme_starts=arrays["phoneme_starts"],
        stress_frames=arrays["stress_frames"],
        style=Style(**meta["style"]),
        prompt=meta["prompt"],
        fps=meta["fps"],
        sample_rate=meta["sample_rate"],
        frames=arrays.get("frames"),
        reference=arrays.get("reference"),
        augmentation=meta["augmentation"],
    )


def write_dataset(
    out: str | os.PathLike[str],
    split: str,
    clips: int,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    **options: object,
) -> Path:
    """Write ``clips`` clips of ``split`` to ``out/<split>/`` plus ``index.jsonl``.

    Returns:
        The split folder.
    """
    folder = Path(out) / check_split(split)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "index.jsonl", "w") as index:
        for k, clip in enumerate(iter_clips(split, seed, count=clips, **options)):
            write_clip(clip, folder)
            row = {
                "clip_id": clip.clip_id,
                "frames": clip.num_frames,
                "seconds": round(len(clip.audio) / clip.sample_rate, 3),
                "character": clip.character.seed,
                "voice": clip.voice,
                "sentence_ids": clip.sentence_ids,
                "prompt": clip.prompt,
            }
            index.write(json.dumps(row) + "\n")
            if progress is not None:
                progress(k + 1)
    return folder


def frames_for_clip(clip: Clip) -> int:
    """How many frames the clip's audio is shown as (the clock's rule; equals ``num_frames``)."""
    return frames_for_samples(len(clip.audio), clip.fps, clip.sample_rate)


__all__ = [
    "Clip",
    "make_clip",
    "iter_clips",
    "region_weights",
    "write_clip",
    "load_clip",
    "write_dataset",
    "frames_for_clip",
]
