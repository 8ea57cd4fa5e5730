"""Model families: build the modules a pipeline needs from the model config."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import NamedTuple

import torch

from pipeline.core.config import TalkloopConfig
from pipeline.core.errors import ConfigError, WeightsMissingError
from pipeline.core.module import Module

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

INSTALLED_WEIGHTS = Path(__file__).parent / "studio" / "weights"
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
    from pipeline.models.studio.family import StudioConfig, build_networks

    m = config.model
    folder: Path | None = None
    if not m.untrained:
        folder = m.weights or installed_weights()
        if folder is None:
            raise WeightsMissingError(
                "no trained weights are installed for the studio model (expected "
                f"{INSTALLED_WEIGHTS}/a2v.safetensors). Pass --weights DIR to use a checkpoint "
                "folder, or --untrained to run with random weights (the video will not show a face)."
            )
        if not folder.is_dir():
            raise ConfigError(f"weights folder {folder} does not exist")
    family = _family_from_folder(folder) if folder else getattr(StudioConfig, m.preset)()
    with torch.random.fork_rng():
        torch.manual_seed(INIT_SEED)
        nets = build_networks(family)
    # Conv-heavy decoder: channels_last is ~2x faster on CPU (oneDNN); inputs are converted inside.
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
        if m.compute_dtype == "bfloat16":
            module.cast_matmuls(torch.bfloat16)
        modules[name] = module
    from pipeline.offload.placement import apply_placement

    apply_placement(modules, m)  # resident / offloaded / sharded, per model.placement
    return modules


def _has_module(folder: Path, name: str) -> bool:
    """Whether ``folder`` holds any file of module ``name`` (a partial pair still fails to load)."""
    return (folder / f"{name}.json").is_file() or (folder / f"{name}.safetensors").is_file()


def _family_from_folder(folder: Path):
    """The family config a checkpoint folder was saved with (one JSON per module)."""
    from pydantic import ValidationError

    from pipeline.core.errors import CheckpointError
    from pipeline.models.studio.family import StudioConfig

    parts = {}
    for name, field in STUDIO_MODULES.items():
        path = folder / f"{name}.json"
        if name in OPTIONAL_MODULES and not _has_module(folder, name):
            # Untrained (see OPTIONAL_MODULES), sized to the folder's other networks.
            parts[field] = {
                key: parts[src][src_key]
                for key, src, src_key in OPTIONAL_MODULES[name].sizes
                if src_key in parts.get(src, {})
            }
            continue
        if not path.is_file():
            raise CheckpointError(f"checkpoint folder {folder} has no {path.name}")
        try:
            parts[field] = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{path} is not valid JSON: {err}") from None
    try:
        return StudioConfig.model_validate(parts)
    except ValidationError as err:
        raise CheckpointError(f"{folder}: invalid model config: {err}") from None


DEFAULT_REFERENCE = Path(__file__).parent / "studio" / "default_reference.png"
# The default avatar is studio character 21 (`talkloop studio character --seed 21`).
DEFAULT_REFERENCE_SEED = 21


def default_reference():
    """The bundled default avatar image as (H, W, 3) uint8, fitted to nothing (caller fits)."""
    from pipeline.core.errors import InputError

    if not DEFAULT_REFERENCE.is_file():
        raise InputError(
            "no --reference image given and no default avatar is installed (it ships with the "
            "trained weights); pass --reference IMG"
        )
    return DEFAULT_REFERENCE
