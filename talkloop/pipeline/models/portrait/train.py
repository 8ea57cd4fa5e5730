"""Training of the portrait motion generator (``talkloop train --family portrait``).

Data: synthetic clips without pixels (``make_clip(..., render=False)``): their audio (train split:
with its augmentation) becomes per-frame features through the shipped (frozen) audio encoder,
frozen, exactly as ``AudioFeatureStage`` computes them at inference; their parameters are the
exact per-frame ground truth; their style is described by several training prompts (MiniLM).
These arrays are cached in one ``.npz`` so a rerun skips espeak.

Recipe: rectified flow on normalised parameters with the three mask patterns of the A2V
(first chunk, continuation after 1..ctx given frames, I chunk between two anchors), audio and
text dropout for the null embeddings, light noise on given frames, a per-field loss weight that
puts the mouth first, AdamW with warm-up and cosine decay, an EMA of the weights (exported).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import ConfigDict, Field, model_validator
from torch import Tensor

from talkloop.pipeline.console import progress_bar
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.models.portrait import SPEC
from talkloop.pipeline.models.portrait.motion import MODULE_NAME, PortraitMotionConfig, build_motion
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS
from talkloop.pipeline.models.shared.audio_encoder import (
    AudioEncoder,
    AudioEncoderConfig,
    audio_windows,
)
from talkloop.pipeline.models.shared.sampling import MaskRecipe, flow_matching_loss
from talkloop.pipeline.models.shared.text_encoder import TextEncoder, TextEncoderConfig
from talkloop.pipeline.synth.dataset import make_clip
from talkloop.pipeline.synth.style import describe
from talkloop.pipeline.train.schedule import warmup_cosine

# Frozen modules the portrait folder carries along: the shared audio and text encoders, taken
# from the installed portrait weights (they are the encoders every family ships).
FROZEN_FROM = SPEC.weights
FROZEN_MODULES = ("audio_encoder", "text_encoder")
DATA_FORMAT = 1


class MotionTrainConfig(MaskRecipe):
    """The recipe of the motion generator (network sizes in ``model``)."""

    model_config = ConfigDict(extra="forbid")

    model: PortraitMotionConfig = PortraitMotionConfig()
    clips: int = Field(3000, ge=1, description="training clips (synthetic train split)")
    festival_share: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="share of training clips a Festival diphone voice says instead of espeak-ng "
        "(``make_clip``; needs Debian's festival and festvox-kdlpc16k)",
    )
    val_clips: int = Field(48, ge=0, description="validation clips for the logged val loss")
    seed: int = Field(0, ge=0)
    steps: int = Field(16000, ge=0, le=10_000_000)
    minutes: float | None = Field(None, gt=0.0, description="wall-clock budget of the steps")
    batch_frames: int = Field(256, ge=8, description="frames (given + generated) per step")
    lr: float = Field(1e-3, gt=0.0, le=1.0)
    warmup: int = Field(300, ge=0)
    final_frac: float = Field(0.05, ge=0.0, le=1.0)
    weight_decay: float = Field(0.01, ge=0.0)
    clip_grad: float = Field(1.0, gt=0.0)
    ema: float = Field(0.999, ge=0.0, lt=1.0, description="EMA decay of the exported weights")
    audio_drop: float = Field(0.1, ge=0.0, le=1.0)
    text_drop: float = Field(0.15, ge=0.0, le=1.0)
    prompt_variants: int = Field(8, ge=1, le=64, description="training prompts per clip")
    field_weights: dict[str, float] = Field(
        default_factory=lambda: {
            "mouth_open": 4.0,
            "jaw": 2.0,
            "mouth_width": 2.0,
            "mouth_round": 2.0,
            "teeth": 2.0,
        },
        description="loss weight per field (others 1): the mouth matters most",
    )
    log_every: int = Field(50, ge=1)
    val_every: int = Field(1000, ge=1)
    threads: int = Field(
        1, ge=1, le=256, description="torch CPU threads (1: small matmuls, shared cores)"
    )

    @model_validator(mode="after")
    def _check(self) -> MotionTrainConfig:
        unknown = sorted(set(self.field_weights) - set(FRAME_FIELDS))
        if unknown:
            raise ValueError(f"field_weights names unknown fields {unknown}; known: {FRAME_FIELDS}")
        if any(w < 0 for w in self.field_weights.values()):
            raise ValueError(f"field_weights must be >= 0, got {self.field_weights}")
        if self.p_first + self.p_interp > 1.0:
            raise ValueError(f"p_first + p_interp must be <= 1, got {self.p_first + self.p_interp}")
        if self.max_frames > self.model.max_frames:
            raise ValueError(
                f"a step may hold {self.max_frames} frames but the model takes at most "
                f"max_frames={self.model.max_frames}"
            )
        return self

    @property
    def max_frames(self) -> int:
        """Most frames one training sequence holds."""
        return max(self.max_ctx + self.max_gen, self.max_interior + 2)

    @classmethod
    def tiny(cls, **overrides: object) -> MotionTrainConfig:
        """Smoke-test recipe: a tiny net, a handful of clips, a few steps."""
        base = cls(
            model=PortraitMotionConfig.tiny(),
            clips=6,
            val_clips=2,
            steps=20,
            batch_frames=96,
            lr=3e-3,
            warmup=0,
            max_gen=8,
            max_interior=2,
            prompt_variants=2,
            log_every=5,
            val_every=10,
            threads=1,
        )
        return base.model_copy(update=overrides) if overrides else base

    def loss_weights(self) -> Tensor:
        """(1, 1, 16, 1, 1) per-field weights for ``flow_matching_loss``."""
        w = torch.tensor([self.field_weights.get(f, 1.0) for f in FRAME_FIELDS])
        return w.view(1, 1, -1, 1, 1)


# -- data -----------------------------------------------------------------------------------------


@dataclass
class MotionData:
    """Clips reduced to what training samples from; frames of all clips are concatenated."""

    features: Tensor  # (N, D_audio) float32 audio features, N = total frames
    params: Tensor  # (N, 16) float32 raw parameters
    starts: np.ndarray  # (C + 1,) int64: clip c has frames [starts[c], starts[c + 1])
    text: Tensor  # (C, K, 384) float32 prompt embeddings (variant 0: the clip's own prompt)
    has_text: Tensor  # (C, K) bool: False where the prompt is empty (null embedding)

    @property
    def num_clips(self) -> int:
        return len(self.starts) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)


def load_audio_encoder(folder: Path = FROZEN_FROM) -> AudioEncoder:
    """The shipped audio encoder, frozen."""
    cfg = AudioEncoderConfig.model_validate_json((folder / "audio_encoder.json").read_text())
    module = Module("audio_encoder", cfg, AudioEncoder(cfg))
    module.load(folder)
    return module.net


@torch.no_grad()
def audio_features(audio: np.ndarray, frames: int, fps: int, encoder: AudioEncoder) -> Tensor:
    """(frames, D) features of a whole clip, as ``AudioFeatureStage`` computes them chunk by chunk
    (one window per frame ending the look-ahead after it; normalisation from a fresh state)."""
    cfg = encoder.cfg
    win = audio_windows(
        audio, frames, fps, cfg.sample_rate, cfg.window_samples, cfg.lookahead_samples
    )
    mel = encoder.log_mel(win)
    mel, _ = encoder.normalise(mel, encoder.init_norm_state())
    return encoder(mel).float()


def build_data(
    split: str,
    count: int,
    seed: int,
    variants: int,
    encoder: AudioEncoder,
    text_encoder: TextEncoder,
    min_frames: int = 1,
    progress: bool = True,
    festival_share: float = 0.0,
) -> MotionData:
    """Generate ``count`` clips of ``split`` and reduce them to training arrays.

    Variant 0 of the prompts is the clip's own; the others describe its style with freshly drawn
    phrases of the same bank (train or held-out), so the words, not one sentence, carry it.
    Clips shorter than ``min_frames`` are skipped; ``festival_share`` goes to ``make_clip``.
    """
    feats, params, lengths, prompts = [], [], [], []
    for index in progress_bar(range(count), desc=f"{split} clips", enabled=progress):
        clip = make_clip(split, index, seed, render=False, festival_share=festival_share)
        if clip.num_frames < min_frames:
            continue
        feats.append(audio_features(clip.audio, clip.num_frames, clip.fps, encoder).half())
        params.append(torch.from_numpy(clip.params.values.copy()))
        lengths.append(clip.num_frames)
        rng = np.random.default_rng([seed, index, 0x9A7])
        held_out = split != "train"
        prompts.append(
            [clip.prompt] + [describe(clip.style, rng, held_out) for _ in range(variants - 1)]
        )
    flat = [p for ps in prompts for p in ps]
    unique = sorted(set(p for p in flat if p.strip()))
    table = {p: i for i, p in enumerate(unique)}
    emb = text_encoder.encode(unique) if unique else torch.zeros(0, text_encoder.cfg.dim)
    text = torch.zeros(len(flat), text_encoder.cfg.dim)
    has = torch.tensor([bool(p.strip()) for p in flat])
    for i, p in enumerate(flat):
        if p.strip():
            text[i] = emb[table[p]]
    return MotionData(
        features=torch.cat(feats).float(),
        params=torch.cat(params).float(),
        starts=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        text=text.view(len(prompts), variants, -1),
        has_text=has.view(len(prompts), variants),
    )


def save_data(data: MotionData, path: Path, meta: dict) -> None:
    """Write the arrays (features fp16) and what they were made with to one ``.npz``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(
        tmp,
        features=data.features.half().numpy(),
        params=data.params.numpy(),
        starts=data.starts,
        text=data.text.half().numpy(),
        has_text=data.has_text.numpy(),
        meta=np.array(json.dumps({**meta, "format": DATA_FORMAT})),
    )
    tmp.replace(path)


def load_data(path: Path, meta: dict) -> MotionData | None:
    """The cached arrays at ``path`` if they were made with ``meta``; None otherwise."""
    if not path.is_file():
        return None
    with np.load(path) as z:
        if json.loads(str(z["meta"])) != {**meta, "format": DATA_FORMAT}:
            return None
        return MotionData(
            features=torch.from_numpy(z["features"]).float(),
            params=torch.from_numpy(z["params"]).float(),
            starts=z["starts"].astype(np.int64),
            text=torch.from_numpy(z["text"]).float(),
            has_text=torch.from_numpy(z["has_text"]),
        )


def cached_data(
    cache: Path,
    split: str,
    count: int,
    seed: int,
    variants: int,
    encoder: AudioEncoder,
    text_encoder: TextEncoder,
    min_frames: int,
    progress: bool,
    festival_share: float = 0.0,
) -> MotionData:
    """:func:`build_data` through an ``.npz`` cache (rebuilt when made with other settings)."""
    meta = {
        "split": split,
        "count": count,
        "seed": seed,
        "variants": variants,
        "min_frames": min_frames,
        "festival_share": festival_share,
    }
    data = load_data(cache, meta)
    if data is None:
        data = build_data(
            split,
            count,
            seed,
            variants,
            encoder,
            text_encoder,
            min_frames,
            progress,
            festival_share,
        )
        save_data(data, cache, meta)
    return data


def field_stats(params: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-field mean and std ``(16,)`` of raw parameters ``(N, 16)``."""
    p = params.double()
    return p.mean(0).numpy(), p.std(0).numpy()


# -- one step -------------------------------------------------------------------------------------


@dataclass
class Batch:
    """One training (or validation) batch in the A2V's terms."""

    x0: Tensor  # (B, F, 16, 1, 1) normalised parameters
    mask: Tensor  # (B, F) bool: given frames
    pos: Tensor  # (B, F) frame positions (given context negative)
    audio: Tensor  # (B, F, D_audio)
    text: Tensor  # (B, 384)
    has_text: Tensor  # (B,) bool
    pattern: int  # 0: first chunk, 1: continuation, 2: I chunk


def sample_batch(
    data: MotionData, cfg: MotionTrainConfig, g: torch.Generator, model: PortraitMotionConfig
) -> Batch:
    """Draw a mask pattern, its lengths, then clips, windows and prompt variants."""

    def randint(low: int, high: int) -> int:  # inclusive
        return int(torch.randint(low, high + 1, (1,), generator=g))

    u = float(torch.rand(1, generator=g))
    if u < cfg.p_first:
        pattern, front, f = 0, 0, randint(2, cfg.max_gen)
    elif u < cfg.p_first + cfg.p_interp:
        pattern, front = 2, 1
        f = randint(1, cfg.max_interior) + 2
    else:
        pattern, front = 1, randint(1, cfg.max_ctx)
        f = front + randint(2, cfg.max_gen)
    b = max(1, cfg.batch_frames // f)
    lengths = data.lengths()
    ok = np.flatnonzero(lengths >= f)
    clips = ok[torch.randint(len(ok), (b,), generator=g).numpy()]
    starts = []
    for c in clips:
        last = int(lengths[c]) - f
        s = randint(0, last)
        if pattern == 0 and float(torch.rand(1, generator=g)) < 0.5:
            s = 0  # the real first chunk starts the stream (fresh audio normalisation, silence)
        starts.append(int(data.starts[c]) + s)
    idx = torch.tensor(starts)[:, None] + torch.arange(f)[None]  # (B, F)
    mask = torch.zeros(b, f, dtype=torch.bool)
    mask[:, :front] = True
    if pattern == 2:
        mask[:, -1] = True
    variant = torch.randint(data.text.shape[1], (b,), generator=g)
    ct = torch.from_numpy(clips)
    return Batch(
        x0=model.normalise(data.params[idx]),
        mask=mask,
        pos=(torch.arange(f, dtype=torch.float32)[None] - front).expand(b, f).contiguous(),
        audio=data.features[idx],
        text=data.text[ct, variant],
        has_text=data.has_text[ct, variant],
        pattern=pattern,
    )


def batch_loss(
    net: torch.nn.Module,
    batch: Batch,
    cfg: MotionTrainConfig,
    g: torch.Generator,
    dropout: bool = True,
) -> Tensor:
    """Weighted flow-matching loss of one batch (no dropout for validation)."""
    b = batch.x0.shape[0]
    ref = net.cfg.rest_latent().expand(b, -1, -1, -1)  # (B, 16, 1, 1) neutral rest
    return flow_matching_loss(
        net,
        batch.x0,
        batch.mask,
        batch.pos,
        ref,
        batch.audio,
        batch.text,
        g,
        given_noise_max=cfg.given_noise_max,
        audio_drop_prob=cfg.audio_drop if dropout else 0.0,
        text_drop_prob=cfg.text_drop if dropout else 0.0,
        text_present=batch.has_text,
        weight=cfg.loss_weights(),
    )


@torch.no_grad()
def validation_loss(
    net: torch.nn.Module, data: MotionData, cfg: MotionTrainConfig, batches: int = 12
) -> float:
    """Mean loss over a fixed set of batches and noise draws (comparable across steps)."""
    g = torch.Generator().manual_seed(cfg.seed + 0x7A1)
    losses = [
        float(batch_loss(net, sample_batch(data, cfg, g, net.cfg), cfg, g, dropout=False))
        for _ in range(batches)
    ]
    return float(np.mean(losses))


# -- the run --------------------------------------------------------------------------------------


class MotionTrainer:
    """One training run into ``out``: ``a2v.*`` (the motion net, EMA weights), the frozen
    ``audio_encoder.*`` and ``text_encoder.*``, ``train_log.jsonl`` and ``train_summary.json``.

    Args:
        cfg: the recipe.
        out: output folder (created; must not hold a previous run's ``a2v.safetensors``).
        cache: ``.npz`` of the training arrays (default ``out/motion_data.npz``).
        progress: progress bars.
    """

    def __init__(
        self, cfg: MotionTrainConfig, out: Path, cache: Path | None = None, progress: bool = True
    ) -> None:
        self.cfg, self.out, self.progress = cfg, Path(out), progress
        if (self.out / f"{MODULE_NAME}.safetensors").is_file():
            raise ConfigError(
                f"{self.out} already holds motion weights; choose an empty --out folder"
            )
        self.cache = Path(cache) if cache is not None else self.out / "motion_data.npz"
        self.log_path = self.out / "train_log.jsonl"
        # Called with the step number after every optimiser step (tests stop a run with it).
        self.on_step: Callable[[int], None] | None = None

    def _log(self, row: dict) -> None:
        with open(self.log_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def data(self) -> tuple[MotionData, MotionData | None]:
        cfg = self.cfg
        encoder = load_audio_encoder()
        text_encoder = TextEncoder(TextEncoderConfig())
        args = (encoder, text_encoder, cfg.max_frames, self.progress)
        train = cached_data(
            self.cache, "train", cfg.clips, cfg.seed, cfg.prompt_variants, *args, cfg.festival_share
        )
        val = None
        if cfg.val_clips:
            val_cache = self.cache.with_name(self.cache.stem + "_val.npz")
            val = cached_data(val_cache, "val", cfg.val_clips, cfg.seed, 1, *args)
        return train, val

    def run(self) -> Path:
        cfg = self.cfg
        torch.set_num_threads(cfg.threads)
        self.out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        train, val = self.data()
        data_seconds = time.perf_counter() - t0
        mean, std = field_stats(train.params)
        model_cfg = cfg.model.with_stats(mean, std)
        torch.manual_seed(cfg.seed)  # network init is part of the seeded run
        net = build_motion(model_cfg).net.train().requires_grad_(True)
        ema = build_motion(model_cfg).net
        ema.load_state_dict(net.state_dict())
        params = [p for p in net.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        g = torch.Generator().manual_seed(cfg.seed + 1)
        self.log_path.write_text("")
        self._log(
            {
                "event": "data",
                "clips": train.num_clips,
                "frames": int(train.starts[-1]),
                "val_clips": 0 if val is None else val.num_clips,
                "seconds": data_seconds,
            }
        )
        budget = None if cfg.minutes is None else cfg.minutes * 60.0
        t_train = time.perf_counter()
        loss_ema, step, first_loss = None, 0, None
        val_losses: list[tuple[int, float]] = []
        bar = progress_bar(
            total=cfg.steps, desc="motion", enabled=self.progress, dynamic_ncols=True
        )
        while step < cfg.steps:
            used = 0.0 if budget is None else (time.perf_counter() - t_train) / budget
            if used >= 1.0:
                break
            for group in opt.param_groups:
                group["lr"] = warmup_cosine(
                    step, cfg.steps, cfg.lr, cfg.warmup, cfg.final_frac, used
                )
            batch = sample_batch(train, cfg, g, model_cfg)
            loss = batch_loss(net, batch, cfg, g)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad)
            opt.step()
            with torch.no_grad():
                decay = min(cfg.ema, (1 + step) / (10 + step))
                for pe, p in zip(ema.parameters(), net.parameters(), strict=True):
                    pe.lerp_(p, 1.0 - decay)
            value = float(loss.detach())
            first_loss = value if first_loss is None else first_loss
            loss_ema = value if loss_ema is None else 0.98 * loss_ema + 0.02 * value
            step += 1
            bar.update(1)
            if step % cfg.log_every == 0 or step == cfg.steps:
                self._log(
                    {
                        "step": step,
                        "loss": value,
                        "loss_ema": loss_ema,
                        "lr": opt.param_groups[0]["lr"],
                        "pattern": batch.pattern,
                        "frames": int(batch.x0.shape[1]),
                        "batch": int(batch.x0.shape[0]),
                        "seconds": time.perf_counter() - t_train,
                    }
                )
                bar.set_postfix(loss=f"{loss_ema:.4f}")
            if val is not None and (step % cfg.val_every == 0 or step == cfg.steps):
                vl = validation_loss(ema, val, cfg)
                val_losses.append((step, vl))
                self._log({"step": step, "val_loss_ema_weights": vl})
            if self.on_step is not None:
                self.on_step(step)
        bar.close()
        train_seconds = time.perf_counter() - t_train
        if val is not None and (not val_losses or val_losses[-1][0] != step):
            val_losses.append((step, validation_loss(ema, val, cfg)))
        Module(MODULE_NAME, model_cfg, ema).save(self.out, dtype=torch.float16)
        for name in FROZEN_MODULES:
            for suffix in (".safetensors", ".json"):
                shutil.copyfile(FROZEN_FROM / f"{name}{suffix}", self.out / f"{name}{suffix}")
        summary = {
            "recipe": cfg.model_dump(mode="json"),
            "clips_used": train.num_clips,
            "frames_used": int(train.starts[-1]),
            "steps_done": step,
            "first_loss": first_loss,
            "final_loss_ema": loss_ema,
            "val_loss": val_losses,
            "data_seconds": data_seconds,
            "train_seconds": train_seconds,
            "sec_per_step": train_seconds / max(1, step),
            "threads": cfg.threads,
            "field_mean": dict(zip(FRAME_FIELDS, model_cfg.mean, strict=True)),
            "field_std": dict(zip(FRAME_FIELDS, model_cfg.std, strict=True)),
        }
        (self.out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return self.out


def train_motion(
    cfg: MotionTrainConfig, out: Path, cache: Path | None = None, progress: bool = True
) -> Path:
    """Train the motion generator into ``out``; returns the weights folder."""
    return MotionTrainer(cfg, out, cache, progress).run()


__all__ = [
    "MotionData",
    "MotionTrainConfig",
    "MotionTrainer",
    "audio_features",
    "build_data",
    "sample_batch",
    "train_motion",
]
