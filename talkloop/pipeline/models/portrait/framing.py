"""A portrait photo, framed head-and-shoulders at the output size, with its landmarks and mask.

The framing scales the photo so the face (forehead to chin) is :data:`FACE_FRACTION` of the output
height, puts the eyes on the upper third line and centres the face horizontally. The crop is
axis-aligned: a tilted head stays tilted (the renderer treats the photo's pose as neutral).
Where the crop leaves the photo, its edge pixels are repeated and blurred more the farther they
reach, so the frame has no black bars.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from talkloop.pipeline.core.errors import InputError
from talkloop.pipeline.models.portrait.face import (
    CHIN,
    FOREHEAD,
    detect_faces,
    face_landmarks,
    head_pose,
    person_mask,
    refine_landmarks,
    resample,
)

log = logging.getLogger("talkloop.portrait")

FACE_FRACTION = 0.42  # forehead-to-chin height / output height
EYE_LINE = 1.0 / 3.0  # eye height / output height, from the top
MIN_FACE_PX = 96  # forehead-to-chin height in the source photo
MAX_YAW_DEG = 35.0
MIN_SIDE, MAX_SIDE = 64, 4096  # accepted output width and height
_FILL_SIDE = 256  # largest side of the push-pull fill outside the photo


@dataclass
class Portrait:
    """A framed portrait: what the renderer warps."""

    image: np.ndarray  # (height, width, 3) uint8 RGB, framed
    landmarks: np.ndarray  # (478, 3) float32 in the framed image's pixels
    mask: np.ndarray  # (height, width) float32 person mask of the framed image
    faces_found: int


def load_image(source: str | Path | np.ndarray) -> tuple[np.ndarray, str]:
    """An (H, W, 3) uint8 RGB image from a path (EXIF orientation applied) or an array.

    Returns:
        The image and a label for messages ("portrait NAME.jpg", or "the portrait image").

    Raises:
        InputError: a missing, unreadable, truncated or non-image file, or a bad array.
    """
    if isinstance(source, np.ndarray):
        if source.ndim != 3 or source.shape[2] != 3 or source.dtype != np.uint8:
            raise InputError(
                f"portrait array must be (H, W, 3) uint8 RGB, got {source.shape} {source.dtype}"
            )
        return np.ascontiguousarray(source), "the portrait image"
    if not isinstance(source, str | Path):
        raise InputError(
            f"portrait must be a file path or an image array, got {type(source).__name__}"
        )
    path = Path(source)
    name = f"portrait {path.name}"
    if not path.is_file():
        raise InputError(f"portrait file {path} does not exist")
    try:
        with Image.open(path) as im:
            im.load()
            ImageOps.exif_transpose(im, in_place=True)  # no copy when upright
            if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                # A cut-out portrait: its transparent background becomes white, not black.
                rgba = im.convert("RGBA")
                white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                im = Image.alpha_composite(white, rgba)
            rgb = np.asarray(im if im.mode == "RGB" else im.convert("RGB"))
    except UnidentifiedImageError:
        raise InputError(f"{name} is not an image (expected JPEG, PNG or WebP)") from None
    except Image.DecompressionBombError as e:
        raise InputError(f"{name} is too large to open: {e}") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise InputError(f"{name} is truncated or corrupt: {e}") from None
    return np.ascontiguousarray(rgb), name


def face_height(landmarks: np.ndarray) -> float:
    """Forehead-to-chin distance of a face in pixels (landmarks 10 and 152)."""
    return float(np.linalg.norm(landmarks[FOREHEAD, :2] - landmarks[CHIN, :2]))


def eye_centre(landmarks: np.ndarray) -> np.ndarray:
    """(2,) mean of the four eye corners, in pixels."""
    return landmarks[[33, 133, 263, 362], :2].mean(0)


def _check_size(width: int, height: int) -> None:
    for label, v in (("width", width), ("height", height)):
        if not isinstance(v, int | np.integer) or not MIN_SIDE <= v <= MAX_SIDE:
            raise InputError(
                f"portrait {label} must be an integer in [{MIN_SIDE}, {MAX_SIDE}], got {v!r}"
            )


def _warp(image: np.ndarray, scale: float, left: float, top: float, width: int, height: int):
    """Output pixel (u, v) <- source point (left + u / scale, top + v / scale).

    Returns the (height, width, 3) uint8 frame and the (height, width) float32 coverage of the
    photo (1 inside, 0 where the frame leaves it).
    """
    to_source = np.array([[1.0 / scale, 0.0, left], [0.0, 1.0 / scale, top]])
    frame = resample(image, to_source, width, height, cubic=scale > 1.0)
    h, w = image.shape[:2]
    # Per axis: how far the output pixel centre lies inside the photo, in output pixels.
    xs = left + (np.arange(width) + 0.5) / scale
    ys = top + (np.arange(height) + 0.5) / scale
    cover_x = np.clip(np.minimum(xs, w - xs) * scale + 0.5, 0.0, 1.0)
    cover_y = np.clip(np.minimum(ys, h - ys) * scale + 0.5, 0.0, 1.0)
    return frame, np.outer(cover_y, cover_x).astype(np.float32)


def _fill_outside(frame: np.ndarray, cover: np.ndarray) -> np.ndarray:
    """Fill the frame outside the photo with the photo's colours, blurred more the farther out.

    Push-pull on an image pyramid of the photo's pixels weighted by coverage: every empty cell
    takes the next coarser level's colour, so the edge's colours spread outwards smoothly, without
    the streaks a repeated edge row would draw. The fill is built at most 256 px wide (it is a
    blur anyway) and pasted outside the photo at full size.
    """
    h, w = frame.shape[:2]
    f = min(1.0, _FILL_SIDE / max(h, w))
    size = (max(1, round(w * f)), max(1, round(h * f)))
    inside = cv2.resize(cover, size, interpolation=cv2.INTER_AREA).reshape(size[1], size[0], 1)
    colour = cv2.resize(frame, size, interpolation=cv2.INTER_AREA).astype(np.float32)
    levels = [(colour * inside, inside)]
    while min(levels[-1][1].shape[:2]) > 1:
        a, b = levels[-1]
        size = (max(1, a.shape[1] // 2), max(1, a.shape[0] // 2))
        levels.append(
            (
                cv2.resize(a, size, interpolation=cv2.INTER_AREA).reshape(size[1], size[0], 3),
                cv2.resize(b, size, interpolation=cv2.INTER_AREA).reshape(size[1], size[0], 1),
            )
        )
    a, b = levels[-1]
    fill = np.broadcast_to(a.sum((0, 1)) / max(float(b.sum()), 1e-6), a.shape)
    for a, b in reversed(levels):
        up = cv2.resize(fill, (a.shape[1], a.shape[0]), interpolation=cv2.INTER_LINEAR)
        up = up.reshape(a.shape)
        # a is premultiplied by b. A cell the photo covers even partly keeps the photo's own
        # mean colour there; only empty cells take the coarser level's: each level carries the
        # edge's colours one cell (2^level px) farther out.
        norm = a / np.maximum(b, 1e-6)
        wgt = np.clip(b * 8.0, 0.0, 1.0)
        fill = norm * wgt + up * (1.0 - wgt)
    fill = cv2.resize(fill, (w, h), interpolation=cv2.INTER_LINEAR)
    c = cover[:, :, None]
    return np.clip(frame * c + fill * (1.0 - c) + 0.5, 0, 255).astype(np.uint8)


def frame_portrait(
    source: str | Path | np.ndarray, width: int = 512, height: int = 512
) -> Portrait:
    """Load a portrait photo and frame it head-and-shoulders at (width, height).

    Args:
        source: a JPEG/PNG/WebP path (EXIF orientation honoured) or an (H, W, 3) uint8 RGB array.
        width, height: output size in pixels (e.g. 512x512, 384x384, 768x768, 720x1280).

    Returns:
        The framed :class:`Portrait`; with several faces in the photo, the largest.

    Raises:
        InputError: unreadable file, no face, a face under :data:`MIN_FACE_PX` tall in the
            source, or a head turned more than :data:`MAX_YAW_DEG`.
    """
    _check_size(width, height)
    image, name = load_image(source)
    faces = detect_faces(image)
    if not faces:
        raise InputError(f"no face found in {name}: use a photo with one face, facing the camera")
    if len(faces) > 1:
        log.info(
            "found %d faces in %s; using the largest (%.0f px wide)",
            len(faces),
            name,
            faces[0].width,
        )
    lm = face_landmarks(image, faces[0])
    fh = face_height(lm)
    if fh < MIN_FACE_PX:
        raise InputError(
            f"face in {name} is too small: {fh:.0f} px from forehead to chin, "
            f"needs at least {MIN_FACE_PX} px (use a larger or closer photo)"
        )
    yaw = math.degrees(head_pose(lm)[0])
    if abs(yaw) > MAX_YAW_DEG:
        raise InputError(
            f"head in {name} is turned {abs(yaw):.0f} degrees to the side "
            f"(at most {MAX_YAW_DEG:.0f}): use a photo facing the camera"
        )

    scale = FACE_FRACTION * height / fh
    mesh = lm[:468, :2]
    cx = float(mesh[:, 0].min() + mesh[:, 0].max()) / 2.0
    ey = float(eye_centre(lm)[1])
    left = cx - width / (2.0 * scale)
    top = ey - EYE_LINE * height / scale
    frame, cover = _warp(image, scale, left, top, width, height)
    if cover.min() < 0.999:
        _log_extension(name, image.shape, left, top, width / scale, height / scale)
        frame = _fill_outside(frame, cover)

    moved = lm.copy()
    moved[:, 0] = (lm[:, 0] - left) * scale
    moved[:, 1] = (lm[:, 1] - top) * scale
    moved[:, 2] = lm[:, 2] * scale
    framed_lm = refine_landmarks(frame, moved)
    return Portrait(frame, framed_lm, person_mask(frame), len(faces))


def _log_extension(name: str, shape: tuple, left: float, top: float, cw: float, ch: float) -> None:
    h, w = shape[:2]
    sides = {
        "top": -top,
        "bottom": top + ch - h,
        "left": -left,
        "right": left + cw - w,
    }
    past = ", ".join(f"{k} {v / ch:.0%}" for k, v in sides.items() if v > 0.5)
    log.info(
        "framing %s reaches past the photo's edge (%s of the frame height); "
        "extended by repeating and blurring the edge",
        name,
        past,
    )
