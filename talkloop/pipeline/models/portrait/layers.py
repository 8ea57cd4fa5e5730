"""Person over background: the warped person is laid over a still background plate.

The head moves over the background: the person layer's alpha (the person mask, grown by a few
pixels so its soft edge and a hairline of background travel with it) is warped with the person,
and where the head moves away it uncovers the background plate: the photo with the person
inpainted (coarsely: only thin strips of it ever show). Outside the grown mask the plate is
the photo itself, so pixels the person does not reach are the photo's, bit for bit.
"""

from __future__ import annotations

import cv2
import numpy as np

GROW = 0.008  # the layer reaches this far (in frame heights) beyond the mask's half level
RAMP = 0.006  # and fades out over this much further
PLATE_SCALE = 4  # the plate is inpainted at 1/4 resolution


def _disc(radius: int) -> np.ndarray:
    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))


class PersonLayer:
    """The person layer's alpha and the background plate of one photo.

    Args:
        image: (H, W, 3) uint8 the photo.
        mask: (H, W) float32 in [0, 1], 1 = the person.

    Attributes:
        alpha: (H, W) float32 layer alpha, 1 over the person and a few pixels beyond.
        plate: (H, W, 3) uint8 the background: the photo where ``alpha < 1``, inpainted under it.
    """

    def __init__(self, image: np.ndarray, mask: np.ndarray) -> None:
        h, w = mask.shape
        grow = max(1, round(GROW * h))
        ramp = max(1, round(RAMP * h))
        core = cv2.dilate((mask > 0.5).astype(np.uint8), _disc(grow))
        wide = cv2.dilate(core, _disc(ramp)).astype(np.float32)
        alpha = cv2.blur(wide, (2 * ramp + 1, 2 * ramp + 1))
        self.alpha = np.where(core > 0, 1.0, alpha).astype(np.float32)
        under = self.alpha >= 1.0
        small = (w // PLATE_SCALE, h // PLATE_SCALE)
        img_s = cv2.resize(image, small, interpolation=cv2.INTER_AREA)
        hole = cv2.resize(under.astype(np.uint8), small, interpolation=cv2.INTER_NEAREST)
        hole = cv2.dilate(hole, _disc(1))  # the hairline at the hole's edge is not background
        filled = cv2.inpaint(img_s, hole, 3, cv2.INPAINT_TELEA)
        filled = cv2.resize(filled, (w, h), interpolation=cv2.INTER_LINEAR)
        self.plate = np.where(under[..., None], filled, image)
