"""The portrait family: its root config, its three networks, how they load and the stages it runs.

The family contract is in ``talkloop/pipeline/models/registry.py``. Networks: the shared audio
encoder (``models/shared``, frozen, its weights in this family's folder), the packaged sentence
encoder, and the
motion net (``a2v``: an A2V DiT over motion parameters). The photo itself is the rest: framed by
``load_reference``, warped by the renderer the init stage builds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.errors import CheckpointError, ConfigError, InputError
from talkloop.pipeline.core.graph import Phase
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.models.portrait import SPEC
from talkloop.pipeline.models.portrait.framing import frame_portrait
from talkloop.pipeline.models.portrait.motion import NUM_FIELDS, PortraitMotionConfig
from talkloop.pipeline.models.portrait.stages import (
    PortraitReferenceStage,
    PortraitRenderStage,
    RenderWorkers,
)
from talkloop.pipeline.models.registry import (
    finish_modules,
    module_config,
    use_a2v_graph,
    weights_folder,
)
from talkloop.pipeline.models.shared.a2v import A2VDiT
from talkloop.pipeline.models.shared.audio_encoder import AudioEncoder, AudioEncoderConfig
from talkloop.pipeline.models.shared.text_encoder import TextEncoder, TextEncoderConfig
from talkloop.pipeline.stages.a2v import chunk_phases
from talkloop.pipeline.stages.prompt import PromptStage

if TYPE_CHECKING:
    from talkloop.pipeline.core.graph import Phase

# Module name -> field of PortraitConfig (and the checkpoint files' stem).
PORTRAIT_MODULES = {"audio_encoder": "audio", "text_encoder": "text", "a2v": "motion"}
INSTALLED_WEIGHTS = SPEC.weights
DEFAULT_REFERENCE = Path(__file__).parent / "default_portrait.png"
INIT_SEED = 0
# The spec's native sizes, live schedule and sampler under the names the family's code uses.
NATIVE_SIZES = SPEC.native_sizes
LIVE_SCHEDULE = dict(SPEC.live_schedule)
LIVE_SAMPLER = dict(SPEC.live_sampler)


# The family's networks are small (a motion token per frame) and its renderer is a few remaps a
# frame: split over threads they gain little, and next to the video encoder on few cores the
# threads' barrier waits made the motion net many times slower (docs/benchmarks.md, "Figures
# behind code choices"). One thread computes; the encoder (its own thread) has the other cores.
COMPUTE_THREADS = 1


def use_compute_threads() -> None:
    """Give torch and OpenCV ``COMPUTE_THREADS`` threads in this process."""

    torch.set_num_threads(COMPUTE_THREADS)
    cv2.setNumThreads(COMPUTE_THREADS)


class PortraitConfig(BaseModel):
    """Root config of the portrait family; the networks' widths are checked to agree."""

    model_config = ConfigDict(extra="forbid")

    audio: AudioEncoderConfig = Field(default_factory=AudioEncoderConfig)
    text: TextEncoderConfig = Field(default_factory=TextEncoderConfig)
    motion: PortraitMotionConfig = Field(default_factory=PortraitMotionConfig)

    @model_validator(mode="after")
    def _agree(self) -> PortraitConfig:
        if self.motion.audio_dim != self.audio.dim:
            raise ValueError(
                f"motion.audio_dim={self.motion.audio_dim} must equal audio.dim={self.audio.dim}"
            )
        if self.motion.text_dim != self.text.dim:
            raise ValueError(
                f"motion.text_dim={self.motion.text_dim} must equal text.dim={self.text.dim}"
            )
        return self

    @classmethod
    def default(cls) -> PortraitConfig:
        return cls()

    @classmethod
    def tiny(cls) -> PortraitConfig:
        """Tests: the networks run in milliseconds (the text encoder is the real one)."""
        motion = PortraitMotionConfig.tiny().model_copy(update={"audio_dim": 16})
        return cls(audio=AudioEncoderConfig(dim=16, hidden=16), motion=motion)


def installed_weights() -> Path | None:
    """The folder of trained portrait weights shipped with the package, if any."""
    return INSTALLED_WEIGHTS if (INSTALLED_WEIGHTS / "a2v.safetensors").is_file() else None


def load_modules(config: TalkloopConfig) -> dict[str, Module]:
    """Build the family's modules; load trained weights unless ``model.untrained`` is set.

    Also sets this process to one compute thread for torch and OpenCV (``COMPUTE_THREADS``).
    """

    use_compute_threads()
    m = config.model
    folder = weights_folder(
        m, "portrait", installed_weights(), INSTALLED_WEIGHTS / "a2v.safetensors"
    )
    if folder is not None:
        family = _config_from_folder(folder)
    elif m.preset == "large":
        raise ConfigError("the portrait family has presets default and tiny, not large")
    else:
        family = getattr(PortraitConfig, m.preset)()
    with torch.random.fork_rng():
        torch.manual_seed(INIT_SEED)
        nets = {
            "audio_encoder": AudioEncoder(family.audio),
            "text_encoder": TextEncoder(family.text),
            "a2v": A2VDiT(family.motion),
        }
    modules: dict[str, Module] = {}
    for name, field in PORTRAIT_MODULES.items():
        module = Module(name, getattr(family, field), nets[name])
        if folder is not None and module.state_dict():
            module.load(folder)
        modules[name] = module
    # The A2V's graphs are exported from these float32 weights, whatever dtype torch computes in.
    float32 = None
    if m.backend != "torch":
        float32 = {k: v.clone() for k, v in modules["a2v"].state_dict().items()}
    finish_modules(modules, config)
    use_a2v_graph(modules, config, float32, (NUM_FIELDS, 1, 1))
    return modules


def _config_from_folder(folder: Path) -> PortraitConfig:
    """The family config a weights folder was saved with (one JSON per module)."""

    parts = {field: module_config(folder, name) for name, field in PORTRAIT_MODULES.items()}
    try:
        return PortraitConfig.model_validate(parts)
    except ValidationError as err:
        raise CheckpointError(f"{folder}: invalid portrait model config: {err}") from None


def default_reference() -> Path:
    """The path of the bundled default portrait."""
    if not DEFAULT_REFERENCE.is_file():
        raise InputError(
            f"no --reference photo given and the default portrait ({DEFAULT_REFERENCE}) is "
            "missing; pass --reference PHOTO"
        )
    return DEFAULT_REFERENCE


def load_reference(
    source: str | os.PathLike[str] | np.ndarray | None, width: int, height: int
) -> np.ndarray:
    """Frame a portrait (a path, an array, or None for the default portrait) to ``(height,
    width, 3)`` uint8: head and shoulders, the face ~40-45 % of the height. Arrays are framed
    too. Photos without a usable face raise InputError."""

    return frame_portrait(default_reference() if source is None else source, width, height).image


def phases(config: TalkloopConfig) -> dict[str, Phase]:
    """The portrait pipeline: the shared audio features and N/I chunk stages drive the motion
    net; the photo is prepared once and warped per frame."""

    workers = RenderWorkers(config.model.render_processes or 0)
    return {
        "init": Phase(
            "init",
            frozenset({"reference_image", "prompt"}),
            [PortraitReferenceStage(workers), PromptStage()],
        ),
        "prompt": Phase("prompt", frozenset({"prompt"}), [PromptStage()]),
        **chunk_phases(config.sampler),
        "publish": Phase(
            "publish",
            frozenset({"segment_latents", "segment_audio", "segment_start", "seed"}),
            [PortraitRenderStage(config.video.fps, workers)],
        ),
    }
