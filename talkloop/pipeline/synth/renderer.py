"""Procedural avatar renderer: a character and per-frame parameters to RGB frames.

Shapes are signed-distance fields evaluated with torch over a batch of frames at once, each only
inside the union of its bounding boxes over the batch; coverage ``clamp(0.5 - d / pixel)`` gives
analytic anti-aliasing without supersampling. Head pose is 2.5-D: roll rotates the head layers,
translation moves them, and yaw/pitch shift each layer by its depth (parallax), so the nose moves
more than the face outline and the back hair moves the other way.

Image units: the image height spans [-1, 1] (y down), x is centred. Head units: image units
divided by ``Character.head_scale``, centred on the head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from talkloop.pipeline.models.portrait.params import FRAME_FIELDS, FrameParams
from talkloop.pipeline.synth.character import Character

# Parallax depth of each head layer (head units of shift per radian of yaw/pitch).
_DEPTH = {"back": -0.12, "ear": -0.08, "face": 0.0, "hair": 0.04, "eye": 0.16, "nose": 0.3}
_MOUTH_DEPTH = 0.2
_EYE_Y = -0.02
_BROW_GAP = 0.07
_NOSE_Y = 0.17
_MOUTH_Y = 0.4
_PAD_PX = 2
_SMILE_LIFT = 0.09  # head units the mouth corners rise at smile 1


@dataclass
class RenderOutput:
    """Frames and per-frame boxes ``(x0, y0, x1, y1)`` in pixels (float, may leave the image)."""

    frames: np.ndarray  # (T, H, W, 3) uint8
    face_box: np.ndarray  # (T, 4) float32
    mouth_box: np.ndarray  # (T, 4) float32
    eye_box: np.ndarray  # (T, 2, 4) float32: left, right (image left first)


def _ellipse(u: Tensor, v: Tensor, ru: Tensor | float, rv: Tensor | float) -> Tensor:
    """Approximate signed distance to an axis-aligned ellipse (exact on the axes)."""
    k0 = torch.sqrt((u / ru) ** 2 + (v / rv) ** 2)
    k1 = torch.sqrt((u / (ru * ru)) ** 2 + (v / (rv * rv)) ** 2)
    return k0 * (k0 - 1.0) / (k1 + 1e-6)


def _cov(d: Tensor, width: float) -> Tensor:
    """Coverage of the inside of ``d < 0`` for a pixel ``width`` wide (box filter)."""
    return (0.5 - d / width).clamp_(0.0, 1.0)


def _rgb(c: tuple[float, float, float], k: float = 1.0) -> Tensor:
    return torch.tensor([min(1.0, x * k) for x in c], dtype=torch.float32)


def _mix(a: tuple[float, ...], b: tuple[float, ...], t: float) -> tuple[float, float, float]:
    return (a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t, a[2] + (b[2] - a[2]) * t)


class _Batch:
    """Head transforms of a batch of frames and a canvas to paint them on."""

    def __init__(self, r: Renderer, p: np.ndarray, base: Tensor) -> None:
        t = torch.from_numpy(np.ascontiguousarray(p)).float()  # (T, F)
        col = {name: t[:, i].view(-1, 1, 1) for i, name in enumerate(r.fields)}
        self.p = col
        self.n = t.shape[0]
        self.h, self.w = r.height, r.width
        self.scale = r.ch.head_scale
        self.cx = col["tx"]
        self.cy = col["ty"] + r.ch.head_y
        self.cos = torch.cos(col["roll"])
        self.sin = torch.sin(col["roll"])
        self.sy = torch.sin(col["yaw"])
        self.sp = torch.sin(col["pitch"])
        self.px = 2.0 / self.h / self.scale  # one pixel in head units
        self.img = base.expand(self.n, -1, -1, -1).clone()  # (T, H, W, 3)

    def region(self, box: tuple[float, float, float, float], depth: float) -> tuple[slice, slice]:
        """Pixel slices covering head-unit ``box`` (u0, v0, u1, v1) in every frame."""
        u0, v0, u1, v1 = box
        us = torch.tensor([u0, u1, u0, u1]).view(1, 4)
        vs = torch.tensor([v0, v0, v1, v1]).view(1, 4)
        c, s = self.cos.view(-1, 1), self.sin.view(-1, 1)
        uu = (us + depth * self.sy.view(-1, 1)) * self.scale
        vv = (vs + depth * self.sp.view(-1, 1)) * self.scale
        x = c * uu - s * vv + self.cx.view(-1, 1)
        y = s * uu + c * vv + self.cy.view(-1, 1)
        half = self.h / 2.0
        x0 = int(math.floor(float(x.min()) * half + self.w / 2.0)) - _PAD_PX
        x1 = int(math.ceil(float(x.max()) * half + self.w / 2.0)) + _PAD_PX
        y0 = int(math.floor(float(y.min()) * half + half)) - _PAD_PX
        y1 = int(math.ceil(float(y.max()) * half + half)) + _PAD_PX
        return slice(max(0, y0), min(self.h, y1)), slice(max(0, x0), min(self.w, x1))

    def local(self, ys: slice, xs: slice, depth: float) -> tuple[Tensor, Tensor]:
        """Head-unit coordinates ``(u, v)``, each (T, h, w), of the pixels in the region."""
        half = self.h / 2.0
        yy = (torch.arange(ys.start, ys.stop, dtype=torch.float32) + 0.5 - half) / half
        xx = (torch.arange(xs.start, xs.stop, dtype=torch.float32) + 0.5 - self.w / 2.0) / half
        dx = (xx.view(1, 1, -1) - self.cx) / self.scale
        dy = (yy.view(1, -1, 1) - self.cy) / self.scale
        u = self.cos * dx + self.sin * dy - depth * self.sy
        v = self.cos * dy - self.sin * dx - depth * self.sp
        return u, v

    def paint(
        self, ys: slice, xs: slice, alpha: Tensor, color: Tensor, shade: Tensor | None = None
    ) -> None:
        """Composite ``color`` (3,) times ``shade`` (T, h, w) with coverage ``alpha`` (T, h, w)."""
        reg = self.img[:, ys, xs]
        c = color if shade is None else color * shade.unsqueeze(-1)
        reg.add_((c - reg) * alpha.unsqueeze(-1))


class Renderer:
    """Renders one character at one size; reuse it for every clip of that character."""

    fields = FRAME_FIELDS

    def __init__(self, character: Character, size: int | tuple[int, int] = 256) -> None:
        """Args: character; size: side, or (width, height), in pixels."""
        self.width, self.height = (size, size) if isinstance(size, int) else size
        if self.width < 16 or self.height < 16:
            raise ValueError(f"size must be at least 16x16, got {self.width}x{self.height}")
        self.ch = character
        self.base, self.neck_mask = self._static()

    # -- static layers: background and body, drawn once per renderer --------------------------

    def _static(self) -> tuple[Tensor, Tensor]:
        ch = self.ch
        h, w = self.height, self.width
        half = h / 2.0
        y = ((torch.arange(h, dtype=torch.float32) + 0.5 - half) / half).view(-1, 1)
        x = ((torch.arange(w, dtype=torch.float32) + 0.5 - w / 2.0) / half).view(1, -1)
        t = ((y + 1.0) / 2.0).expand(h, w)
        bg1, bg2 = _rgb(ch.background), _rgb(ch.background2)
        img = bg1 + (bg2 - bg1) * t.unsqueeze(-1)
        # A soft key light behind the head and a few out-of-focus blobs.
        glow = torch.exp(-((x / 0.9) ** 2 + ((y - ch.head_y) / 0.8) ** 2)) * 0.1
        img = img + glow.unsqueeze(-1)
        rng = np.random.default_rng([ch.seed, 0xB0CE])
        for _ in range(4):
            bx, by = rng.uniform(-1.2, 1.2), rng.uniform(-1.0, 0.3)
            r = rng.uniform(0.12, 0.3)
            d = torch.sqrt((x - bx) ** 2 + (y - by) ** 2) - r
            a = _cov(d, 0.08) * float(rng.uniform(0.08, 0.16))
            img = img + (1.0 - img) * a.unsqueeze(-1)
        # Body in head units (no pose: the shoulders stay put while the head moves).
        s = ch.head_scale
        u = x / s
        v = (y - ch.head_y) / s
        px = 2.0 / h / s
        top = ch.face_bottom + 0.2
        body = _ellipse(u, v - (top + 0.8), 1.35, 0.8)
        body = torch.where(v > top + 0.8, u.abs() - 1.35, body)
        cloth = _rgb(ch.clothing)
        shade = 1.0 - 0.18 * (u / 1.35).clamp(-1, 1) ** 2 - 0.05 * (v - top).clamp(0, 2)
        neckline = self._neckline(u, v, top)
        inner = torch.maximum(body, -neckline)
        a = _cov(inner, px)
        img = img + (cloth * shade.unsqueeze(-1) - img) * a.unsqueeze(-1)
        # Trim along the neckline, slightly darker than the cloth.
        trim = torch.maximum((neckline.abs() - 0.025), body)
        img = img + (cloth * 0.78 - img) * _cov(trim, px).unsqueeze(-1)
        if ch.collar == "shirt":
            for side in (-1.0, 1.0):
                flap = self._collar_flap(u * side, v, top)
                img = img + (_rgb((0.96, 0.96, 0.95)) - img) * _cov(flap, px).unsqueeze(-1)
        if ch.collar == "hoodie":
            for side in (-1.0, 1.0):
                d = torch.maximum((u - side * 0.12).abs() - 0.012, (v - top - 0.35).abs() - 0.2)
                img = img + (_rgb((0.95, 0.95, 0.93)) - img) * _cov(d, px).unsqueeze(-1)
        # The neck shows above the body and through the neckline, nowhere else.
        neck_mask = 1.0 - _cov(body, px) * (1.0 - _cov(neckline, px))
        return img.clamp(0.0, 1.0), neck_mask

    def _neckline(self, u: Tensor, v: Tensor, top: float) -> Tensor:
        c = self.ch.collar
        if c == "vneck" or c == "shirt":
            vee = (1.7 * u.abs() + (v - top - 0.45)) / math.sqrt(1 + 1.7**2)
            return torch.maximum(vee, top - 0.2 - v)
        if c == "hoodie":
            return _ellipse(u, v - top, 0.3, 0.2)
        return _ellipse(u, v - top, 0.27, 0.14)

    def _collar_flap(self, u: Tensor, v: Tensor, top: float) -> Tensor:
        # A triangle lying along the right arm of the V.
        a = (1.7 * u + (v - top - 0.45)) / math.sqrt(1 + 1.7**2)
        b = -(0.8 * u - (v - top - 0.05)) / math.sqrt(1 + 0.8**2)
        return torch.maximum(torch.maximum(-a - 0.0, a - 0.09), torch.maximum(b, u - 0.34))

    # -- per-frame layers -----------------------------------------------------------------------

    def render(self, params: FrameParams, batch: int = 32) -> RenderOutput:
        """Render every frame of ``params``.

        Args:
            params: ``T`` frames of parameters.
            batch: frames per vectorised pass (memory ~ ``batch * H * W * 64`` bytes).

        Returns:
            frames (T, H, W, 3) uint8 and the face, mouth and eye boxes per frame.
        """
        values = params.values
        out = np.empty((len(params), self.height, self.width, 3), np.uint8)
        for start in range(0, len(params), batch):
            chunk = values[start : start + batch]
            img = self._render_batch(chunk)
            out[start : start + len(chunk)] = img.mul_(255.0).add_(0.5).clamp_(0, 255).byte()
        face, mouth, eyes = self.boxes(params)
        return RenderOutput(out, face, mouth, eyes)

    def render_neutral(self) -> np.ndarray:
        """The reference pose: neutral face, mouth closed, eyes open, facing the camera."""
        return self.render(FrameParams.neutral(1)).frames[0]

    def _render_batch(self, p: np.ndarray) -> Tensor:
        b = _Batch(self, p, self.base.unsqueeze(0))
        self._back_hair(b)
        self._neck(b)
        self._ears(b)
        self._face(b)
        self._nose(b)
        self._smile_lines(b)
        self._mouth(b)
        for side in (-1.0, 1.0):
            self._eye(b, side)
            self._brow(b, side)
        self._front_hair(b)
        return b.img

    def _neck(self, b: _Batch) -> None:
        ch = self.ch
        nw = ch.face_width * 0.42
        ys, xs = b.region((-nw, 0.2, nw, 4.0), 0.0)
        # The neck follows translation only; its top hides under the chin whatever the roll.
        half = b.h / 2.0
        yy = (torch.arange(ys.start, ys.stop, dtype=torch.float32) + 0.5 - half) / half
        xx = (torch.arange(xs.start, xs.stop, dtype=torch.float32) + 0.5 - b.w / 2.0) / half
        u = (xx.view(1, 1, -1) - b.cx) / b.scale
        v = (yy.view(1, -1, 1) - b.cy) / b.scale
        d = torch.maximum(u.abs() - nw, 0.2 - v)
        a = _cov(d, b.px) * self.neck_mask[ys, xs]
        shade = 0.72 + 0.2 * ((v - ch.face_bottom) / 0.25).clamp(0.0, 1.0)
        b.paint(ys, xs, a, _rgb(ch.skin), shade)

    def _ears(self, b: _Batch) -> None:
        ch = self.ch
        for side in (-1.0, 1.0):
            eu, ev = side * (ch.face_width - 0.01), 0.03
            ys, xs = b.region((eu - 0.1, ev - 0.15, eu + 0.1, ev + 0.15), _DEPTH["ear"])
            u, v = b.local(ys, xs, _DEPTH["ear"])
            d = _ellipse(u - eu, v - ev, 0.08, 0.13)
            b.paint(ys, xs, _cov(d, b.px), _rgb(ch.skin, 0.93))
            inner = _ellipse(u - eu - side * 0.012, v - ev, 0.04, 0.08)
            b.paint(ys, xs, _cov(inner, b.px * 3) * 0.5, _rgb(ch.skin, 0.75))

    def _face_sdf(self, b: _Batch, u: Tensor, v: Tensor) -> Tensor:
        ch = self.ch
        bottom = ch.face_bottom + 0.07 * b.p["jaw"]
        taper = 1.0 - ch.jaw_taper * (v / bottom).clamp(0.0, 1.0) ** 2
        ru = ch.face_width * taper
        rv = torch.where(v < 0, torch.full_like(v, ch.face_top), bottom.expand_as(v))
        return _ellipse(u, v, ru, rv)

    def _face(self, b: _Batch) -> None:
        ch = self.ch
        box = (-ch.face_width, -ch.face_top, ch.face_width, ch.face_bottom + 0.08)
        ys, xs = b.region(box, _DEPTH["face"])
        u, v = b.local(ys, xs, _DEPTH["face"])
        d = self._face_sdf(b, u, v)
        # Darker towards the rim, a key light from the upper left.
        shade = 1.0 - 0.16 * torch.exp(d / 0.07) - 0.05 * (u + 0.6 * v)
        b.paint(ys, xs, _cov(d, b.px), _rgb(ch.skin), shade)
        if ch.blush > 0.05:
            for side in (-1.0, 1.0):
                cu, cv = side * ch.face_width * 0.58, 0.22
                ys2, xs2 = b.region((cu - 0.14, cv - 0.09, cu + 0.14, cv + 0.09), 0.05)
                u2, v2 = b.local(ys2, xs2, 0.05)
                db = _ellipse(u2 - cu, v2 - cv, 0.1, 0.06)
                a = _cov(db, 0.09) * (0.28 * ch.blush)
                b.paint(ys2, xs2, a, _rgb(_mix(ch.skin, (0.95, 0.45, 0.45), 0.6)))

    def _nose(self, b: _Batch) -> None:
        ch = self.ch
        ns, ny = ch.nose_size, _NOSE_Y
        ys, xs = b.region((-0.09 * ns, ny - 0.1 * ns, 0.09 * ns, ny + 0.06 * ns), _DEPTH["nose"])
        u, v = b.local(ys, xs, _DEPTH["nose"])
        shadow = _ellipse(u - 0.01, v - ny - 0.01, 0.06 * ns, 0.035 * ns)
        b.paint(ys, xs, _cov(shadow, 0.05) * 0.35, _rgb(ch.skin, 0.72))
        # The underside of the tip: a short smile-shaped stroke.
        ring = (torch.sqrt(u**2 + (v - ny + 0.02 * ns) ** 2) - 0.04 * ns).abs() - 0.006
        stroke = torch.maximum(ring, (ny - 0.005) - v)
        b.paint(ys, xs, _cov(stroke, b.px) * 0.7, _rgb(ch.skin, 0.62))
        hl = _ellipse(u + 0.012, v - ny + 0.035 * ns, 0.018 * ns, 0.012 * ns)
        b.paint(ys, xs, _cov(hl, 0.03) * 0.35, _rgb((1.0, 1.0, 1.0)))

    def _smile_lines(self, b: _Batch) -> None:
        """What a smile does beyond the lips: raised cheeks and the folds beside the mouth."""
        ch = self.ch
        sm = b.p["smile"].clamp(0.0, 1.0)  # (T, 1, 1)
        if float(sm.max()) <= 0.0:
            return
        w = self.mouth_geometry(b.p)["w"]  # the folds bracket the mouth as drawn
        top = _NOSE_Y - 0.02
        box = (-ch.face_width, top - 0.12, ch.face_width, _MOUTH_Y + 0.12)
        ys, xs = b.region(box, _MOUTH_DEPTH)
        u, v = b.local(ys, xs, _MOUTH_DEPTH)
        # Cheeks lift and catch the light.
        for side in (-1.0, 1.0):
            cheek = _ellipse(u - side * ch.face_width * 0.52, v - (0.27 - 0.05 * sm), 0.13, 0.08)
            b.paint(ys, xs, _cov(cheek, 0.08) * (0.3 * sm), _rgb(ch.skin, 1.12))
        # Folds from beside the nose to beyond the mouth corners: the outer parts of one ellipse.
        ra, rb = w + 0.06, _MOUTH_Y + 0.05 - top
        ring = _ellipse(u, v - (_MOUTH_Y - 0.02), ra, rb).abs() - 0.006
        span = torch.maximum(top - v, v - (_MOUTH_Y + 0.03))
        fold = torch.maximum(ring, torch.maximum(0.55 * ra - u.abs(), span))
        b.paint(ys, xs, _cov(fold, b.px * 1.5) * (0.45 * sm), _rgb(ch.skin, 0.72))

    def mouth_geometry(self, p: dict[str, Tensor]) -> dict[str, Tensor]:
        """Mouth shape in head units from parameters (tensors broadcast over frames)."""
        ch = self.ch
        op, rd, sm = p["mouth_open"], p["mouth_round"], p["smile"]
        w = ch.mouth_base_width * (1 + 0.25 * p["mouth_width"] - 0.4 * rd + 0.2 * sm)
        up = 0.06 * op * (1 + 0.3 * rd)
        dn = 0.11 * op * (1 + 0.3 * rd) + 0.03 * p["jaw"]
        full = ch.lip_fullness * (1 + 0.5 * rd)
        return {"w": w, "up": up, "dn": dn, "lip_up": 0.028 * full, "lip_dn": 0.042 * full}

    def _mouth(self, b: _Batch) -> None:
        ch = self.ch
        g = self.mouth_geometry(b.p)
        my = _MOUTH_Y + 0.03 * b.p["jaw"]
        w, up, dn = g["w"], g["up"], g["dn"]
        wmax = ch.mouth_base_width * 1.5 + 0.03
        box = (-wmax, _MOUTH_Y - 0.12, wmax, _MOUTH_Y + 0.22)
        ys, xs = b.region(box, _MOUTH_DEPTH)
        u, v = b.local(ys, xs, _MOUTH_DEPTH)
        # Bend the mouth line: corners up with a smile, down with a frown.
        vb = v - my + b.p["smile"] * _SMILE_LIFT * (u / w) ** 2
        top = vb < 0
        lips = _ellipse(u, vb, w + 0.02, torch.where(top, up + g["lip_up"], dn + g["lip_dn"]))
        b.paint(ys, xs, _cov(lips, b.px) * 0.9, _rgb(ch.lip), 1.0 + 0.12 * (vb > 0).float())
        cav = _ellipse(u, vb, w * 0.96, torch.where(top, up, dn) + 1e-4)
        cav_a = _cov(cav, b.px)
        depth_shade = 0.7 + 0.6 * ((vb + up) / (up + dn + 1e-4)).clamp(0, 1)
        b.paint(ys, xs, cav_a, _rgb((0.26, 0.06, 0.08)), depth_shade)
        # Tongue rests on the floor of the mouth; ``tongue`` raises it (l, th, t, d).
        tr = 0.35 + 0.45 * b.p["tongue"]
        tongue = _ellipse(u, vb - dn * (1.0 - 0.7 * tr), w * 0.6, dn * tr + 1e-4)
        b.paint(ys, xs, torch.minimum(_cov(tongue, b.px), cav_a), _rgb((0.86, 0.42, 0.45)))
        # Teeth hang from the upper lip; a smaller lower row shows when they are bared.
        th = b.p["teeth"] * torch.minimum(up + dn, torch.full_like(up, 0.07)) * 0.45
        upper = torch.maximum(cav, vb - (-up + th))
        lower = torch.maximum(cav, (dn - 0.5 * th) - vb)
        tshade = 1.0 - 0.35 * (u / w).clamp(-1, 1) ** 2
        ivory = _rgb((0.97, 0.96, 0.92))
        b.paint(ys, xs, _cov(upper, b.px), ivory, tshade)
        b.paint(ys, xs, _cov(lower, b.px) * 0.9, ivory, tshade * 0.92)
        # The line between closed lips fades out as the mouth opens.
        line = torch.maximum(vb.abs() - 0.009, u.abs() - w * 0.92)
        fade = (1.0 - b.p["mouth_open"] * 6.0).clamp(0.0, 1.0)
        b.paint(ys, xs, _cov(line, b.px) * 0.85 * fade, _rgb(ch.lip, 0.55))
        hl = _ellipse(u, vb - dn - g["lip_dn"] * 0.55, w * 0.35, g["lip_dn"] * 0.2)
        b.paint(ys, xs, _cov(hl, 0.03) * 0.25, _rgb((1.0, 1.0, 1.0)))

    def _eye(self, b: _Batch, side: float) -> None:
        ch = self.ch
        ex, ey = side * ch.eye_spacing, _EYE_Y
        rh = ch.eye_size
        rw = rh * ch.eye_width
        ys, xs = b.region((ex - rw * 1.3, ey - rh * 1.4, ex + rw * 1.3, ey + rh * 1.3), 0.16)
        u, v = b.local(ys, xs, _DEPTH["eye"])
        du, dv = u - ex, v - ey
        sclera = _ellipse(du, dv, rw, rh)
        arc = rh * torch.sqrt((1.0 - (du / rw) ** 2).clamp(min=0.0))
        lid = -(1.0 - 2.0 * b.p["blink"]) * arc  # upper lid edge, relative to ey
        vis = torch.maximum(sclera, lid - dv)
        # A smile pushes the lower lid up (the eyes narrow).
        low = (1.0 - 0.5 * b.p["smile"].clamp(0.0, 1.0)) * arc
        vis = torch.maximum(vis, dv - low)
        vis_a = _cov(vis, b.px)
        b.paint(ys, xs, vis_a, _rgb((0.98, 0.98, 0.97)))
        ri = rh * 0.8
        iu = du - b.p["gaze_x"] * rw * 0.35
        iv = dv - b.p["gaze_y"] * rh * 0.25
        rad = torch.sqrt(iu**2 + iv**2)
        iris_shade = 0.75 + 0.4 * ((iv + ri) / (2 * ri)).clamp(0, 1)
        b.paint(ys, xs, torch.minimum(_cov(rad - ri, b.px), vis_a), _rgb(ch.eye), iris_shade)
        b.paint(ys, xs, torch.minimum(_cov(rad - ri * 0.48, b.px), vis_a), _rgb((0.05,) * 3))
        glint = torch.sqrt((iu + ri * 0.35) ** 2 + (iv + ri * 0.38) ** 2) - ri * 0.24
        b.paint(ys, xs, torch.minimum(_cov(glint, b.px), vis_a) * 0.95, _rgb((1.0, 1.0, 1.0)))
        # Lash line along the upper lid, thicker towards the outer corner.
        thick = 0.011 + 0.008 * (side * du / rw).clamp(0, 1)
        lash = torch.maximum((dv - lid).abs() - thick, du.abs() - rw * 1.04)
        dark = _rgb(_mix(ch.hair, (0.08, 0.06, 0.05), 0.7))
        b.paint(ys, xs, _cov(torch.maximum(lash, sclera - thick), b.px), dark)

    def _brow(self, b: _Batch, side: float) -> None:
        ch = self.ch
        bx = side * (ch.eye_spacing + 0.01)
        bw = ch.eye_size * ch.eye_width * 1.3
        by = _EYE_Y - ch.eye_size - _BROW_GAP
        ys, xs = b.region((bx - bw - 0.03, by - 0.14, bx + bw + 0.03, by + 0.06), _DEPTH["eye"])
        u, v = b.local(ys, xs, _DEPTH["eye"])
        t = (u - bx) / bw
        raise_ = b.p["brow_raise"]
        # Raised brows lift more at the inner end when worried (negative raise lowers them).
        arc = by - 0.045 * raise_ - ch.brow_arch * (1 - t**2) + 0.012 * raise_ * side * t
        thick = ch.brow_thickness * (1.0 - 0.45 * (side * t).clamp(0, 1))
        d = torch.maximum((v - arc).abs() - thick, t.abs() * bw - bw)
        col = _mix(ch.hair, (0.1, 0.07, 0.05), 0.35)
        b.paint(ys, xs, _cov(d, b.px), _rgb(col))

    # -- hair -----------------------------------------------------------------------------------

    def _hair_shade(self, u: Tensor, v: Tensor, k: float) -> Tensor:
        sheen = torch.exp(-(((v + self.ch.face_top * 0.55 - 0.35 * u * u) / 0.06) ** 2))
        return (0.82 + 0.3 * sheen - 0.12 * v.clamp(0, 2)) * k

    def _back_hair(self, b: _Batch) -> None:
        ch = self.ch
        st, fw, ft, vol = ch.hair_style, ch.face_width, ch.face_top, ch.hair_volume
        if st == "buzz":
            return
        dep = _DEPTH["back"]
        W = fw + vol + 0.05
        if st == "long":
            box = (-W - 0.15, -ft - vol - 0.35, W + 0.15, 1.5)
        elif st == "curly":
            R = ft + vol + 0.2
            box = (-R - 0.1, -0.12 - R - 0.1, R + 0.1, -0.12 + R + 0.1)
        else:
            box = (-W - 0.1, -ft - vol - 0.35, W + 0.1, ch.face_bottom)
        ys, xs = b.region(box, dep)
        u, v = b.local(ys, xs, dep)
        cap = _ellipse(u, v + 0.05, W, ft + vol)
        if st == "long":
            flare = W + 0.08 * (v / 1.3).clamp(0, 1)
            body = _ellipse(u, (v - 1.0).clamp(min=0.0), flare, 0.35)
            d = torch.minimum(cap, torch.maximum(body, -0.05 - v))
        elif st == "bob":
            d = torch.maximum(_ellipse(u, v + 0.05, W + 0.04, ft + vol + 0.2), v - 0.55)
        elif st == "curly":
            r = torch.sqrt(u**2 + (v + 0.12) ** 2)
            ang = torch.atan2(v + 0.12, u)
            d = r - (ft + vol + 0.15) - 0.03 * torch.sin(13 * ang)
        elif st == "bun":
            bun = torch.sqrt(u**2 + (v + ft + 0.08) ** 2) - 0.2
            d = torch.minimum(cap, bun)
        else:
            d = cap
        b.paint(ys, xs, _cov(d, b.px), _rgb(ch.hair), self._hair_shade(u, v, 0.72))

    def _hairline(self, u: Tensor) -> Tensor:
        ch = self.ch
        st, ft, fw = ch.hair_style, ch.face_top, ch.face_width
        if st == "bob":
            return -ft * 0.35 + 0.012 * torch.cos(u * 40) + 0.25 * (u / fw) ** 4
        if st == "sidepart":
            sweep = torch.sigmoid((u - 0.12) * 10)
            return -ft * 0.75 + 0.42 * sweep * (1 - 0.3 * (u / fw) ** 2)
        if st == "long":
            return -ft * 0.82 + 1.1 * u * u
        if st == "curly":
            return -ft * 0.5 + 0.03 * torch.sin(u * 28) + 0.3 * (u / fw) ** 4
        if st == "bun":
            return -ft * 0.72 + 0.55 * u * u
        if st == "buzz":
            return -ft * 0.62 + 0.12 * u * u
        return -ft * 0.5 - 0.08 * torch.cos(u * 6) + 0.25 * (u / fw) ** 4

    def _front_hair(self, b: _Batch) -> None:
        ch = self.ch
        st, fw, ft, vol = ch.hair_style, ch.face_width, ch.face_top, ch.hair_volume
        dep = _DEPTH["hair"]
        grow = 0.015 if st == "buzz" else vol * 0.6
        top = 0.015 if st == "buzz" else vol
        box = (-fw - grow - 0.02, -ft - top - 0.05, fw + grow + 0.02, 0.15)
        ys, xs = b.region(box, dep)
        u, v = b.local(ys, xs, dep)
        cap = _ellipse(u, v + 0.04, fw + grow, ft + top - 0.04)
        side_w = fw - (0.02 if st in ("buzz", "bun") else 0.07)
        side_len = -0.12 if st in ("buzz", "bun") else 0.02
        window = torch.maximum(self._hairline(u) - v, u.abs() - side_w)
        window = torch.minimum(window, side_len - v)
        d = torch.maximum(cap, -window)
        alpha = _cov(d, b.px) * (0.8 if st == "buzz" else 1.0)
        b.paint(ys, xs, alpha, _rgb(ch.hair), self._hair_shade(u, v, 1.0))

    # -- ground truth ---------------------------------------------------------------------------

    def boxes(self, params: FrameParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Face, mouth and eye boxes ``(x0, y0, x1, y1)`` in pixels for every frame."""
        ch = self.ch
        p = {k: torch.from_numpy(params[k].copy()).float() for k in self.fields}
        g = self.mouth_geometry(p)
        my = _MOUTH_Y + 0.03 * p["jaw"]
        wl = g["w"] + 0.02
        mouth = (-wl, my - g["up"] - g["lip_up"], wl, my + g["dn"] + g["lip_dn"])
        bottom = ch.face_bottom + 0.07 * p["jaw"]
        face = (-ch.face_width, -ch.face_top, ch.face_width, bottom)
        rw = ch.eye_size * ch.eye_width
        eyes = [
            (
                s * ch.eye_spacing - rw,
                _EYE_Y - ch.eye_size,
                s * ch.eye_spacing + rw,
                _EYE_Y + ch.eye_size,
            )
            for s in (-1.0, 1.0)
        ]
        out_face = self._project(p, face, _DEPTH["face"])
        out_mouth = self._project(p, mouth, _MOUTH_DEPTH)
        out_eyes = np.stack([self._project(p, e, _DEPTH["eye"]) for e in eyes], axis=1)
        return out_face, out_mouth, out_eyes

    def _project(self, p: dict[str, Tensor], box: tuple, depth: float) -> np.ndarray:
        n = p["tx"].shape[0]
        u0, v0, u1, v1 = (torch.as_tensor(c, dtype=torch.float32).expand(n) for c in box)
        us = torch.stack([u0, u1, u0, u1], 1) + depth * torch.sin(p["yaw"]).view(-1, 1)
        vs = torch.stack([v0, v0, v1, v1], 1) + depth * torch.sin(p["pitch"]).view(-1, 1)
        c, s = torch.cos(p["roll"]).view(-1, 1), torch.sin(p["roll"]).view(-1, 1)
        sc = self.ch.head_scale
        half = self.height / 2.0
        x = (c * us - s * vs) * sc + p["tx"].view(-1, 1)
        y = (s * us + c * vs) * sc + (p["ty"] + self.ch.head_y).view(-1, 1)
        px = x * half + self.width / 2.0
        py = y * half + half
        out = torch.stack([px.min(1).values, py.min(1).values, px.max(1).values, py.max(1).values])
        return out.T.numpy().astype(np.float32)


def render_frames(
    character: Character, params: FrameParams, size: int | tuple[int, int] = 256
) -> RenderOutput:
    """One-shot helper: ``Renderer(character, size).render(params)``."""
    return Renderer(character, size).render(params)
