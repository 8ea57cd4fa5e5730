"""The root configuration: one pydantic model, nested per concern, validated at construction.

Validation messages quote the offending values and say what to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.core.errors import ConfigError

SIZE_STEP = (
    32  # VAE x8, A2V works at half the latent resolution, patch 2: sizes are multiples of 32
)
MIN_SIZE, MAX_SIZE = 64, 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VideoConfig(_Strict):
    width: int = Field(256, description="output width in pixels")
    height: int = Field(256, description="output height in pixels")
    fps: int = Field(25, ge=1, le=60, description="frames per second")

    @model_validator(mode="after")
    def _check_size(self) -> VideoConfig:
        for name, value in (("width", self.width), ("height", self.height)):
            if not (MIN_SIZE <= value <= MAX_SIZE) or value % SIZE_STEP:
                raise ValueError(
                    f"unsupported {name} {value}: use a multiple of {SIZE_STEP} "
                    f"between {MIN_SIZE} and {MAX_SIZE} (e.g. 256)"
                )
        return self


class AudioConfig(_Strict):
    sample_rate: int = Field(16000, ge=8000, le=48000, description="pipeline audio rate (Hz)")


class ScheduleConfig(_Strict):
    """Chunk sizes of the N/I timeline, in frames (DESIGN.md section 5)."""

    first_len: int = Field(2, ge=1, le=256, description="length of N0 (short: first frame fast)")
    n_len: int = Field(24, ge=2, le=256, description="length of every later N chunk")
    i_len: int = Field(
        3, ge=0, le=64, description="frames at the start of N(k+1) an I chunk redoes"
    )
    ctx_len: int = Field(2, ge=1, le=16, description="motion-context latents carried to the next N")

    @model_validator(mode="after")
    def _check(self) -> ScheduleConfig:
        if self.i_len + 1 > self.n_len:
            raise ValueError(
                f"i_len={self.i_len} needs n_len >= i_len + 1 (the far anchor is frame i_len of the "
                f"next N chunk), but n_len={self.n_len}"
            )
        if self.ctx_len > min(self.first_len, self.n_len):
            raise ValueError(
                f"ctx_len={self.ctx_len} is longer than a chunk (first_len={self.first_len}, "
                f"n_len={self.n_len}); use ctx_len <= {min(self.first_len, self.n_len)}"
            )
        return self


class SamplerConfig(_Strict):
    steps: int = Field(4, ge=1, le=100, description="Euler steps of the A2V flow sampler")
    i_steps: int = Field(
        2, ge=1, le=100, description="Euler steps for I chunks (two anchors constrain them)"
    )
    shift: float = Field(3.0, gt=0, le=20, description="timestep shift (SD3-style); 1 = none")
    audio_guidance: float = Field(1.0, ge=0, le=10, description="CFG scale on audio; 1 = off")


class ModelConfig(_Strict):
    family: Literal["studio"] = "studio"
    preset: Literal["default", "tiny"] = Field("default", description="network sizes")
    weights: Path | None = Field(
        None, description="checkpoint folder; None = the weights installed with the package"
    )
    untrained: bool = Field(False, description="use random weights (tests, benchmarks)")
    dtype: Literal["bfloat16", "float32"] = Field("bfloat16", description="compute dtype")

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.untrained and self.weights is not None:
            raise ValueError("choose either weights=<folder> or untrained=true, not both")
        return self


class OutputConfig(_Strict):
    crf: int = Field(23, ge=0, le=51, description="H.264 quality (lower is better)")
    preset: str = Field("veryfast", description="x264 preset")


class TalkloopConfig(_Strict):
    video: VideoConfig = VideoConfig()
    audio: AudioConfig = AudioConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    sampler: SamplerConfig = SamplerConfig()
    model: ModelConfig = ModelConfig()
    output: OutputConfig = OutputConfig()
    seed: int = Field(0, ge=0, lt=2**63, description="noise seed")


def build_config(**overrides: object) -> TalkloopConfig:
    """Build a config from nested dicts, turning validation failures into one ConfigError."""
    try:
        return TalkloopConfig.model_validate(overrides)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        parts.append(f"{where}: {msg}{shown}")
    return "invalid config: " + "; ".join(parts)
