"""The studio family: its root config, its seven networks, how they load and the stages they run.

The family contract (``talkloop/pipeline/models/registry.py``): ``load_modules``, ``phases``,
``load_reference`` and ``installed_weights``; its sizes, schedules and weights folder are the
spec's (``SPEC`` in ``__init__.py``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from torch import nn

from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.errors import CheckpointError, InputError
from talkloop.pipeline.core.graph import Phase
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.models.registry import finish_modules, module_config, weights_folder
from talkloop.pipeline.models.shared.a2v import A2VConfig, A2VDiT
from talkloop.pipeline.models.shared.audio_encoder import AudioEncoder, AudioEncoderConfig
from talkloop.pipeline.models.shared.text_encoder import TextEncoder, TextEncoderConfig
from talkloop.pipeline.models.studio import SPEC
from talkloop.pipeline.models.studio.backend import exported_nets, use_backend
from talkloop.pipeline.models.studio.expression import ExpressionConfig, ExpressionNet
from talkloop.pipeline.models.studio.mouth import MouthConfig, MouthNet
from talkloop.pipeline.models.studio.sr import SRConfig, SRDiT
from talkloop.pipeline.models.studio.stages import (
    DecodeStage,
    ExpressionStage,
    MouthStage,
    ReferenceStage,
    SRStage,
)
from talkloop.pipeline.models.studio.vae import StudioVAE, VAEConfig
from talkloop.pipeline.reference import fit_array
from talkloop.pipeline.reference import load_reference as load_fitted
from talkloop.pipeline.stages.a2v import chunk_phases
from talkloop.pipeline.stages.prompt import PromptStage

if TYPE_CHECKING:
    from talkloop.pipeline.core.graph import Phase

NETWORK_KEYS = ("vae", "audio_encoder", "text_encoder", "expression", "a2v", "sr", "mouth")


class StudioConfig(BaseModel):
    """Root config of the studio family; cross-network sizes are checked to agree."""

    model_config = ConfigDict(extra="forbid")

    vae: VAEConfig = Field(default_factory=VAEConfig)
    audio: AudioEncoderConfig = Field(default_factory=AudioEncoderConfig)
    text: TextEncoderConfig = Field(default_factory=TextEncoderConfig)
    expression: ExpressionConfig = Field(default_factory=ExpressionConfig)
    a2v: A2VConfig = Field(default_factory=A2VConfig)
    sr: SRConfig = Field(default_factory=SRConfig)
    mouth: MouthConfig = Field(default_factory=MouthConfig)

    @model_validator(mode="after")
    def _agree(self) -> StudioConfig:
        c = self.vae.latent_channels
        others = {n: getattr(self, n).latent_channels for n in ("a2v", "sr", "expression", "mouth")}
        if set(others.values()) != {c}:
            raise ValueError(
                f"latent_channels disagree: vae={c}, "
                + ", ".join(f"{n}={v}" for n, v in others.items())
            )
        for name in ("a2v", "mouth"):
            if getattr(self, name).audio_dim != self.audio.dim:
                raise ValueError(
                    f"{name}.audio_dim={getattr(self, name).audio_dim} must equal "
                    f"audio.dim={self.audio.dim}"
                )
        for name in ("a2v", "expression"):
            if getattr(self, name).text_dim != self.text.dim:
                raise ValueError(
                    f"{name}.text_dim={getattr(self, name).text_dim} must equal "
                    f"text.dim={self.text.dim}"
                )
        return self

    @classmethod
    def default(cls) -> StudioConfig:
        """Sized for faster than real time at 256x256, 25 fps on a small CPU computing bf16
        (docs/benchmarks.md, "Figures behind code choices")."""
        return cls()

    @classmethod
    def tiny(cls) -> StudioConfig:
        """Tests: every network runs in milliseconds (the text encoder is the real one)."""
        return cls(
            vae=VAEConfig(
                enc_channels=16,
                enc_latent_channels=16,
                enc_blocks=1,
                dec_latent_channels=16,
                dec_channels=8,
                dec_latent_blocks=1,
                dec_blocks=1,
                decode_batch=1,
            ),
            audio=AudioEncoderConfig(dim=16, hidden=16),
            expression=ExpressionConfig(channels=16, blocks=1, style_dim=16),
            a2v=A2VConfig(patch=2, dim=32, depth=2, heads=2, audio_dim=16, max_frames=32),
            sr=SRConfig(dim=32, depth=1, heads=2),
            mouth=MouthConfig(audio_dim=16, hidden=16, channels=8, blocks=1, style_dim=8),
        )

    @classmethod
    def large(cls) -> StudioConfig:
        """GPU scale, for the offload check at 1280x720 (scripts/gpu_check.py), random weights.

        720 / 8 = 90 latent rows, pooled to 45 for the A2V: its patch is 5 (144 tokens a frame at
        1280x720). About 1.5 B A2V parameters in 28 blocks (~100 MB each in bf16).
        """
        return cls(
            a2v=A2VConfig(patch=5, dim=1536, depth=28, heads=12, max_frames=64),
            sr=SRConfig(patch=2, dim=1024, depth=12, heads=8),
        )


def build_networks(config: StudioConfig) -> dict[str, nn.Module]:
    """Construct all seven networks from the current ``torch.manual_seed`` state (caller seeds).

    Returns:
        ``NETWORK_KEYS`` -> module, in eval mode.
        The text encoder holds no parameters (its ``state_dict()`` is empty).
    """
    nets: dict[str, nn.Module] = {
        "vae": StudioVAE(config.vae),
        "audio_encoder": AudioEncoder(config.audio),
        "text_encoder": TextEncoder(config.text),
        "expression": ExpressionNet(config.expression),
        "a2v": A2VDiT(config.a2v),
        "sr": SRDiT(config.sr),
        "mouth": MouthNet(config.mouth),
    }
    for net in nets.values():
        net.eval()
    return nets


# Family config field for each module name.
STUDIO_MODULES = {
    "vae": "vae",
    "audio_encoder": "audio",
    "text_encoder": "text",
    "expression": "expression",
    "a2v": "a2v",
    "sr": "sr",
    "mouth": "mouth",
}

INSTALLED_WEIGHTS = SPEC.weights
INIT_SEED = 0  # random-weight runs are reproducible: the weights never depend on the noise seed


class OptionalModule(NamedTuple):
    """A module a checkpoint folder may lack (trained before it existed). The folder still loads
    and the module's untrained init is the identity."""

    sizes: tuple[tuple[str, str, str], ...]  # (its key, family field, that field's key)
    loses: str  # what a folder without it loses, for the warning


OPTIONAL_MODULES = {
    "expression": OptionalModule(
        (("latent_channels", "vae", "latent_channels"),), "prompts will not change the face"
    ),
    "mouth": OptionalModule(
        (("latent_channels", "vae", "latent_channels"), ("audio_dim", "audio", "dim")),
        "no explicit mouth path",
    ),
}
log = logging.getLogger("talkloop.models")


def installed_weights() -> Path | None:
    """The folder of trained studio weights shipped with the package, if any."""
    return INSTALLED_WEIGHTS if (INSTALLED_WEIGHTS / "a2v.safetensors").is_file() else None


def load_modules(config: TalkloopConfig) -> dict[str, Module]:
    """Build the family's modules; load trained weights unless ``model.untrained`` is set."""

    m = config.model
    folder = weights_folder(m, "studio", installed_weights(), INSTALLED_WEIGHTS / "a2v.safetensors")
    family = _family_from_folder(folder) if folder else getattr(StudioConfig, m.preset)()
    with torch.random.fork_rng():
        torch.manual_seed(INIT_SEED)
        nets = build_networks(family)
    # Conv-heavy decoder: channels_last is faster on CPU (oneDNN; docs/benchmarks.md, "Figures
    # behind code choices"); inputs are converted inside.
    nets["vae"] = nets["vae"].to(memory_format=torch.channels_last)
    modules: dict[str, Module] = {}
    for name, field in STUDIO_MODULES.items():
        module = Module(name, getattr(family, field), nets[name])
        if folder is not None and name in OPTIONAL_MODULES and not _has_module(folder, name):
            log.warning(
                "%s has no %s weights (trained before that module existed): it stays the "
                "identity, so %s",
                folder,
                name,
                OPTIONAL_MODULES[name].loses,
            )
        elif folder is not None and module.state_dict():
            module.load(folder)
        modules[name] = module

    # An exported backend's graphs are made from these float32 weights, whatever dtype torch
    # then computes in (cast to bf16 and back they would have lost their low bits).
    float32 = None
    if m.backend != "torch":  # torch alone exports nothing
        float32 = {
            n: {k: v.clone() for k, v in net.state_dict().items()}
            for n, net in exported_nets(nets).items()
        }
    finish_modules(modules, config)
    use_backend(nets, config, modules["a2v"].compute_dtype or "float32", float32)
    return modules


def _has_module(folder: Path, name: str) -> bool:
    """Whether ``folder`` holds any file of module ``name`` (a partial pair still fails to load)."""
    return (folder / f"{name}.json").is_file() or (folder / f"{name}.safetensors").is_file()


def _family_from_folder(folder: Path):
    """The family config a checkpoint folder was saved with (one JSON per module)."""

    parts = {}
    for name, field in STUDIO_MODULES.items():
        if name in OPTIONAL_MODULES and not _has_module(folder, name):
            # Untrained (see OPTIONAL_MODULES), sized to the folder's other networks.
            parts[field] = {
                key: parts[src][src_key]
                for key, src, src_key in OPTIONAL_MODULES[name].sizes
                if src_key in parts.get(src, {})
            }
            continue
        parts[field] = module_config(folder, name)
    try:
        return StudioConfig.model_validate(parts)
    except ValidationError as err:
        raise CheckpointError(f"{folder}: invalid model config: {err}") from None


DEFAULT_REFERENCE = Path(__file__).parent / "default_reference.png"
# The default avatar is studio character 21 (`talkloop synth character --seed 21`).
DEFAULT_REFERENCE_SEED = 21


# The spec's live schedule, sampler and native sizes under the names the family's code uses.
LIVE_SCHEDULE = dict(SPEC.live_schedule)
LIVE_SAMPLER = dict(SPEC.live_sampler)
NATIVE_SIZES = SPEC.native_sizes


def default_reference() -> Path:
    """The path of the bundled default avatar image."""

    if not DEFAULT_REFERENCE.is_file():
        raise InputError(
            "no --reference image given and no default avatar is installed (it ships with the "
            "trained weights); pass --reference IMG"
        )
    return DEFAULT_REFERENCE


def load_reference(
    source: str | os.PathLike[str] | np.ndarray | None, width: int, height: int
) -> np.ndarray:
    """The reference as a session takes it: ``(height, width, 3)`` uint8, centre-cropped and
    resized (an array of exactly that shape is taken as it is). None: the default avatar."""

    if isinstance(source, np.ndarray):
        return fit_array(source, width, height)
    return load_fitted(default_reference() if source is None else source, width, height)


def phases(config: TalkloopConfig) -> dict[str, Phase]:
    """The studio pipeline: VAE latents through A2V, SR and the mouth net to the decoder."""

    return {
        "init": Phase(
            "init",
            frozenset({"reference_image", "prompt"}),
            [ReferenceStage(), PromptStage(), ExpressionStage()],
        ),
        "prompt": Phase("prompt", frozenset({"prompt"}), [PromptStage(), ExpressionStage()]),
        **chunk_phases(config.sampler),
        "publish": Phase(
            "publish",
            frozenset({"segment_latents", "segment_audio", "segment_start", "seed"}),
            [SRStage(), MouthStage(), DecodeStage(config.schedule.n_len)],
        ),
    }
