"""Blinks and gaze: the eyelid slides over the eye, the iris shifts inside the eye opening.

A blink is an occlusion, not a squash: the upper lid's skin (the band between the lid line and
a line above it) is stretched down column by column until the lid line meets the lower lid,
and below the moving lid line the eye stays as it is. Per image column this is an exact 1-D
map, so the closed lid has no holes and no smear; the lid line is drawn with sub-pixel coverage
and a slight lash shadow. Gaze moves the eye's content (the iris with it) inside the opening,
fading to nothing at the lids and corners. Both work on the source photo, before the mesh warp
carries the eyes along with the head.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from talkloop.pipeline.models.portrait import topology as topo

LID_SKIN = 0.28  # height of the stretched lid skin, in eye widths (less bends glasses less)
GAZE_X = 0.14  # content shift at gaze 1, in eye widths
GAZE_Y = 0.07
LASH_SHADOW = 0.18


@dataclass
class _Eye:
    box: tuple[int, int, int, int]  # y0, y1, x0, x1 in the photo
    upper: np.ndarray  # (w,) upper lid row per crop column (crop rows)
    lower: np.ndarray  # (w,) lower lid row
    width: float  # eye width in pixels
    across: np.ndarray  # (w,) 0 at the corners, 1 mid-eye


def _eye(image_shape: tuple[int, int], lm: np.ndarray, upper: tuple, lower: tuple) -> _Eye:
    h, w = image_shape
    up, lo = lm[list(upper), :2], lm[list(lower), :2]
    x_a, x_b = min(up[0, 0], up[-1, 0]), max(up[0, 0], up[-1, 0])
    width = float(np.linalg.norm(up[0] - up[-1]))
    pad = 0.2 * width
    x0, x1 = int(np.floor(x_a - pad)), int(np.ceil(x_b + pad)) + 1
    y0 = int(np.floor(up[:, 1].min() - LID_SKIN * width - 3))
    y1 = int(np.ceil(lo[:, 1].max() + 0.15 * width)) + 1
    x0, x1, y0, y1 = max(0, x0), min(w, x1), max(0, y0), min(h, y1)
    xs = np.arange(x0, x1, dtype=np.float64)
    ou, ol = np.argsort(up[:, 0]), np.argsort(lo[:, 0])
    y_up = np.interp(xs, up[ou, 0], up[ou, 1])
    y_lo = np.interp(xs, lo[ol, 0], lo[ol, 1])
    y_lo = np.maximum(y_lo, y_up)  # a lid never crosses the other
    across = np.clip((xs - x_a) / max(x_b - x_a, 1.0), 0, 1)
    return _Eye((y0, y1, x0, x1), y_up - y0, y_lo - y0, width, np.sin(np.pi * across))


class EyeWarp:
    """Per-photo eye geometry; ``apply`` blinks / moves the eyes of one frame's source image.

    Args:
        landmarks: (478, 3) landmarks of the photo.
        image_shape: (height, width) of the photo.
    """

    def __init__(self, landmarks: np.ndarray, image_shape: tuple[int, int]) -> None:
        self.eyes = [
            _eye(image_shape, landmarks, topo.RIGHT_EYE_UPPER, topo.RIGHT_EYE_LOWER),
            _eye(image_shape, landmarks, topo.LEFT_EYE_UPPER, topo.LEFT_EYE_LOWER),
        ]

    def apply(self, photo: np.ndarray, out: np.ndarray, blink: float, gx: float, gy: float) -> None:
        """Write the eyes of ``photo`` with the lid closed by ``blink`` and gaze into ``out``.

        Args:
            photo: (H, W, 3) uint8 the photo (read only).
            out: (H, W, 3) uint8 the frame's source image; only the eye boxes are written.
            blink: 0 open (as in the photo) .. 1 closed.
            gx, gy: gaze in [-1, 1]; positive looks to the image right / down.
        """
        for e in self.eyes:
            y0, y1, x0, x1 = e.box
            h, w = y1 - y0, x1 - x0
            ys = np.arange(h, dtype=np.float32)[:, None]  # (h, 1)
            xs = np.arange(w, dtype=np.float32)[None, :]  # (1, w)
            gap = (e.lower - e.upper).astype(np.float32)[None]  # (1, w)
            top = e.upper.astype(np.float32)[None]
            ref = top - LID_SKIN * e.width  # the lid skin's top row: never moves
            # The lid line moves down to just over the lower lid (half a pixel onto it).
            target = top + gap + 0.5 * np.minimum(gap, 1.0)
            lid = top + blink * (target - top)  # (1, w) the moved lid line
            stretch = (top - ref) / np.maximum(lid - ref, 1e-3)
            lid_y = np.where(ys < ref, ys, ref + (ys - ref) * stretch)  # (h, w)
            # Gaze: shift the content inside the opening, nothing at the lids and corners.
            inside = np.clip((ys - top) / np.maximum(gap, 1e-3), 0, 1)
            bump = np.sin(np.pi * inside) * e.across[None].astype(np.float32)
            eye_x = xs - gx * GAZE_X * e.width * bump
            eye_y = ys - gy * GAZE_Y * e.width * bump
            eye_x, eye_y = np.broadcast_to(eye_x, (h, w)), np.broadcast_to(eye_y, (h, w))
            crop = np.ascontiguousarray(photo[y0:y1, x0:x1])
            eye = cv2.remap(
                crop, eye_x.astype(np.float32), eye_y.astype(np.float32),
                cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE,
            )  # fmt: skip
            if blink <= 0.0:
                out[y0:y1, x0:x1] = eye
                continue
            skin = cv2.remap(
                crop, np.broadcast_to(xs, (h, w)).astype(np.float32), lid_y.astype(np.float32),
                cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE,
            ).astype(np.float32)  # fmt: skip
            # A light shadow of the lashes just above the moved lid line.
            closing = np.clip(blink * gap, 0, 2) / 2
            skin *= (1 - LASH_SHADOW * closing * np.exp(-(((ys - lid + 1.0) / 1.2) ** 2)))[
                ..., None
            ]
            cover = np.clip(lid - ys + 0.5, 0, 1)[..., None]  # sub-pixel lid line
            blend = skin * cover + eye.astype(np.float32) * (1 - cover)
            out[y0:y1, x0:x1] = np.clip(blend + 0.5, 0, 255).astype(np.uint8)
