"""The portrait renderer: motion parameters -> frames, by warping the photo along its mesh.

Per photo (once): the photo's own expression (``neutral.py``), the warp mesh and its grid
weights (``mesh.py``), the face rig that moves the face from its neutral rest (``rig.py``), the
eye geometry (``eyes.py``), the mouth textures (``mouth.py``) and the person layer with its
background plate (``layers.py``). Per frame: the eyes blink / look on the source photo, the rig
moves the mesh vertices and the teeth anchors, one sparse product gives the displacement of the
moving box on a coarse grid, Newton steps invert it (where the lips move the moved triangles
around the mouth are rasterised exactly instead), one ``cv2.remap`` samples the frame, the
warped person is laid over the still background plate, and the mouth between the moved lips is
painted: the interior where they part, lip contact where they meet.

All-zero parameters give the neutral face (lips closed); ``photo_params`` give the photo.
"""

from __future__ import annotations

import cv2
import numpy as np

from talkloop.pipeline.core.errors import InputError
from talkloop.pipeline.models.portrait import topology as topo
from talkloop.pipeline.models.portrait.eyes import EyeWarp
from talkloop.pipeline.models.portrait.layers import PersonLayer
from talkloop.pipeline.models.portrait.mesh import (
    FACE_TRIANGLES,
    MOUTH_GAP,
    N_FACE,
    WarpMesh,
    exact_inverse,
    inverse_offsets,
)
from talkloop.pipeline.models.portrait.mouth import MouthPainter, closed_lip_source
from talkloop.pipeline.models.portrait.neutral import read_expression
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS
from talkloop.pipeline.models.portrait.rig import F, FaceRig

INVERSE_STEPS = 3
SEAM = 5.0  # pixels over which the exact mouth maps take over from the fixed-point ones
# The documented range of every field (FRAME_FIELDS); translations are held to a quarter of
# the frame height, which is already far more than a talking head moves.
_UNIT = ("mouth_open", "mouth_round", "teeth", "tongue", "jaw", "blink")
_RANGE = {name: (0.0, 1.0) if name in _UNIT else (-1.0, 1.0) for name in FRAME_FIELDS}
_RANGE.update(yaw=(-0.35, 0.35), pitch=(-0.35, 0.35), roll=(-0.35, 0.35))
_RANGE.update(tx=(-0.25, 0.25), ty=(-0.25, 0.25))
PARAM_LOW = np.array([_RANGE[name][0] for name in FRAME_FIELDS], np.float32)
PARAM_HIGH = np.array([_RANGE[name][1] for name in FRAME_FIELDS], np.float32)


class PortraitRenderer:
    """Renders frames of one framed portrait from motion parameters.

    Args:
        image: (H, W, 3) uint8 RGB framed photo.
        landmarks: (478, 3) float32 face-mesh landmarks in the image's pixels.
        mask: (H, W) float32 person mask in [0, 1] (1 = the person), or None to let a soft
            region around the head and hair move.

    Attributes:
        image: the photo.
        photo_params: (16,) float32 the parameters that describe the photo (its opening, smile,
            brows, teeth); rendered, they give the photo bit for bit. All zeros is the neutral
            rest: relaxed, lips closed.
    """

    def __init__(self, image: np.ndarray, landmarks: np.ndarray, mask: np.ndarray | None = None):
        image = np.asarray(image)
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise InputError(
                f"portrait image must be (H, W, 3) uint8, got {image.shape} {image.dtype}"
            )
        landmarks = np.asarray(landmarks, np.float32)
        if landmarks.shape != (478, 3) or not np.isfinite(landmarks).all():
            raise InputError(
                f"portrait landmarks must be (478, 3) finite floats, got {landmarks.shape}"
            )
        h, w = image.shape[:2]
        self.image = np.ascontiguousarray(image)
        self.height, self.width = h, w
        self.mesh = WarpMesh(landmarks, (h, w))
        mask = self._person_mask(landmarks, mask)
        ring = self.mesh.points[N_FACE : N_FACE + self.mesh.n_ring]
        ri = np.round(ring).astype(int)
        mobility = mask[ri[:, 1].clip(0, h - 1), ri[:, 0].clip(0, w - 1)]
        self.expression = read_expression(self.image, landmarks)
        self.rig = FaceRig(self.mesh, landmarks, h, mobility, self.expression)
        self.photo_params = self.rig.photo_params
        self.layer = PersonLayer(self.image, mask)
        y0, y1, x0, x1 = self.mesh.box
        self._grid = np.dstack(
            np.meshgrid(np.arange(x0, x1, dtype=np.float32), np.arange(y0, y1, dtype=np.float32))
        )  # (bh, bw, 2) the box's pixel coordinates
        self._plate = np.ascontiguousarray(self.layer.plate[y0:y1, x0:x1])
        self.eyes = EyeWarp(landmarks, (h, w))
        rig = self.rig
        self.mouth = MouthPainter(
            self.image, landmarks, self.expression, rig.seam, rig.axes, rig.scale
        )
        self._anchors = rig.anchor_points  # (22, 2) the teeth anchors in the photo
        lip_source = self.image
        if self.expression.closes:
            lip_source = closed_lip_source(self.image, landmarks, self.expression.upper_share)
        self._source = self._warp_source(lip_source, landmarks)
        self.landmarks = landmarks
        self.mouth_triangles = self._mouth_zone()
        self._inner_up = np.array(topo.LIPS_INNER_UPPER)
        self._inner_lo = np.array(topo.LIPS_INNER_LOWER)
        self._lips = np.unique(
            np.r_[self._inner_up, self._inner_lo, topo.LIPS_OUTER_UPPER, topo.LIPS_OUTER_LOWER]
        )

    def _warp_source(self, photo: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
        """(H, W, 4) uint8 what a moving frame warps: ``photo`` (the photo, its lips' gap
        filled where they close over it) with the person layer's alpha as a fourth channel, so
        that one fixed-point remap moves both. The face oval's alpha is 255: the face itself is
        never see-through, whatever the mask's edge does there."""
        alpha = np.round(self.layer.alpha * 255).astype(np.uint8)
        oval = np.round(landmarks[list(topo.FACE_OVAL), :2] * 8).astype(np.int32)
        cv2.fillPoly(alpha, [oval], 255, cv2.LINE_AA, 3)
        return np.ascontiguousarray(np.dstack([photo, alpha]))

    def _mouth_zone(self) -> np.ndarray:
        """Triangles around the mouth whose inverse is rasterised exactly (the gap strip
        first, so the lips' own triangles win on their shared edge pixels)."""
        rig = self.rig
        uc, vc = rig.mouth_centre
        u, v = rig.uv[:N_FACE, 0], rig.uv[:N_FACE, 1]
        near = (np.abs(u - uc) < 2.0 * rig.mouth_half_width) & (v > rig.uv[2, 1] - 0.02)
        near &= v < rig.uv[topo.CHIN, 1] + 0.01
        tris = FACE_TRIANGLES[near[FACE_TRIANGLES].all(1)]
        gap = set(map(tuple, MOUTH_GAP))
        is_gap = np.array([tuple(t) in gap for t in tris])
        return np.concatenate([tris[is_gap], tris[~is_gap]])

    def _person_mask(self, landmarks: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """(H, W) float32 person mask; without one, the head and the hair around it."""
        h, w = self.height, self.width
        if mask is None:
            # The face oval grown to take in the hair (the first anchor ring).
            oval = landmarks[list(topo.FACE_OVAL), :2]
            centre = oval.mean(0)
            m = np.zeros((h, w), np.uint8)
            cv2.fillPoly(m, [np.round(centre + (oval - centre) * 1.3).astype(np.int32)], 255)
            k = int(0.1 * np.ptp(oval[:, 1])) | 1
            return cv2.GaussianBlur(m, (k, k), 0).astype(np.float32) / 255.0
        mask = np.asarray(mask, np.float32)
        if mask.shape != (h, w) or not np.isfinite(mask).all():
            raise InputError(f"portrait mask must be ({h}, {w}) finite floats, got {mask.shape}")
        return np.clip(mask, 0.0, 1.0)

    def _exact_mouth(self, d: np.ndarray, xy: np.ndarray) -> None:
        """Overwrite the fixed-point map around the mouth with the exact inverse (in place).

        Args:
            d: (V, 2) vertex displacements of the frame.
            xy: (bh, bw, 2) float32 the box's sampling map (photo x, y per box pixel).
        """
        tris = self.mouth_triangles
        if not np.any(d[tris]):
            return
        y0, y1, x0, x1 = self.mesh.box
        src = self.mesh.points
        dst = src + d
        pts = dst[np.unique(tris)]
        zx0, zy0 = np.floor(pts.min(0)).astype(int) - 1
        zx1, zy1 = np.ceil(pts.max(0)).astype(int) + 2
        zone = (max(y0, zy0), min(y1, zy1), max(x0, zx0), min(x1, zx1))
        if zone[1] <= zone[0] or zone[3] <= zone[2]:
            return
        ex, ey, covered = exact_inverse(src, dst, tris, zone)
        sub = (slice(zone[0] - y0, zone[1] - y0), slice(zone[2] - x0, zone[3] - x0))
        # Feather the seam over a few pixels: just outside the zone the fixed-point maps are
        # off by up to a pixel, which a hard switch would show as a doubled line of skin.
        inner = cv2.distanceTransform(covered.view(np.uint8), cv2.DIST_L2, 3)
        w = np.minimum(inner * (1 / SEAM), 1)  # (zh, zw) distances are never negative
        mx, my = xy[..., 0][sub], xy[..., 1][sub]  # views into the map
        mx += (ex - mx) * w
        my += (ey - my) * w

    def _paints(self, d: np.ndarray, up: np.ndarray, lo: np.ndarray) -> bool:
        """Whether the mouth is painted: the lips moved off the photo's (a photo that parts its
        lips: they close or open over its own interior), or parted further than in the photo
        (a photo with closed lips keeps its own lip line until they part)."""
        if not np.any(d[self._lips]):
            return False
        if self.mouth.closes:
            return True
        return float(np.linalg.norm(up[5] - lo[5])) > self.mouth.gap + 0.25

    def render(self, params: np.ndarray) -> np.ndarray:
        """Frames for a batch of motion parameters.

        Args:
            params: (T, 16) float32 in FRAME_FIELDS order and units; all zeros = the neutral
                rest, ``photo_params`` = the photo.

        Returns:
            (T, H, W, 3) uint8 RGB frames.
        """
        params = np.asarray(params)
        if params.ndim != 2 or params.shape[1] != len(FRAME_FIELDS):
            raise InputError(
                f"portrait params must be (T, {len(FRAME_FIELDS)}) in FRAME_FIELDS order, "
                f"got shape {params.shape}"
            )
        if not np.isfinite(params).all():
            raise InputError("portrait params contain NaN or infinite values")
        # A motion model may overshoot: hold every field to its documented range.
        params = np.clip(params.astype(np.float32), PARAM_LOW, PARAM_HIGH)
        rig = self.rig
        both = rig.displacements(params)  # (T, P, 2): mesh vertices, then the teeth anchors
        frames = np.empty((len(params), self.height, self.width, 3), np.uint8)
        y0, y1, x0, x1 = self.mesh.box
        teeth = slice(rig.teeth_up.start, rig.teeth_lo.stop)

        for t, p in enumerate(params):
            frame = frames[t]
            frame[:] = self.image
            d = both[t, : rig.n_mesh]
            if np.abs(d).max() < 1e-3:
                # Below a thousandth of a pixel (rounding in the pose rotation) nothing moves:
                # cv2.remap would sample the same pixels; skip the warp.
                d = np.zeros_like(d)
            blink, gx, gy = float(p[F["blink"]]), float(p[F["gaze_x"]]), float(p[F["gaze_y"]])
            eyes = blink != 0.0 or gx != 0.0 or gy != 0.0
            blink = float(np.clip(blink, 0, 1))
            moved = self.landmarks[:N_FACE, :2] + d[:N_FACE]
            up, lo = moved[self._inner_up], moved[self._inner_lo]
            paint = self._paints(d, up, lo)
            if np.any(d):
                # Once anything moves, the lips may close over what lay between them: the warp
                # takes the photo with its gap filled by the lips (``closed_lip_source``).
                source = self._source
                if eyes:
                    source = source.copy()
                    self.eyes.apply(self._source[..., :3], source[..., :3], blink, gx, gy)
                field = self.mesh.field(d)  # (ch, cw, 2)
                off = inverse_offsets(field, INVERSE_STEPS)
                off = cv2.resize(off, (x1 - x0, y1 - y0), interpolation=cv2.INTER_LINEAR)
                # One interleaved (bh, bw, 2) map: x and y without splitting the offsets.
                xy = cv2.add(self._grid, off)
                if paint:
                    self._exact_mouth(d, xy)
                # The photo and its person alpha through fixed-point maps (1/32 pixel): cheaper
                # than the float map, within 2 levels of it (docs/benchmarks.md, "Figures
                # behind code choices").
                fixed, frac = cv2.convertMaps(xy, None, cv2.CV_16SC2)
                warped = cv2.remap(
                    source, fixed, frac, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
                )
                # The person over the still background plate, in 8 bits:
                # person * alpha + plate * (1 - alpha), each product rounded.
                alpha = cv2.extractChannel(warped, 3)
                alpha = cv2.merge([alpha, alpha, alpha])
                person = cv2.multiply(
                    cv2.cvtColor(warped, cv2.COLOR_RGBA2RGB), alpha, scale=1 / 255
                )
                plate = cv2.multiply(self._plate, cv2.bitwise_not(alpha), scale=1 / 255)
                frame[y0:y1, x0:x1] = cv2.add(person, plate)
            elif eyes:
                self.eyes.apply(self.image, frame, blink, gx, gy)
            if not paint:
                continue  # the warp already shows the photo's own mouth, moved
            anchors = (self._anchors + both[t, teeth]).astype(np.float64)
            self.mouth.paint(
                frame,
                up.astype(np.float64),
                lo.astype(np.float64),
                anchors[:11],
                anchors[11:],
                float(np.clip(p[F["tongue"]], 0, 1)),
            )
        return frames
