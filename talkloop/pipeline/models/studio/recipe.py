"""Training recipe: steps, batch sizes and learning rates of every phase (one pydantic model).

The default recipe is sized from measured step times so that the whole run, data generation
included, takes a few hours on a small CPU (docs/benchmarks.md, "Figures behind code choices");
``tiny`` is the smoke-test recipe.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from talkloop.pipeline.models.shared.sampling import MaskRecipe

PHASES = ("vae", "decoder", "a2v", "sr", "readout", "expression", "mouth")


class PhaseConfig(BaseModel):
    """One optimisation phase: AdamW, linear warm-up then cosine decay to ``lr * final_frac``."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(ge=0, le=10_000_000)
    batch: int = Field(ge=1, le=4096, description="samples per step (A2V: frames per step)")
    lr: float = Field(gt=0.0, le=1.0)
    warmup: int = Field(100, ge=0)
    final_frac: float = Field(0.1, ge=0.0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    clip_grad: float = Field(1.0, gt=0.0)


class TrainConfig(MaskRecipe):
    """Everything ``talkloop train`` needs besides the network sizes (``StudioConfig``)."""

    model_config = ConfigDict(extra="forbid")

    preset: Literal["default", "tiny"] = "default"
    size: int = Field(256, ge=32, le=1024, description="frame side of the training clips")
    clips: int = Field(400, ge=1, description="training clips generated when --data is not given")
    seed: int = Field(0, ge=0)
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="autocast dtype; auto: bfloat16 where the CPU computes it natively"
    )
    clips_per_character: int = Field(
        4,
        ge=1,
        le=1000,
        description="generated clips share characters: each face shows several styles, so only "
        "the prompt tells which one a clip has (one clip per face lets the face stand for it)",
    )
    vae: PhaseConfig = PhaseConfig(steps=8000, batch=8, lr=4e-4)
    # The decoder alone, on the latents the VAE phase fixed (its encoder frozen), so it sharpens
    # without moving the latent space every later network learns in.
    decoder: PhaseConfig = PhaseConfig(steps=2000, batch=8, lr=2e-4)
    a2v: PhaseConfig = PhaseConfig(steps=8000, batch=192, lr=3e-4, warmup=300)
    sr: PhaseConfig = PhaseConfig(steps=4000, batch=24, lr=4e-4)
    readout: PhaseConfig = PhaseConfig(steps=1500, batch=64, lr=1e-3, warmup=50)
    expression: PhaseConfig = PhaseConfig(steps=1200, batch=16, lr=1e-3, warmup=100)
    mouth: PhaseConfig = PhaseConfig(steps=3000, batch=32, lr=1e-3, warmup=100)
    # VAE: windows of consecutive frames kept per clip (the decoder is causal over cache_frames).
    vae_windows_per_clip: int = Field(4, ge=1, le=64)
    vae_decode_frames: int = Field(2, ge=1, le=16, description="decoded frames per window")
    vae_crop: int = Field(128, ge=32, le=1024, description="VAE trains on crops this wide")
    kl_weight: float = Field(1e-5, ge=0.0, description="KL per latent element vs mean L1")
    grad_weight: float = Field(0.5, ge=0.0, description="image-gradient L1 vs pixel L1")
    # A2V: conditioning dropout (its mask patterns: MaskRecipe).
    audio_drop: float = Field(0.15, ge=0.0, le=1.0)
    text_drop: float = Field(0.2, ge=0.0, le=1.0)
    # Readout: its own renders, smile drawn per frame (``readout_renders``).
    readout_clips: int = Field(400, ge=1, description="characters rendered for the readout")
    readout_frames_per_clip: int = Field(16, ge=1, le=256)
    # Expression: reference / prompted-expression pairs (``expression_pairs``).
    expression_characters: int = Field(600, ge=1, description="characters rendered for it")
    expression_styles: int = Field(4, ge=1, le=64, description="prompted styles per character")
    # Mouth: the head learns each clip frame's mouth from its audio; the editor learns
    # wrong-mouth / right-mouth pairs (``mouth_pairs``).
    mouth_characters: int = Field(600, ge=1, description="characters rendered for the editor")
    mouth_frames: int = Field(8, ge=1, le=256, description="frame pairs per character")
    # SR: the low-res input is noised so SR learns to fix small A2V errors.
    sr_input_noise: float = Field(0.1, ge=0.0, le=1.0)
    checkpoint_every: int = Field(200, ge=1)
    log_every: int = Field(10, ge=1)
    minutes: float | None = Field(None, gt=0.0, description="wall-clock budget for all phases")

    @classmethod
    def recipe(cls, preset: str = "default", **overrides: object) -> TrainConfig:
        """The recipe for a network preset; ``overrides`` replace top-level fields."""
        if preset == "tiny":
            base = cls(
                preset="tiny",
                size=64,
                clips=4,
                vae=PhaseConfig(steps=30, batch=2, lr=2e-3, warmup=0),
                decoder=PhaseConfig(steps=10, batch=2, lr=2e-3, warmup=0),
                a2v=PhaseConfig(steps=30, batch=24, lr=2e-3, warmup=0),
                sr=PhaseConfig(steps=30, batch=8, lr=2e-3, warmup=0),
                readout=PhaseConfig(steps=30, batch=16, lr=3e-3, warmup=0),
                expression=PhaseConfig(steps=30, batch=4, lr=1e-4, warmup=0),
                mouth=PhaseConfig(steps=30, batch=4, lr=1e-3, warmup=0),
                vae_windows_per_clip=2,
                readout_clips=3,
                readout_frames_per_clip=4,
                expression_characters=3,
                expression_styles=2,
                mouth_characters=3,
                mouth_frames=2,
                max_gen=6,
                max_interior=2,
                checkpoint_every=10,
                log_every=5,
            )
        else:
            base = cls()
        return base.model_copy(update=overrides) if overrides else base

    @property
    def characters(self) -> int:
        """Size of the character pool the generated clips draw from."""
        return -(-self.clips // self.clips_per_character)
