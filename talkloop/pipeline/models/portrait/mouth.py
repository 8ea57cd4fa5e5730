"""The mouth interior where the lips part: cavity, upper and lower teeth, tongue.

It is painted in the output frame inside the moved inner-lip contour. Every layer hangs from a
jaw: the photo's own mouth interior (its teeth, where it shows them) and the upper teeth from
the upper lip (the skull), the lower teeth and the tongue from the lower lip (the jaw); each
layer is a fixed texture of this photo moved by a similarity fitted to its lip, so teeth and
identity are the same in every frame. Where the photo shows no teeth, the teeth are a template
coloured and lit from the photo. With the lips where the photo has them, the painted interior
is the photo's own pixels: neutral parameters reproduce the photo.
"""

from __future__ import annotations

import cv2
import numpy as np

from talkloop.pipeline.models.portrait import topology as topo

CAVITY = np.array([92.0, 28.0, 34.0])  # the back of the mouth at full light, RGB
TONGUE = np.array([190.0, 96.0, 102.0])
TEMPLATE_TEETH = np.array([238.0, 228.0, 205.0])  # ivory
AA_BITS = 3  # sub-pixel bits of the lip polygon


# Seams between the teeth across the mouth: central incisors widest, narrowing towards the
# corners (fixed, not random).
_HALF_SEAMS = np.array([0.0, 0.2, 0.36, 0.5, 0.62, 0.73, 0.83])
SEAMS = np.concatenate([-_HALF_SEAMS[:0:-1], _HALF_SEAMS])


def _similarity(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Least-squares similarity (rotation, uniform scale, shift) taking src to dst: (2, 3)."""
    ms, md = src.mean(0), dst.mean(0)
    a, b = src - ms, dst - md
    den = (a**2).sum()
    if den < 1e-9:
        return np.array([[1.0, 0.0, md[0] - ms[0]], [0.0, 1.0, md[1] - ms[1]]])
    c = (a * b).sum() / den
    s = (a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]).sum() / den
    rot = np.array([[c, -s], [s, c]])
    return np.c_[rot, md - rot @ ms]


def _invert(m: np.ndarray) -> np.ndarray:
    r_inv = np.linalg.inv(m[:, :2])
    return np.c_[r_inv, -r_inv @ m[:, 2]]


def _tooth_pattern(t: np.ndarray) -> np.ndarray:
    """Brightness of a row of teeth across the mouth (t in [-1, 1]): dark seams between teeth."""
    # The nearest seam is one of the two around t (the seams are sorted).
    i = np.searchsorted(SEAMS, t).clip(1, len(SEAMS) - 1)
    d = np.minimum(np.abs(t - SEAMS[i - 1]), np.abs(t - SEAMS[i]))
    return 1.0 - 0.16 * np.exp(-((d / 0.009) ** 2))


class MouthPainter:
    """Per-photo mouth textures; ``paint`` fills the opened mouth of one output frame.

    Args:
        image: (H, W, 3) uint8 the photo.
        landmarks: (478, 3) its landmarks.
    """

    def __init__(self, image: np.ndarray, landmarks: np.ndarray) -> None:
        self.image = image
        lm = landmarks[:, :2].astype(np.float64)
        self.src_up = lm[list(topo.LIPS_INNER_UPPER)]  # (11, 2) right corner to left
        self.src_lo = lm[list(topo.LIPS_INNER_LOWER)]
        self.centre_x = float((self.src_up[0, 0] + self.src_up[-1, 0]) / 2)
        self.half_width = float(max(abs(self.src_up[-1, 0] - self.src_up[0, 0]) / 2, 1.0))
        self.gap = float(np.linalg.norm(lm[13] - lm[14]))
        h, w = image.shape[:2]
        poly = np.concatenate([self.src_up, self.src_lo[-2:0:-1]])
        inside = np.zeros((h, w), np.uint8)
        pts = np.round(poly * (1 << AA_BITS)).astype(np.int32)
        cv2.fillPoly(inside, [pts], 255, cv2.LINE_AA, AA_BITS)
        self.inside = inside.astype(np.float32) / 255.0  # (H, W) the photo's mouth opening
        pix = image[inside > 127].astype(np.float32)
        lips = np.zeros((h, w), np.uint8)
        outer = np.concatenate(
            [lm[list(topo.LIPS_OUTER_UPPER)], lm[list(topo.LIPS_OUTER_LOWER)][-2:0:-1]]
        )
        cv2.fillPoly(lips, [np.round(outer).astype(np.int32)], 1)
        lips[inside > 127] = 0
        lip_rgb = np.median(image[lips > 0].reshape(-1, 3), 0) if lips.any() else TONGUE
        cheeks = np.concatenate(
            [image[_disc(lm[i], 0.12 * self.half_width, (h, w))] for i in (50, 280)]
        )
        skin_l = float(np.median(cheeks.mean(1))) if len(cheeks) else 160.0
        # Teeth in the photo: enough bright, grey-ish pixels between the lips.
        bright = (pix.mean(1) > 0.8 * skin_l) & (np.ptp(pix, 1) < 70) if len(pix) else pix[:0, 0]
        self.photo_teeth = bool(len(pix) >= 30 and bright.mean() > 0.2)
        if self.photo_teeth:
            self.teeth_rgb = np.median(pix[bright], 0)
        else:
            # Lit like the face and tinted by the photo's white balance (the skin's cast).
            skin_rgb = np.median(cheeks, 0) if len(cheeks) else np.full(3, skin_l)
            cast = (skin_rgb / max(skin_rgb.mean(), 1.0)) ** 0.35
            self.teeth_rgb = np.clip(
                TEMPLATE_TEETH * cast * np.clip(skin_l / 165.0, 0.6, 1.05), 0, 255
            )
        light = np.clip(skin_l / 175.0, 0.5, 1.1)
        self.cavity_rgb = CAVITY * light
        self.tongue_rgb = 0.5 * TONGUE * light + 0.5 * lip_rgb * 0.9

    def paint(
        self,
        frame: np.ndarray,
        up: np.ndarray,
        lo: np.ndarray,
        skull: np.ndarray,
        teeth: float,
        tongue: float,
    ) -> None:
        """Paint the mouth interior into ``frame`` (in place).

        Args:
            frame: (H, W, 3) uint8 the warped frame.
            up, lo: (11, 2) the moved inner upper / lower lip contours in frame pixels.
            skull: (11, 2) where the inner upper lip would be under the head's motion alone:
                the upper teeth hang from the skull, not from the lip.
            teeth: 0..1 how much of the teeth shows.
            tongue: 0..1 how high the tongue rises.
        """
        h, w = frame.shape[:2]
        poly = np.concatenate([up, lo[-2:0:-1]])
        x0, y0 = np.floor(poly.min(0)).astype(int) - 2
        x1, y1 = np.ceil(poly.max(0)).astype(int) + 3
        x0, y0, x1, y1 = max(0, x0), max(0, y0), min(w, x1), min(h, y1)
        if x1 - x0 < 2 or y1 - y0 < 2:
            return
        ch, cw = y1 - y0, x1 - x0
        mask = np.zeros((ch, cw), np.uint8)
        pts = np.round((poly - (x0, y0)) * (1 << AA_BITS)).astype(np.int32)
        cv2.fillPoly(mask, [pts], 255, cv2.LINE_AA, AA_BITS)
        if not mask.any():
            return
        m = mask.astype(np.float32)[..., None] / 255.0
        gx = np.arange(x0, x1, dtype=np.float64)[None]  # (1, cw)
        gy = np.arange(y0, y1, dtype=np.float64)[:, None]  # (ch, 1)
        a_up = _similarity(self.src_up, skull)
        a_lo = _similarity(self.src_lo, lo)
        # Frame pixels in the photo's coordinates, as seen by the upper / lower jaw.
        iu, il = _invert(a_up), _invert(a_lo)
        ux = iu[0, 0] * gx + iu[0, 1] * gy + iu[0, 2]
        uy = iu[1, 0] * gx + iu[1, 1] * gy + iu[1, 2]
        lx = il[0, 0] * gx + il[0, 1] * gy + il[0, 2]
        ly = il[1, 0] * gx + il[1, 1] * gy + il[1, 2]
        t_up = (ux - self.centre_x) / self.half_width  # across the mouth, -1..1
        t_lo = (lx - self.centre_x) / self.half_width
        ou, ol = np.argsort(self.src_up[:, 0]), np.argsort(self.src_lo[:, 0])
        below_up = uy - np.interp(ux, self.src_up[ou, 0], self.src_up[ou, 1])  # px under the lip
        above_lo = np.interp(lx, self.src_lo[ol, 0], self.src_lo[ol, 1]) - ly
        gap_now = float(np.linalg.norm(up[5] - lo[5]))
        growth = gap_now - self.gap
        scale = self.half_width

        # Cavity: darker towards the corners and the roof.
        near_lip = np.minimum(below_up, above_lo) / max(0.5 * gap_now, 1.0)
        shade = (1 - 0.5 * np.clip(t_up, -1, 1) ** 2) * (1 - 0.5 * np.clip(near_lip, 0, 1))
        img = self.cavity_rgb[None, None] * shade[..., None]
        # Tongue: a mound on the floor of the mouth, rising with ``tongue``.
        t_top = (0.12 + 0.38 * tongue) * max(gap_now, 1.0)
        tongue_a = np.clip(t_top * (1 - (t_lo / 0.6) ** 2) - above_lo + 0.5, 0, 1)
        tongue_shade = 0.75 + 0.25 * np.clip(above_lo / max(t_top, 1.0), 0, 1)
        tongue_rgb = self.tongue_rgb[None, None] * (tongue_shade * (1 - 0.3 * t_lo**2))[..., None]
        img = _over(img, tongue_rgb, tongue_a)
        # Lower teeth: a row standing on the lower lip, from the jaw.
        lower_h = teeth * min(0.14 * max(gap_now, 0.0), 0.1 * scale)
        lower_a = np.clip(lower_h - above_lo + 0.5, 0, 1) * np.clip((0.65 - np.abs(t_lo)) * 6, 0, 1)
        lower_a *= np.clip(above_lo + 0.5, 0, 1)
        lower_rgb = self._teeth(t_lo, above_lo, max(lower_h, 1.0), 0.95)
        img = _over(img, lower_rgb, lower_a)
        # Upper teeth from the template where the photo shows none.
        if not self.photo_teeth:
            upper_h = teeth * min(0.42 * max(gap_now, 0.0), 0.26 * scale)
            upper_a = np.clip(upper_h - below_up + 0.5, 0, 1)
            upper_a *= np.clip((0.8 - np.abs(t_up)) * 6, 0, 1) * np.clip(below_up + 0.5, 0, 1)
            upper_rgb = self._teeth(t_up, below_up, max(upper_h, 1.0), 1.0)
            img = _over(img, upper_rgb, upper_a)
        # The photo's own interior, hung from the upper lip. Where the lips are no further
        # apart than in the photo it is all of the interior (the photo, exactly); as they
        # part, its lower part (or, without teeth, all of it: a closed lip line) fades into
        # the layers above.
        fade = float(np.clip(growth / 3.0, 0.0, 1.0))
        if fade < 1.0 or self.photo_teeth:
            # Teeth go on up under the upper lip: where a raised lip shows more of them than
            # the photo did, continue each tooth's top row upwards.
            top = np.interp(ux, self.src_up[ou, 0], self.src_up[ou, 1]) + 1.5
            sx = ux.astype(np.float32)
            sy = (uy + fade * np.maximum(top - uy, 0) if self.photo_teeth else uy).astype(
                np.float32
            )
            patch = cv2.remap(
                self.image, sx, sy, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
            ).astype(np.float32)
            # Once the lips part, only what lay between the photo's lips (not its lip skin).
            was_inside = cv2.remap(self.inside, sx, sy, cv2.INTER_LINEAR)
            drop = 1 - was_inside
            if self.photo_teeth:
                g = max(self.gap, 1.0)
                drop = np.maximum(drop, np.clip((below_up - 0.8 * g) / (0.2 * g), 0, 1))
            else:
                drop = np.ones_like(below_up)
            img = _over(img, patch, 1 - fade * drop)
        region = frame[y0:y1, x0:x1].astype(np.float32)
        frame[y0:y1, x0:x1] = np.clip(region * (1 - m) + img * m + 0.5, 0, 255).astype(np.uint8)

    def _teeth(self, t: np.ndarray, depth: np.ndarray, height: float, light: float) -> np.ndarray:
        """Teeth colour: seams between the teeth, darker towards the corners and in the lip's
        shadow at the gum line."""
        a = np.clip(np.abs(t), 0, 1)
        lum = _tooth_pattern(np.clip(t, -1, 1)) * (1 - 0.45 * a**2)
        lum = lum * (0.72 + 0.28 * np.clip(depth / max(0.35 * height, 1.0), 0, 1)) * light
        return self.teeth_rgb[None, None] * lum[..., None]


def _over(base: np.ndarray, top: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    a = alpha[..., None]
    return base * (1 - a) + top * a


def _disc(centre: np.ndarray, radius: float, shape: tuple[int, int]) -> np.ndarray:
    yy, xx = np.ogrid[: shape[0], : shape[1]]
    return (xx - centre[0]) ** 2 + (yy - centre[1]) ** 2 <= max(radius, 2.0) ** 2
