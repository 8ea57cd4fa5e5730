"""The mouth between the moved lips: the interior where they part, lip contact where they meet.

The interior is a stack of layers, each a fixed texture of this photo made once and hung from a
jaw, so the teeth are the same in every frame: the upper teeth ride the skull, the lower teeth
and the tongue the lower jaw (the rig's teeth anchors give both frames as similarities), over a
dark cavity whose light follows the opening. The tongue's back shows low in every open mouth,
rising out of the cavity's shade, and its parameter lifts it further. Where the photo shows its
upper teeth they are the photo's own pixels (continued up under the upper lip, and at the sides
down under the lower lip to the front teeth's edge line; the lip the face mesh's lip lines take
in along the lower lip, told by its colour, left out); otherwise, and for the lower teeth
always, a template coloured and lit from the photo. The lips' inner edges shade the layers
(the upper lip's shadow, no drawn outline), and until the lips part well the teeth and tongue
lie in their shadow (a slit shows them dim, never as a bright line).

The opening is the moved inner-lip polygon with rounded ends: its level set after a blur as
wide as a fraction of the opening, so the lips stay in contact for a short length at each
corner and never meet in a point. Where they are in contact (those corners, and all of the
mouth at rest on a photo that parts its lips) the warp shows the lips themselves: the photo it
warps has the gap between its lips filled with each lip's own colour (``closed_lip_source``),
so closing squeezes lip, not teeth, into the seam, which is shaded darker towards the corners.
A photo whose own lips are closed keeps its own lip line there instead. Where an open mouth's
lips touch at its rounded corners, the painter lays the lips' colours from around the contact
over whatever the stretched warp brought there.
"""

from __future__ import annotations

import cv2
import numpy as np

from talkloop.pipeline.models.portrait import topology as topo
from talkloop.pipeline.models.portrait.neutral import (
    CENTRE_PAIRS,
    PhotoExpression,
    cheek_pixels,
    mouth_opening_mask,
    skin_luma,
    teeth_mask,
)

CAVITY = np.array([66.0, 27.0, 29.0])  # the back of the mouth at full light, RGB
TONGUE = np.array([190.0, 96.0, 102.0])
TEMPLATE_TEETH = np.array([238.0, 228.0, 205.0])  # ivory
AA_BITS = 3  # sub-pixel bits of the lip polygon
# Teeth geometry in face heights of the neutral face, from the lips' seam at rest.
UPPER_EDGE = 0.01  # the upper incisors' edge lies this far below the seam (behind the lower lip)
LOWER_EDGE = -0.008  # the lower incisors' edge this far above it (below: behind the lower lip)
TEETH_ARC = 0.012  # how far the upper teeth's edge rises from the middle to the corners
UPPER_TEETH = 0.09  # visible height the upper teeth texture spans (more hides under the lip)
LOWER_TEETH = 0.07
TONGUE_REST = -0.012  # the tongue's top this far below the lower teeth's edge (jaw frame)
TONGUE_RISE = 0.025  # how far tongue 1 lifts it (plus half the jaw's opening)
TONGUE_SHOW = 0.15  # share of the jaw's opening the tongue rises at tongue 0 (its back, seen)
TONGUE_FADE = 0.02  # how far below its top edge the tongue comes out of the cavity's shade
TEETH_LIT = 0.06  # openings (face heights) from which the teeth are fully lit
TEETH_DARK = 0.12  # their share of the light in a closing slit
SHADOW = 0.3  # the light in the lips' shadow: this share of the lips' colour
ROUND = 0.2  # corner rounding: blur sigma as a share of the widest opening
CONTACT_BLUR = 2.0  # px: how far from the lips' contact their colours are taken
STOMION = 0.22  # darkness of the seam where the lips meet (a photo that parts its lips)
STOMION_CLOSED = 0.0  # ... on a photo whose lips are closed (its own lip line is kept)
# (R - G) / luma: the default photo's teeth lie at 0.04-0.13, its lips at 0.16-0.42 (5th-95th
# percentiles); a pixel bright as a tooth counts as tooth below TOOTH_RED, as lip above LIP_RED.
TOOTH_RED = 0.15
LIP_RED = 0.25
_EDGE_SEARCH = tuple(float(k) for k in range(7))  # px in from a lip line where teeth may begin


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


def _seam_distance(t: np.ndarray, seams: np.ndarray) -> np.ndarray:
    """Distance (in t) from each t to the nearest of the sorted ``seams``."""
    i = np.searchsorted(seams, t).clip(1, len(seams) - 1)
    return np.minimum(np.abs(t - seams[i - 1]), np.abs(t - seams[i]))


def _over(base: np.ndarray, top: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """``top`` over ``base`` (both (h, w, 3) float32) with ``alpha`` (h, w) float32."""
    alpha = np.ascontiguousarray(alpha, np.float32)
    return cv2.blendLinear(
        np.ascontiguousarray(top, np.float32), np.ascontiguousarray(base, np.float32),
        alpha, 1.0 - alpha,
    )  # fmt: skip


def _edge_offset(tooth: np.ndarray, rows: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """How far in from a lip line the teeth begin: the index (in pixels, ``_EDGE_SEARCH``) of the
    first of ``rows`` (sample maps stepping in from the line) where ``tooth`` reaches a half;
    0 where none does (the corners, beyond the teeth, keep the line)."""
    found = np.stack([cv2.remap(tooth, px, py, cv2.INTER_LINEAR) >= 0.5 for px, py in rows])
    return np.where(found.any(0), found.argmax(0), 0).astype(np.float32)


def closed_lip_source(image: np.ndarray, landmarks: np.ndarray, share: float) -> np.ndarray:
    """The photo with the gap between its lips filled by the lips themselves.

    Closing the lips squeezes the gap's triangles to nothing, but bilinear sampling at the seam
    and the contact strips at the corners still read what lay between the lips: teeth, the
    dark of the mouth. Here each column of the gap takes its lip's own pixels, mirrored about
    the lip's inner edge (from the inner part of the lip only, however wide the gap), the upper
    lip down to the seam (``share`` of the gap), the lower lip up to it; dark corners just
    outside the inner-lip contour are inpainted from the lips around them.

    Args:
        image: (H, W, 3) uint8 the photo.
        landmarks: (478, 3) its landmarks.
        share: the upper lip's share of the closing.

    Returns:
        (H, W, 3) uint8 a copy of the photo, changed only around the mouth.
    """
    lm = landmarks[:, :2].astype(np.float64)
    h, w = image.shape[:2]
    out = image.copy()
    outer = lm[list(topo.LIPS_OUTER_UPPER + topo.LIPS_OUTER_LOWER)]
    pad = 4
    x0, y0 = np.maximum(np.floor(outer.min(0)).astype(int) - pad, 0)
    x1, y1 = np.minimum(np.ceil(outer.max(0)).astype(int) + pad + 1, (w, h))
    xs = np.arange(x0, x1, dtype=np.float64)[None]
    ys = np.arange(y0, y1, dtype=np.float64)[:, None]

    def edge(contour: tuple[int, ...]) -> np.ndarray:
        c = lm[list(contour)]
        o = np.argsort(c[:, 0])
        return np.interp(xs, c[o, 0], c[o, 1])

    top, bot = edge(topo.LIPS_INNER_UPPER), edge(topo.LIPS_INNER_LOWER)
    bot = np.maximum(bot, top)
    seam = top + share * (bot - top)
    # Each side of the seam takes its lip's inner band (a few rows beyond the lip's edge, the
    # same in every row: the gap only ever shrinks, any structure in it would be squeezed into
    # streaks), smoothed along the mouth so no column stands out.
    band = []
    for edge_y, out_dir in ((top, -1.0), (bot, 1.0)):
        acc = np.zeros((1, x1 - x0, 3), np.float32)
        for k in (1.5, 2.5, 3.5):
            yk = (edge_y + out_dir * k).astype(np.float32)
            acc += cv2.remap(image, xs.astype(np.float32), yk, cv2.INTER_LINEAR,
                             borderMode=cv2.BORDER_REPLICATE).astype(np.float32) / 3  # fmt: skip
        band.append(cv2.GaussianBlur(acc, (5, 1), 0))
    mirrored = np.where((ys < seam)[..., None], band[0], band[1])  # (ch, cw, 3)
    inside = mouth_opening_mask((h, w), landmarks)[y0:y1, x0:x1]
    grown = cv2.dilate(inside, np.ones((3, 3), np.uint8))  # the contour's own pixel too
    crop = out[y0:y1, x0:x1]
    crop[:] = np.clip(_over(crop.astype(np.float32), mirrored.astype(np.float32), grown) + 0.5,
                      0, 255).astype(np.uint8)  # fmt: skip
    # What the contour leaves out: the dark of the mouth reaching past the corners, and teeth
    # a pixel outside it, inpainted from the lips around them.
    lips = np.zeros(crop.shape[:2], np.uint8)
    ring = np.concatenate(
        [lm[list(topo.LIPS_OUTER_UPPER)], lm[list(topo.LIPS_OUTER_LOWER)][-2:0:-1]]
    )
    cv2.fillPoly(lips, [np.round(ring - (x0, y0)).astype(np.int32)], 1)
    rgb = crop.astype(np.float32)
    luma = rgb @ np.array([0.299, 0.587, 0.114], np.float32)
    lip_l = float(np.median(luma[lips > 0])) if lips.any() else 128.0
    near = np.zeros(crop.shape[:2], np.uint8)
    half = abs(lm[308, 0] - lm[78, 0]) / 2
    for i in (78, 308):
        cv2.circle(near, tuple(np.round(lm[i] - (x0, y0)).astype(int)), int(0.3 * half) + 3, 1, -1)
    band = (cv2.dilate((inside > 0.5).astype(np.uint8), np.ones((5, 5), np.uint8)) > 0) & (
        grown < 0.5
    )
    pale = (luma > lip_l + 12) & (np.ptp(rgb, 2) < 0.8 * np.ptp(np.median(rgb[lips > 0], 0)) + 20)
    fill = ((luma < 0.78 * lip_l) & (near > 0)) | (band & pale)
    if fill.any():
        fill = cv2.dilate(fill.astype(np.uint8), np.ones((3, 3), np.uint8))
        crop[:] = cv2.inpaint(np.ascontiguousarray(crop), fill, 3, cv2.INPAINT_TELEA)
    return out


class MouthPainter:
    """Per-photo mouth textures; ``paint`` fills the mouth between the moved lips of a frame.

    Args:
        image: (H, W, 3) uint8 the photo.
        landmarks: (478, 3) its landmarks.
        expression: the photo's expression (``neutral.read_expression``).
        seam: (11, 2) where the closed lips meet at rest (photo pixels): the teeth anchors.
        axes: (2, 2) the face frame's u and v axes (rows) in image axes.
        scale: the neutral face's height in pixels.
    """

    def __init__(
        self,
        image: np.ndarray,
        landmarks: np.ndarray,
        expression: PhotoExpression,
        seam: np.ndarray,
        axes: np.ndarray,
        scale: float,
    ) -> None:
        self.image = image
        self.seam = seam.astype(np.float64)
        self.axes = axes
        self.scale = scale
        lm = landmarks[:, :2].astype(np.float64)
        self.src_up = lm[list(topo.LIPS_INNER_UPPER)]  # (11, 2) right corner to left
        self.src_lo = lm[list(topo.LIPS_INNER_LOWER)]
        self.gap = float(np.linalg.norm(lm[13] - lm[14]))
        self.closes = expression.closes
        self.photo_teeth = bool(expression.teeth and expression.closes)
        self.stomion = STOMION if expression.closes else STOMION_CLOSED
        h, w = image.shape[:2]
        inside = mouth_opening_mask((h, w), landmarks)
        lips = np.zeros((h, w), np.uint8)
        outer = np.concatenate(
            [lm[list(topo.LIPS_OUTER_UPPER)], lm[list(topo.LIPS_OUTER_LOWER)][-2:0:-1]]
        )
        cv2.fillPoly(lips, [np.round(outer).astype(np.int32)], 1)
        lips[inside > 0.5] = 0
        lip_rgb = np.median(image[lips > 0].reshape(-1, 3), 0) if lips.any() else TONGUE
        skin_l = skin_luma(image, landmarks)
        bright = teeth_mask(image, landmarks)
        if expression.teeth:
            self.teeth_rgb = np.median(image[bright].astype(np.float64), 0)
        else:
            # Lit like the face and tinted by the photo's white balance (the skin's cast).
            cheeks = cheek_pixels(image, landmarks)
            skin_rgb = np.median(cheeks, 0) if len(cheeks) else np.full(3, skin_l)
            cast = (skin_rgb / max(skin_rgb.mean(), 1.0)) ** 0.1
            self.teeth_rgb = np.clip(
                TEMPLATE_TEETH * cast * np.clip(skin_l / 160.0, 0.7, 1.05), 0, 255
            )
        light = np.clip(skin_l / 175.0, 0.5, 1.1)
        self.cavity_rgb = CAVITY * light
        self.lip_rgb = lip_rgb.astype(np.float64)
        self.tongue_rgb = 0.6 * TONGUE * light + 0.4 * lip_rgb * 0.9
        self.seam_rgb = (lip_rgb * np.array([0.55, 0.4, 0.42])).astype(np.float32)
        self._textures(bright, inside)

    # -- per photo ---------------------------------------------------------------------------

    def _textures(self, bright: np.ndarray, inside: np.ndarray) -> None:
        """The teeth and tongue textures (RGBA float32) on a box of the photo around the seam."""
        s = self.scale
        ex, ey = self.axes
        centre = self.seam.mean(0)
        half = max(float(np.abs((self.seam[[0, -1]] - centre) @ ex).max()), 2.0)
        self.half_width = half
        pad_x, up_y, down_y = 0.3 * half, UPPER_TEETH * s + 4, (TONGUE_REST + 0.15) * s
        corners = np.array([[-half - pad_x, -up_y], [half + pad_x, -up_y],
                            [-half - pad_x, down_y], [half + pad_x, down_y]])  # fmt: skip
        box_pts = centre + corners @ self.axes
        x0, y0 = np.floor(box_pts.min(0)).astype(int)
        x1, y1 = np.ceil(box_pts.max(0)).astype(int) + 1
        self.box = (x0, y0)
        gy, gx = np.mgrid[y0:y1, x0:x1].astype(np.float64)
        rel = np.stack([gx - centre[0], gy - centre[1]], -1)
        u, v = rel @ ex, rel @ ey  # (bh, bw) face frame, pixels, from the seam's centre
        su = (self.seam - centre) @ ex
        sv = (self.seam - centre) @ ey
        order = np.argsort(su)
        seam_v = np.interp(u, su[order], sv[order])  # the seam under each pixel
        t = u / half
        a = np.clip(np.abs(t), 0, 1)

        # Upper teeth: from their edge (UPPER_EDGE below the seam) upwards; the edges rise
        # towards the corners along the arch (the smile line) and the side teeth, further back,
        # lie in the cheeks' shadow.
        depth = seam_v + (UPPER_EDGE - TEETH_ARC * a**2) * s - v  # pixels above the edge
        notch = 0.35 * np.exp(-((_seam_distance(t, SEAMS) / 0.02) ** 2))  # rounded tooth corners
        alpha = np.clip(depth + 0.5 - notch, 0, 1) * np.clip((0.86 - a) * 6, 0, 1)
        alpha *= np.clip(UPPER_TEETH * s - depth, 0, 1)
        lum = (1 - 0.1 * np.exp(-((_seam_distance(t, SEAMS) / 0.009) ** 2))) * (1 - 0.6 * a**2)
        lum *= 0.88 + 0.12 * np.clip(depth / 2.0, 0, 1)  # a translucent edge
        upper = np.dstack([self.teeth_rgb[None, None] * lum[..., None], alpha])
        if self.photo_teeth:
            upper = self._photo_upper(bright, inside, (x0, y0, x1, y1), centre, u, v, t)
        self.upper = upper.astype(np.float32)

        # Lower teeth: narrower incisors, from their edge (LOWER_EDGE above the seam) down.
        seams_lo = SEAMS * 0.8
        depth = v - (seam_v - LOWER_EDGE * s)
        notch = 0.3 * np.exp(-((_seam_distance(t, seams_lo) / 0.02) ** 2))
        alpha = np.clip(depth + 0.5 - notch, 0, 1) * np.clip((0.72 - a) * 8, 0, 1)
        alpha *= np.clip(LOWER_TEETH * s - depth, 0, 1)
        lum = (1 - 0.12 * np.exp(-((_seam_distance(t, seams_lo) / 0.008) ** 2))) * (1 - 0.5 * a**2)
        lum *= 0.9 * (0.85 + 0.15 * np.clip(depth / 2.0, 0, 1))
        self.lower = np.dstack([self.teeth_rgb[None, None] * lum[..., None], alpha]).astype(
            np.float32
        )

        # Tongue: a mound on the floor of the mouth, lower at the sides. Its top edge is its
        # back, turning away into the dark of the mouth: it comes out of the cavity's shade
        # over TONGUE_FADE (no edge like a lip's), lit most a little below it.
        top = seam_v + (TONGUE_REST - LOWER_EDGE + 0.03 * a**2) * s
        depth = v - top
        alpha = np.clip(depth + 0.5, 0, 1) * np.clip((0.85 - a) * 5, 0, 1)
        back = np.clip(depth / (TONGUE_FADE * s), 0, 1)
        lum = (0.72 + 0.28 * (1 - a**2)) * (1 - 0.35 * np.clip(depth / (0.05 * s), 0, 1))
        lum *= 0.45 + 0.55 * back * back * (3 - 2 * back)
        self.tongue = np.dstack([self.tongue_rgb[None, None] * lum[..., None], alpha]).astype(
            np.float32
        )

    def _photo_upper(
        self,
        bright: np.ndarray,
        inside: np.ndarray,
        box: tuple[int, int, int, int],
        centre: np.ndarray,
        u: np.ndarray,
        v: np.ndarray,
        t: np.ndarray,
    ) -> np.ndarray:
        """The photo's own upper teeth: its pixels between the lips, continued up under the
        upper lip and, at the sides, down under the lower lip to the line of the front teeth's
        edges (a smiling lower lip hides the side teeth's lower part; a relaxed one shows it);
        what is not teeth there (the dark of the mouth) is left see-through."""
        x0, y0, x1, y1 = box
        img = self.image
        h, w = img.shape[:2]
        gy, gx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
        ou, ol = np.argsort(self.src_up[:, 0]), np.argsort(self.src_lo[:, 0])
        top = np.interp(gx[:1], self.src_up[ou, 0], self.src_up[ou, 1]).astype(np.float32)
        bottom = np.interp(gx, self.src_lo[ol, 0], self.src_lo[ol, 1])
        # Teeth-ness: all but the dark of the mouth (a tooth's shaded parts are still tooth).
        rgb_f = img.astype(np.float32)
        luma = rgb_f @ np.array([0.299, 0.587, 0.114], np.float32)
        teeth_l = float(np.median(luma[bright])) if bright.any() else 200.0
        dark = 0.25 * teeth_l
        teeth = np.clip((luma - dark) / (0.5 * teeth_l - dark), 0, 1)
        # The face mesh's inner lip lines may lie a pixel or two off the teeth's edges, taking in
        # a band of lip (as bright as a tooth: teeth-ness misses it), which the moved lips then
        # show as a pink line across the teeth. A tooth is told from lip by its colour, red
        # over green (``tooth``).
        red = (rgb_f[..., 0] - rgb_f[..., 1]) / np.maximum(luma, 1.0)
        tooth = teeth * np.clip((LIP_RED - red) / (LIP_RED - TOOTH_RED), 0, 1) * inside
        teeth = np.minimum(cv2.GaussianBlur(teeth, (3, 3), 0), inside)
        rgb = cv2.remap(img, gx, gy, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        alpha = cv2.remap(teeth, gx, gy, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
        # Along the lower lip (the lower part of the opening) the lip-coloured pixels are not
        # teeth: see-through, the mouth's dark at the corners or the teeth continued below.
        # (Near the upper lip the gum between the teeth is as red: it stays.)
        tooth_a = cv2.remap(
            cv2.GaussianBlur(tooth, (3, 3), 0), gx, gy, cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT,
        )  # fmt: skip
        low = gy > top + 0.6 * (bottom - top)
        alpha = np.where(low, np.minimum(alpha, tooth_a), alpha)
        # Under the photo's upper lip the teeth go on: each column continues the mean of its
        # first rows of teeth (one row alone would stretch every dark gap up the tooth), towards
        # the colour of gums higher up.
        row, row_a = np.zeros((1, x1 - x0, 3), np.float32), np.zeros((1, x1 - x0), np.float32)
        rows = (2.0, 3.0, 4.0, 5.0, 6.0, 7.0)
        for k in rows:
            yk = top + k
            row += cv2.remap(img, gx[:1], yk, cv2.INTER_LINEAR).astype(np.float32) / len(rows)
            row_a += cv2.remap(teeth, gx[:1], yk, cv2.INTER_LINEAR) / len(rows)
        row = cv2.GaussianBlur(row, (5, 1), 0)  # no single column's dark gap runs up a tooth
        under = gy < top + 2.0
        gum = np.clip((top - gy) / (0.03 * self.scale), 0, 1)[..., None] * 0.5
        up_rgb = row * (1 - gum) + (self.lip_rgb * 0.9)[None, None] * gum
        rgb = np.where(under[..., None], up_rgb, rgb.astype(np.float32))
        alpha = np.where(under, np.broadcast_to(row_a, alpha.shape), alpha)
        alpha *= np.clip((UPPER_TEETH * self.scale - (top - gy)) / 3.0, 0, 1)
        # Under the photo's lower lip: down to the front teeth's edge line, each column
        # continuing the mean of its last rows of teeth (from their own lower edge), a little
        # darker (further back).
        ex, ey = self.axes
        lo_u = (self.src_lo - centre) @ ex
        lo_v = (self.src_lo - centre) @ ey
        o = np.argsort(lo_u)
        edge_v = np.interp(u, lo_u[o], lo_v[o])  # (bh, bw) the photo's lower lip, face frame
        front = float(lo_v[list(CENTRE_PAIRS)].mean())
        occlusal = front - 0.05 * self.half_width * t**2  # the side teeth's edges rise a little

        def at(line_v: np.ndarray, k: float) -> tuple[np.ndarray, np.ndarray]:
            """Sample maps ``k`` pixels up the face from ``line_v`` (face frame, per pixel)."""
            q = centre + u[..., None] * ex + (line_v - k)[..., None] * ey
            return q[..., 0].astype(np.float32), q[..., 1].astype(np.float32)

        edge_v = edge_v - _edge_offset(tooth, [at(edge_v, k) for k in _EDGE_SEARCH])
        ext = np.zeros_like(rgb, dtype=np.float32)
        ext_a = np.zeros(alpha.shape, np.float32)
        for k in (2.0, 3.0, 4.0, 5.0):
            px, py = at(edge_v, k)
            ext += cv2.remap(img, px, py, cv2.INTER_LINEAR).astype(np.float32) / 4
            ext_a += cv2.remap(teeth, px, py, cv2.INTER_LINEAR) / 4
        below = v > edge_v - 0.5
        reach = np.clip(occlusal - v + 0.5, 0, 1)  # (bh, bw) inside the edge line
        rgb = np.where(below[..., None], ext * 0.88, rgb)
        alpha = np.where(below, ext_a * reach, alpha * np.clip(bottom - gy + 1.0, 0, 1))
        alpha *= np.clip((0.95 - np.abs(t)) * 8, 0, 1)
        alpha *= (gx >= 0) & (gx < w) & (gy >= 0) & (gy < h)
        return np.dstack([rgb.astype(np.float32), alpha])

    # -- per frame ---------------------------------------------------------------------------

    def _layer(self, tex: np.ndarray, to_frame: np.ndarray, origin: tuple[int, int],
               size: tuple[int, int]) -> np.ndarray:  # fmt: skip
        """``tex`` (photo-box RGBA) moved by the similarity ``to_frame`` onto a frame crop."""
        inv = _invert(to_frame)  # frame -> photo
        # crop pixel -> frame (+origin) -> photo -> texture (-box)
        m = inv.copy()
        m[:, 2] = inv[:, :2] @ np.asarray(origin, np.float64) + inv[:, 2] - self.box
        return cv2.warpAffine(
            tex, m, size, flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_CONSTANT, borderValue=0,
        )  # fmt: skip

    def paint(
        self,
        frame: np.ndarray,
        up: np.ndarray,
        lo: np.ndarray,
        teeth_up: np.ndarray,
        teeth_lo: np.ndarray,
        tongue: float,
    ) -> None:
        """Paint the mouth between the moved lips into ``frame`` (in place).

        Args:
            frame: (H, W, 3) uint8 the warped frame.
            up, lo: (11, 2) the moved inner upper / lower lip contours in frame pixels.
            teeth_up, teeth_lo: (11, 2) the rig's upper (skull) and lower (jaw) teeth anchors
                in frame pixels; at rest both lie on ``seam``.
            tongue: 0..1 how high the tongue rises.
        """
        h, w = frame.shape[:2]
        gaps = np.linalg.norm(lo - up, axis=1)
        widest = float(gaps.max())
        sigma = min(ROUND * widest, 0.05 * self.scale)
        pad = int(np.ceil(2 * sigma)) + 3
        pts = np.concatenate([up, lo])
        x0, y0 = np.floor(pts.min(0)).astype(int) - pad
        x1, y1 = np.ceil(pts.max(0)).astype(int) + pad + 1
        x0, y0, x1, y1 = max(0, x0), max(0, y0), min(w, x1), min(h, y1)
        if x1 - x0 < 3 or y1 - y0 < 3:
            return
        ch, cw = y1 - y0, x1 - x0
        xs = np.arange(x0, x1, dtype=np.float32)
        ou, ol = np.argsort(up[:, 0]), np.argsort(lo[:, 0])
        # (1, cw) float32 the upper / lower lip's inner edge per column
        top = np.interp(xs, up[ou, 0], up[ou, 1]).astype(np.float32)[None]
        bot = np.maximum(np.interp(xs, lo[ol, 0], lo[ol, 1]).astype(np.float32)[None], top)
        ys = np.arange(y0, y1, dtype=np.float32)[:, None]  # (ch, 1)
        left, right = min(up[0, 0], up[-1, 0]), max(up[0, 0], up[-1, 0])
        mid, half = np.float32(0.5 * (left + right)), np.float32(max(0.5 * (right - left), 1.0))
        across = np.clip(np.abs(xs - mid) / half, 0, 1)

        # The gap between the lips, and its rounded opening.
        poly = np.concatenate([up, lo[-2:0:-1]]) - (x0, y0)
        gap_m = np.zeros((ch, cw), np.uint8)
        cv2.fillPoly(gap_m, [np.round(poly * (1 << AA_BITS)).astype(np.int32)], 255,
                     cv2.LINE_AA, AA_BITS)  # fmt: skip
        gap_a = gap_m.astype(np.float32) / 255.0
        if sigma >= 0.5:
            soft = cv2.GaussianBlur(gap_a, (0, 0), sigma)
            open_a = np.clip((soft - 0.5) * (2.5 * sigma) + 0.5, 0, 1)
            # A lip's inner edge is not a cut: the layers fade in over about a pixel.
            open_a = np.minimum(cv2.GaussianBlur(open_a, (0, 0), 0.7), gap_a)
        else:
            open_a = np.zeros_like(gap_a)

        region = frame[y0:y1, x0:x1].astype(np.float32)
        out = region
        # Inside the moved lips' polygon but not open (the rounded corners): the lips touch.
        # The warp shows there whatever lay between the photo's lips, stretched (a closed
        # photo's lip line as a dotted streak); the lips' own colours from around it instead.
        # The gap's triangles, rasterised whole, reach a pixel past its polygon: one more.
        near = cv2.dilate(gap_a, np.ones((3, 3), np.uint8))
        contact = near - np.minimum(open_a, near)
        if contact.max() > 0.0:
            keep = cv2.GaussianBlur(1.0 - near, (0, 0), CONTACT_BLUR)
            lips = cv2.GaussianBlur(region * (1.0 - near)[..., None], (0, 0), CONTACT_BLUR)
            out = _over(out, lips / np.maximum(keep, 1e-3)[..., None], contact)
        if open_a.max() > 0.0:
            interior = self._interior(
                (x0, y0), (cw, ch), xs, ys, top, bot, across, teeth_up, teeth_lo, tongue
            )
            out = _over(out, interior, open_a)
        touch = bot - top < 1.5  # (1, cw) columns where the lips meet
        if self.stomion > 0 and touch.any():
            # The seam where the lips touch: darker towards the corners, gone where they part.
            ends = np.clip((1 - across) / 0.08, 0, 1)
            k = self.stomion * (0.7 + 0.6 * across**2) * ends * touch  # (cw,)
            line = np.exp(-((ys - 0.5 * (top + bot)) ** 2))  # (ch, cw)
            a = k * line * (1 - open_a)
            seam = np.broadcast_to(self.seam_rgb[None, None], out.shape)
            out = _over(out, seam, a)
        frame[y0:y1, x0:x1] = np.clip(out + 0.5, 0, 255).astype(np.uint8)

    def _interior(
        self,
        origin: tuple[int, int],
        size: tuple[int, int],
        xs: np.ndarray,
        ys: np.ndarray,
        top: np.ndarray,
        bot: np.ndarray,
        across: np.ndarray,
        teeth_up: np.ndarray,
        teeth_lo: np.ndarray,
        tongue: float,
    ) -> np.ndarray:
        """(ch, cw, 3) float32 the mouth's interior on the crop: cavity, tongue, teeth, shade."""
        cw, ch = size
        opening = float(np.max(bot - top))
        # Little light reaches into a small opening; a wide one shows the back of the mouth.
        light = 0.55 + 0.45 * min(opening / (0.08 * self.scale), 1.0)
        # Darker towards the corners and up under the roof, where no light reaches.
        down = np.clip((ys - top) / np.maximum(bot - top, 1.0), 0, 1)  # (ch, cw) 0 top, 1 floor
        lum = (1 - 0.45 * across**2) * (0.6 + 0.55 * down**1.5)
        img = (self.cavity_rgb * light).astype(np.float32)[None, None] * lum[..., None]
        skull = _similarity(self.seam, teeth_up)
        jaw = _similarity(self.seam, teeth_lo)
        # The tongue rises in the jaw's frame: towards the upper teeth as the jaw opens. Even
        # lying flat its back shows above the lower teeth in an open mouth (a camera in front
        # of the face looks along its surface), so it rises a share of the opening at tongue 0.
        jaw_open = float(np.mean(np.linalg.norm(teeth_lo - teeth_up, axis=1)))
        share = TONGUE_SHOW + tongue * (0.5 - TONGUE_SHOW)
        rise = share * jaw_open + tongue * TONGUE_RISE * self.scale
        lift = np.eye(3)[:2].copy()
        lift[:, 2] = -rise * self.axes[1]
        tongue_m = np.vstack([jaw, [0, 0, 1]]) @ np.vstack([lift, [0, 0, 1]])
        # The teeth and tongue lie in the lips' shadow until the lips part well: a slit shows
        # them dim and tinted by the light the lips throw in, not as a bright line.
        t = min(opening / (TEETH_LIT * self.scale), 1.0)
        lit = np.float32(TEETH_DARK + (1 - TEETH_DARK) * t * t * (3 - 2 * t))
        dark = (self.lip_rgb * SHADOW * (1 - lit)).astype(np.float32)  # light off the lips
        for tex, m in ((self.tongue, tongue_m[:2]), (self.lower, jaw), (self.upper, skull)):
            layer = self._layer(tex, m, origin, size)
            img = _over(img, layer[..., :3] * lit + dark, layer[..., 3])
        # The lips shade what lies just inside them: the upper lip most.
        gap = np.maximum(bot - top, 1.0)
        below = ys - top
        above = bot - ys
        shade = 1 - 0.15 * np.exp(-np.maximum(below, 0) / (0.15 * gap + 1.0))
        shade *= 1 - 0.15 * np.exp(-np.maximum(above, 0) / (0.06 * gap + 0.8))
        del xs
        return img * shade[..., None].astype(np.float32)
