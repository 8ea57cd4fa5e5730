"""The frame sizes a model's weights were made for, and one warning when asked for another.

Every size that is a multiple of 32 from 64 to 1024 runs (the networks are convolutional and
patch-based), but trained weights only know the sizes they were trained at: a latent model trained at 256x256
gives a blurred face whose mouth barely moves at 128 and grid artefacts with broken eyes at 512
(README, "Sizes"). Where a size comes from, first found:

- the weights folder's ``train_summary.json`` (``recipe.size``, written by ``talkloop train``:
  one side, or [width, height]), so a folder trained at another size is judged by its own;
- the family spec's ``native_sizes`` (``talkloop/pipeline/models/spec.py``), the sizes its
  shipped weights were made for.

Random weights (``untrained``) were made for nothing, so they get no warning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.models.spec import get_spec

__all__ = ["native_sizes", "size_warning", "warn_unless_native_size"]

log = logging.getLogger("talkloop.model")

_warned: set[tuple[str, str, int, int]] = set()  # once per process and (family, folder, size)


def _folder_sizes(folder: Path) -> tuple[tuple[int, int], ...] | None:
    """The training size recorded in ``folder/train_summary.json``, if there is one."""
    try:
        size = json.loads((folder / "train_summary.json").read_text())["recipe"]["size"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(size, int):
        return ((size, size),)
    if isinstance(size, list) and len(size) == 2 and all(isinstance(s, int) for s in size):
        return ((size[0], size[1]),)
    return None


def native_sizes(config: TalkloopConfig) -> tuple[tuple[int, int], ...]:
    """The (width, height) sizes the configured weights were made for; () for random weights.

    Args:
        config: the root config (``model.family``, ``model.weights``, ``model.untrained``).
    """
    if config.model.untrained:
        return ()
    spec = get_spec(config.model.family)
    folder = config.model.weights or spec.weights
    recorded = _folder_sizes(Path(folder)) if folder is not None else None
    return recorded or spec.native_sizes


def size_warning(config: TalkloopConfig) -> str | None:
    """The warning for ``config.video``'s size, or None when the weights were made for it."""
    sizes = native_sizes(config)
    size = (config.video.width, config.video.height)
    if not sizes or size in sizes:
        return None
    made = ", ".join(f"{w}x{h}" for w, h in sizes)
    return (
        f"--size {size[0]}x{size[1]}: the {config.model.family} weights were made for {made} "
        f"only; at other sizes they run but were never trained there, so expect a degraded, "
        f"less animated face (use --size {sizes[0][0]}x{sizes[0][1]}, or train at your size)"
    )


def warn_unless_native_size(config: TalkloopConfig) -> None:
    """Log ``size_warning`` once per process for each family, weights folder and size."""
    message = size_warning(config)
    key = (
        config.model.family,
        str(config.model.weights),
        config.video.width,
        config.video.height,
    )
    if message is not None and key not in _warned:
        _warned.add(key)
        log.warning(message)
