"""The photo's own expression, read from its landmarks (and, for its teeth, its pixels).

The rig moves the face from a neutral rest: relaxed mouth, lips closed, brows at rest. A photo
need not show that face: people smile for photos, part their lips and show their teeth. This
module measures how far the photo is from that rest, in the face's own units:

- the lips' opening (inner-lip gap at the middle of the mouth);
- how much of the closing the upper lip takes: where the photo shows its upper teeth, the upper
  lip is raised off them (a smile) and comes down over them to close; a dark opening without
  teeth is a dropped jaw, closed mostly by the lower lip;
- a smile: the mouth corners raised above the lips' middle (and the mouth widened);
- raised brows: brows far above the upper lids.

Vertical measures are in eye-line-to-subnasale distances (a head turned sideways foreshortens
the inter-ocular distance, not heights), widths in inter-ocular distances. The rest values
are those of relaxed faces; what natural faces vary by (a wide mouth, high brows) lies inside a
dead zone and is not read as expression.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from talkloop.pipeline.models.portrait import topology as topo

CLOSED_GAP = 0.012  # face heights: a photo whose lips part less than this counts as closed
# Corner lift (corners above the lips' middle) in eye-to-subnasale distances: relaxed mouths
# lie within +-0.05; a smile starts to count from SMILE_FROM and fully at SMILE_FROM + SPAN.
LIFT_REST = 0.02
SMILE_FROM, SMILE_SPAN = 0.06, 0.1
WIDTH_REST = 0.88  # mouth corner to corner, inter-ocular distances, at rest at most
BROW_REST, BROW_SPAN = 0.44, 0.12  # brows above the upper lids, eye-to-subnasale distances
UPPER_SHARE_DARK = 0.25  # upper lip's share of the closing where no teeth show
UPPER_SHARE_MAX = 0.7
AA_BITS = 3

CENTRE_PAIRS = (4, 5, 6)  # inner-lip pairs at the middle of the mouth (82/87, 13/14, 312/317)


@dataclass(frozen=True)
class PhotoExpression:
    """How the photo's face differs from the neutral rest.

    Attributes:
        gap_px: (11, 2) inner-lip opening per contour pair (lower minus upper lip), pixels.
        gap: opening at the middle of the mouth in face heights (of the closed face).
        closes: whether the rig closes the photo's lips (``gap`` above ``CLOSED_GAP``).
        upper_share: the upper lip's share of the closing, 0..1.
        smile: 0..1 how much the photo smiles (corners raised).
        corner_drop: pixels the mouth corners come down at rest.
        corner_in: pixels each mouth corner moves towards the middle at rest.
        brow: 0..1 how raised the brows are.
        teeth: whether the photo shows teeth between its lips.
    """

    gap_px: np.ndarray
    gap: float
    closes: bool
    upper_share: float
    smile: float
    corner_drop: float
    corner_in: float
    brow: float
    teeth: bool


def _smoothstep(x: float) -> float:
    x = min(max(x, 0.0), 1.0)
    return x * x * (3.0 - 2.0 * x)


def mouth_opening_mask(shape: tuple[int, int], landmarks: np.ndarray) -> np.ndarray:
    """(H, W) float32 in [0, 1]: where the photo's lips part (inside the inner-lip contour)."""
    lm = landmarks[:, :2].astype(np.float64)
    poly = np.concatenate(
        [lm[list(topo.LIPS_INNER_UPPER)], lm[list(topo.LIPS_INNER_LOWER)][-2:0:-1]]
    )
    inside = np.zeros(shape, np.uint8)
    cv2.fillPoly(
        inside, [np.round(poly * (1 << AA_BITS)).astype(np.int32)], 255, cv2.LINE_AA, AA_BITS
    )
    return inside.astype(np.float32) / 255.0


def cheek_pixels(image: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """(N, 3) uint8 the pixels of two small discs on the cheeks beside the mouth."""
    lm = landmarks[:, :2].astype(np.float64)
    half = abs(lm[308, 0] - lm[78, 0]) / 2
    h, w = image.shape[:2]
    yy, xx = np.ogrid[:h, :w]
    r = max(0.12 * half, 2.0)
    return np.concatenate(
        [image[(xx - lm[i, 0]) ** 2 + (yy - lm[i, 1]) ** 2 <= r * r] for i in (50, 280)]
    )


def skin_luma(image: np.ndarray, landmarks: np.ndarray) -> float:
    """Median brightness of the cheeks beside the mouth."""
    pix = cheek_pixels(image, landmarks)
    return float(np.median(pix.mean(1))) if len(pix) else 160.0


def teeth_mask(image: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """(H, W) bool: bright, grey-ish pixels between the photo's lips (teeth)."""
    inside = mouth_opening_mask(image.shape[:2], landmarks) > 0.5
    rgb = image.astype(np.float32)
    bright = (rgb.mean(2) > 0.8 * skin_luma(image, landmarks)) & (np.ptp(rgb, 2) < 70)
    return inside & bright


def shows_teeth(image: np.ndarray, landmarks: np.ndarray) -> bool:
    """Whether the photo shows teeth: enough of its mouth opening is teeth."""
    inside = mouth_opening_mask(image.shape[:2], landmarks) > 0.5
    n = int(inside.sum())
    return bool(n >= 30 and teeth_mask(image, landmarks).sum() > 0.2 * n)


def read_expression(image: np.ndarray, landmarks: np.ndarray) -> PhotoExpression:
    """Measure the photo's expression (see the module docstring).

    Args:
        image: (H, W, 3) uint8 the photo.
        landmarks: (478, 3) its landmarks in pixels.
    """
    lm = landmarks[:, :2].astype(np.float64)
    eye_r = lm[list(topo.RIGHT_EYE_UPPER + topo.RIGHT_EYE_LOWER)].mean(0)
    eye_l = lm[list(topo.LEFT_EYE_UPPER + topo.LEFT_EYE_LOWER)].mean(0)
    iod = float(np.linalg.norm(eye_l - eye_r))
    ex = (eye_l - eye_r) / iod
    ey = np.array([-ex[1], ex[0]])

    def v(i: int | list[int]) -> float:
        return float(np.mean((lm[i] - eye_r) @ ey))

    eye_line = v([33, 133, 263, 362])
    unit = max(v(2) - eye_line, 1.0)  # eye line to subnasale, pixels
    up, lo = lm[list(topo.LIPS_INNER_UPPER)], lm[list(topo.LIPS_INNER_LOWER)]
    gap_px = lo - up  # (11, 2)
    centre = list(CENTRE_PAIRS)
    gap_v = float(np.mean(gap_px[centre] @ ey))
    middle = float(np.mean((0.5 * (up[centre] + lo[centre]) - eye_r) @ ey))
    closes_jaw = max(gap_v, 0.0)  # what closing moves the chin up by, at most
    face_h = float(np.linalg.norm(lm[topo.FOREHEAD_TOP] - lm[topo.CHIN])) - 0.5 * closes_jaw
    gap = max(gap_v, 0.0) / max(face_h, 1.0)
    closes = gap > CLOSED_GAP

    teeth = shows_teeth(image, landmarks)
    share = UPPER_SHARE_DARK
    if closes and teeth:
        # The upper lip comes down to the lowest teeth pixels under the middle of the mouth.
        mask = teeth_mask(image, landmarks)
        shares = []
        for k in centre:
            col = np.linspace(up[k], lo[k], 24)
            hits = [j for j, (x, y) in enumerate(col) if mask[int(round(y)), int(round(x))]]
            if hits:
                shares.append(hits[-1] / (len(col) - 1))
        if shares:
            share = float(np.clip(np.median(shares), UPPER_SHARE_DARK, UPPER_SHARE_MAX))

    lift = (middle - v([61, 291])) / unit
    smile = _smoothstep((lift - SMILE_FROM) / SMILE_SPAN)
    width = float(np.linalg.norm(lm[291] - lm[61])) / iod
    # At rest the corners sit level with where the closed lips meet (the seam), not with the
    # middle of the photo's gap.
    seam = middle + (share - 0.5) * max(gap_v, 0.0) if closes else middle
    corner_drop = smile * max((seam - v([61, 291])) / unit - LIFT_REST, 0.0) * unit
    corner_in = smile * max(width - WIDTH_REST, 0.0) * iod / 2
    brows = list(topo.RIGHT_BROW[-3:] + topo.LEFT_BROW[-3:])  # the brows' inner halves
    brow_h = (v([159, 386]) - v(brows)) / unit
    brow = float(np.clip((brow_h - BROW_REST) / BROW_SPAN, 0.0, 1.0))
    return PhotoExpression(
        gap_px=gap_px,
        gap=gap,
        closes=closes,
        upper_share=share,
        smile=smile,
        corner_drop=corner_drop,
        corner_in=corner_in,
        brow=brow,
        teeth=teeth,
    )
