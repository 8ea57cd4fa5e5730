"""Reference images: load, check and fit them to the video size."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from talkloop.pipeline.core.errors import InputError

MIN_REFERENCE_SIDE = 32


def load_reference(path: str | os.PathLike[str], width: int, height: int) -> np.ndarray:
    """Load an image, centre-crop it to the video's aspect ratio and resize it.

    Returns:
        ``(height, width, 3)`` uint8 RGB.

    Raises:
        InputError: missing file, a directory, not an image, or too small to use.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"reference image not found: {p} (check the path)")
    if p.is_dir():
        raise InputError(f"reference path is a directory, not an image: {p}")
    try:
        with Image.open(p) as im:
            im.load()
            image = im.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise InputError(
            f"not a readable image: {p} ({err.__class__.__name__}); use PNG or JPEG"
        ) from None
    if min(image.size) < MIN_REFERENCE_SIDE:
        raise InputError(
            f"reference image {p} is {image.size[0]}x{image.size[1]}: too small, "
            f"use at least {MIN_REFERENCE_SIDE}x{MIN_REFERENCE_SIDE} (ideally {width}x{height})"
        )
    return fit(image, width, height)


def fit(image: Image.Image, width: int, height: int) -> np.ndarray:
    """Centre-crop ``image`` to ``width:height`` and resize (Lanczos) to exactly that size."""
    w, h = image.size
    target = width / height
    if w / h > target:  # too wide: crop the sides
        cw = round(h * target)
        box = ((w - cw) // 2, 0, (w - cw) // 2 + cw, h)
    else:  # too tall: crop top and bottom
        ch = round(w / target)
        box = (0, (h - ch) // 2, w, (h - ch) // 2 + ch)
    out = image.crop(box).resize((width, height), Image.Resampling.LANCZOS)
    return np.asarray(out, dtype=np.uint8).copy()


def fit_array(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """An RGB uint8 array fitted like ``fit``; one of exactly ``(height, width, 3)`` as it is."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise InputError(
            f"reference must be an (H, W, 3) uint8 RGB array, got {image.shape} {image.dtype}"
        )
    if image.shape[:2] == (height, width):
        return image
    if min(image.shape[:2]) < MIN_REFERENCE_SIDE:
        raise InputError(
            f"reference image is {image.shape[1]}x{image.shape[0]}: too small, use at least "
            f"{MIN_REFERENCE_SIDE}x{MIN_REFERENCE_SIDE}"
        )
    return fit(Image.fromarray(image), width, height)
