"""The portrait family's motion generator: the shared A2V DiT over per-frame motion parameters.

One token per frame: a chunk's "latents" are ``(F, 16, 1, 1)`` *normalised* motion parameters
(``talkloop.pipeline.models.portrait.params.FRAME_FIELDS`` order and units, then ``(x - mean) / std`` per field),
so :class:`~talkloop.pipeline.models.shared.a2v.A2VDiT` with ``patch=1`` and the shared
``euler_sample`` / ``flow_matching_loss`` run unchanged, and the shared N/I chunk stages
drive it as they drive any family's A2V. The per-field statistics were measured on the
training clips and travel in the module's config JSON, so a weights folder is self-describing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor

from talkloop.pipeline.core.errors import CheckpointError
from talkloop.pipeline.core.module import Module, build_module
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS
from talkloop.pipeline.models.shared.a2v import A2VConfig, A2VDiT

NUM_FIELDS = len(FRAME_FIELDS)  # 16
MODULE_NAME = "a2v"  # the pipeline's A2VStage asks for a module of this name
STD_FLOOR = 1e-3  # a field that never moves in training keeps a finite scale

# Valid range of every field in raw units (talkloop/pipeline/models/portrait/params.py); sampled values are clipped.
FIELD_RANGES: dict[str, tuple[float, float]] = {
    "mouth_open": (0.0, 1.0),
    "mouth_width": (-1.0, 1.0),
    "mouth_round": (0.0, 1.0),
    "teeth": (0.0, 1.0),
    "tongue": (0.0, 1.0),
    "jaw": (0.0, 1.0),
    "blink": (0.0, 1.0),
    "brow_raise": (-1.0, 1.0),
    "smile": (-1.0, 1.0),
    "gaze_x": (-1.0, 1.0),
    "gaze_y": (-1.0, 1.0),
    "yaw": (-0.35, 0.35),
    "pitch": (-0.35, 0.35),
    "roll": (-0.35, 0.35),
    "tx": (-0.5, 0.5),
    "ty": (-0.5, 0.5),
}
_LOW = np.array([FIELD_RANGES[f][0] for f in FRAME_FIELDS], np.float32)
_HIGH = np.array([FIELD_RANGES[f][1] for f in FRAME_FIELDS], np.float32)


class PortraitMotionConfig(A2VConfig):
    """A2V sizes for a 16-channel, one-token-per-frame space, plus the per-field statistics.

    ``mean``/``std`` are in raw parameter units (FRAME_FIELDS order); the defaults (0, 1) are an
    untrained net's, training replaces them with the statistics of its clips.
    """

    latent_channels: int = Field(NUM_FIELDS, ge=NUM_FIELDS, le=NUM_FIELDS)
    patch: int = Field(1, ge=1, le=1, description="one token per frame")
    dim: int = Field(128, ge=16, le=4096)
    depth: int = Field(4, ge=1, le=64)
    heads: int = Field(4, ge=1, le=64)
    mean: tuple[float, ...] = Field((0.0,) * NUM_FIELDS, description="per-field mean, raw units")
    std: tuple[float, ...] = Field((1.0,) * NUM_FIELDS, description="per-field std, raw units")

    @model_validator(mode="after")
    def _check_stats(self) -> PortraitMotionConfig:
        for name in ("mean", "std"):
            vals = getattr(self, name)
            if len(vals) != NUM_FIELDS or not all(np.isfinite(vals)):
                raise ValueError(f"{name} must be {NUM_FIELDS} finite floats, got {vals!r}")
        low = min(self.std)
        if low < STD_FLOOR:
            raise ValueError(f"std must be >= {STD_FLOOR} for every field, got {low}")
        return self

    @classmethod
    def tiny(cls) -> PortraitMotionConfig:
        """Test size: two narrow blocks."""
        return cls(dim=32, depth=2, heads=2)

    def with_stats(self, mean: np.ndarray, std: np.ndarray) -> PortraitMotionConfig:
        """A copy with measured statistics; ``std`` is floored at ``STD_FLOOR``."""
        std = np.maximum(np.asarray(std, np.float64), STD_FLOOR)
        return self.model_copy(
            update={
                "mean": tuple(float(v) for v in np.asarray(mean, np.float64)),
                "std": tuple(float(v) for v in std),
            }
        )

    def normalise(self, params: np.ndarray | Tensor) -> Tensor:
        """Raw parameters ``(..., 16)`` -> latents ``(..., 16, 1, 1)`` float32."""
        p = torch.as_tensor(np.asarray(params) if not isinstance(params, Tensor) else params)
        if p.shape[-1:] != (NUM_FIELDS,):
            raise ValueError(f"params must be (..., {NUM_FIELDS}), got {tuple(p.shape)}")
        mean = torch.tensor(self.mean, dtype=torch.float32)
        std = torch.tensor(self.std, dtype=torch.float32)
        return ((p.float() - mean) / std)[..., None, None]

    def denormalise(self, latents: Tensor, clip: bool = True) -> np.ndarray:
        """Latents ``(..., 16, 1, 1)`` -> raw parameters ``(..., 16)`` float32 numpy.

        Args:
            latents: normalised parameters (the A2V's output).
            clip: clip every field to its valid range (``FIELD_RANGES``), as a renderer needs.
        """
        if latents.shape[-3:] != (NUM_FIELDS, 1, 1):
            raise ValueError(
                f"latents must be (..., {NUM_FIELDS}, 1, 1), got {tuple(latents.shape)}"
            )
        x = latents.detach().float().cpu().numpy()[..., 0, 0]
        out = x * np.asarray(self.std, np.float32) + np.asarray(self.mean, np.float32)
        if clip:
            out = np.clip(out, _LOW, _HIGH)
        return out.astype(np.float32)

    def rest_latent(self, rest: np.ndarray | None = None) -> Tensor:
        """The reference "latent" ``(1, 16, 1, 1)``: the photo's rest parameters, normalised.

        Args:
            rest: ``(16,)`` raw parameters of the photo; None: neutral (all zeros), which is
                what every training clip's reference is.
        """
        p = np.zeros(NUM_FIELDS, np.float32) if rest is None else np.asarray(rest, np.float32)
        return self.normalise(p[None])


def build_motion(config: PortraitMotionConfig, folder: Path | None = None) -> Module:
    """The motion module (named ``a2v``); loads ``folder/a2v.safetensors`` when given."""
    return build_module(MODULE_NAME, config, A2VDiT, folder)


def load_motion_config(folder: Path) -> PortraitMotionConfig:
    """The config a weights folder was saved with (``a2v.json``)."""

    path = Path(folder) / f"{MODULE_NAME}.json"
    if not path.is_file():
        raise CheckpointError(f"no portrait motion config at {path}")
    try:
        return PortraitMotionConfig.model_validate_json(path.read_text())
    except ValueError as err:
        raise CheckpointError(f"{path} is not a portrait motion config: {err}") from None


def load_motion(folder: Path) -> Module:
    """Build the motion module from a weights folder's config and load its weights."""
    return build_motion(load_motion_config(folder), folder)


__all__ = [
    "FIELD_RANGES",
    "MODULE_NAME",
    "NUM_FIELDS",
    "PortraitMotionConfig",
    "build_motion",
    "load_motion",
    "load_motion_config",
]
