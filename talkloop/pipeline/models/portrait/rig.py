"""The face rig: per-frame motion parameters -> displacement of every warp-mesh vertex.

Motions are built in a face frame (u along the eye line, v down the face, z into the picture,
all in face heights: forehead top to chin) from the photo's own landmarks, so they scale and
tilt with the face:

- mouth: the lower jaw swings about a hinge near the ears (a rotation in the v-z plane: the chin,
  far in front of the hinge, drops most; the jaw line near the ears hardly moves); the lips part
  on top of that; width / smile / round move the lip corners, a smile also lifts the cheeks;
- brows: brows and forehead slide up, the lid skin below them stretches;
- head pose: the displaced face points rotate in 3-D about a pivot behind the face (the
  landmarks' z gives the depth), and shift by tx / ty; hair anchors follow partly, the neck and
  the clothes not at all, nor the frame border. Sideways the face's outline turns less than its
  middle (a turning head keeps its silhouette), and a photo already turned turns less.

Blinks and gaze are not mesh motions (the lid covers the eye, it does not squash it): see
``eyes.py``.
"""

from __future__ import annotations

import cv2
import numpy as np

from talkloop.pipeline.models.portrait import topology as topo
from talkloop.pipeline.models.portrait.face import head_pose
from talkloop.pipeline.models.portrait.mesh import N_FACE, WarpMesh
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS

F = {name: i for i, name in enumerate(FRAME_FIELDS)}

# Amplitudes in face heights (or radians) at parameter 1.
JAW_OPEN = 0.17  # jaw rotation (rad) from mouth_open
JAW_EXTRA = 0.09  # jaw rotation (rad) from jaw
UPPER_LIP_RAISE = 0.022  # from mouth_open
LOWER_LIP_DROP = 0.018  # from mouth_open, on top of the jaw
WIDTH_GAIN = 0.2  # corners move this fraction of the half-width per unit mouth_width
SMILE_WIDEN = 0.14
SMILE_LIFT = 0.035
CHEEK_LIFT = 0.018
ROUND_NARROW = 0.3
ROUND_PART = 0.012
BROW_LIFT = 0.035
CORNER_JAW = 0.3  # how much of the jaw's drop the mouth corners take
CORNER_STEP = 0.32  # smoothstep offset giving about CORNER_JAW on the line through the corners
# A warp cannot show what the photo hides: a face already turned in the photo turns less, and
# the total turn (photo + parameter) eases off towards YAW_LIMIT. Beyond that the nose folds
# over the far cheek.
YAW_LIMIT = 0.5  # rad, about 29 degrees
YAW_DAMP = 0.8  # parameter yaw scaled by 1 - |photo yaw| / YAW_DAMP (at most by 0.6)


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def _ease(total: np.ndarray) -> np.ndarray:
    """Total head yaw eased towards +-YAW_LIMIT: unchanged up to 80 % of it."""
    knee = 0.8 * YAW_LIMIT
    over = np.maximum(np.abs(total) - knee, 0.0)
    soft = np.minimum(np.abs(total), knee) + 0.2 * YAW_LIMIT * np.tanh(over / (0.2 * YAW_LIMIT))
    return np.sign(total) * soft


class FaceRig:
    """Precomputed face frame and motion bases of one photo's warp mesh.

    Args:
        mesh: the photo's warp mesh.
        landmarks: (478, 3) landmarks of the photo.
        image_height: the frame height in pixels (tx / ty are in half-heights of it).
        anchor_mobility: (R,) in [0, 1], how much each ring anchor follows the head (the person
            mask at the anchor: hair follows, background does not).
    """

    def __init__(
        self,
        mesh: WarpMesh,
        landmarks: np.ndarray,
        image_height: int,
        anchor_mobility: np.ndarray,
    ) -> None:
        lm = landmarks.astype(np.float64)
        eye_r = lm[list(topo.RIGHT_EYE_UPPER + topo.RIGHT_EYE_LOWER), :2].mean(0)
        eye_l = lm[list(topo.LEFT_EYE_UPPER + topo.LEFT_EYE_LOWER), :2].mean(0)
        ex = (eye_l - eye_r) / np.linalg.norm(eye_l - eye_r)
        self.axes = np.stack([ex, [-ex[1], ex[0]]])  # (2, 2): rows u, v (image -> face frame)
        self.scale = float(np.linalg.norm(lm[topo.FOREHEAD_TOP, :2] - lm[topo.CHIN, :2]))
        self.origin = lm[:N_FACE, :2].mean(0)
        self.half_height = image_height / 2.0
        n_vert = len(mesh.points)
        uv = (mesh.points.astype(np.float64) - self.origin) @ self.axes.T / self.scale  # (V, 2)
        z = np.zeros(n_vert)
        z[:N_FACE] = (lm[:N_FACE, 2] - lm[:N_FACE, 2].mean()) / self.scale
        z[N_FACE : N_FACE + mesh.n_ring] = 0.35  # hair: behind the face's mean depth
        self.uv, self.z = uv, z
        u, v = uv[:, 0], uv[:, 1]

        # Mouth frame.
        iu, il = list(topo.LIPS_INNER_UPPER), list(topo.LIPS_INNER_LOWER)
        mid = (uv[iu] + uv[il]) / 2  # (11, 2), right corner to left corner
        self.mouth_centre = mid.mean(0)
        uc, vc = self.mouth_centre
        wh = abs(uv[topo.LIPS_INNER_UPPER[-1], 0] - uv[topo.LIPS_INNER_UPPER[0], 0]) / 2
        self.mouth_half_width = wh
        du = u - uc

        # Lower-jaw membership: below the lip line, sharp at the lips, soft beyond the corners.
        order = np.argsort(mid[:, 0])
        lip_line = np.interp(u, mid[order, 0], mid[order, 1])
        thick = 0.015 + 1.5 * np.maximum(0.0, np.abs(du) - 0.8 * wh)
        # The mouth's corners (and the skin beside them) follow the jaw only by CORNER_JAW: an
        # opening mouth parts in the middle; corners that dropped with the chin would shear
        # the upper lip beside them.
        lower = _smoothstep((v - lip_line) / (2 * thick) + CORNER_STEP)
        face = np.arange(n_vert) < N_FACE
        lower = np.where(face, lower, 0.0)
        # On the lips the opening tapers to the corners, where both lips meet.
        for contours, half in (
            ((topo.LIPS_INNER_UPPER, topo.LIPS_INNER_LOWER), wh),
            (
                (topo.LIPS_OUTER_UPPER, topo.LIPS_OUTER_LOWER),
                self._half_width(uv, topo.LIPS_OUTER_UPPER),
            ),
        ):
            for contour, sign in zip(contours, (-1.0, 1.0), strict=True):
                idx = list(contour)
                taper = np.clip(1 - (du[idx] / half) ** 2, 0, 1) ** 0.75
                base = CORNER_JAW + (1 - CORNER_JAW) * taper
                lower[idx] = base if sign > 0 else CORNER_JAW * (1 - taper) ** 3
        self.lower = lower

        # Jaw hinge: at the ears' height and behind the face.
        ears = [234, 454]
        self.hinge_v = float(uv[ears, 1].mean())
        self.hinge_z = float(z[ears].mean()) + 0.1

        # Lip parting profiles: 1 on the inner lip, fading to the nose (above) / chin (below).
        v_in_up = np.interp(u, uv[iu][np.argsort(uv[iu, 0]), 0], uv[iu][np.argsort(uv[iu, 0]), 1])
        v_in_lo = np.interp(u, uv[il][np.argsort(uv[il, 0]), 0], uv[il][np.argsort(uv[il, 0]), 1])
        v_nose = uv[2, 1]  # below the nose
        v_chin = uv[topo.CHIN, 1]
        lat = np.clip(1 - (du / (1.05 * wh)) ** 2, 0, 1) ** 0.75
        up_prof = np.clip((v - v_nose) / max(v_in_up.mean() - v_nose, 1e-3), 0, 1)
        lo_prof = np.clip(1 - (v - v_in_lo) / max(v_chin - v_in_lo.mean(), 1e-3), 0, 1)
        self.part_up = np.where(face, up_prof * lat * (1 - lower), 0.0)
        self.part_lo = np.where(face, lo_prof * lat * lower, 0.0)
        narrow = np.exp(-((du / (0.6 * wh)) ** 2))
        self.round_up = np.zeros(n_vert)
        self.round_up[list(topo.LIPS_INNER_UPPER)] = narrow[list(topo.LIPS_INNER_UPPER)]
        self.round_lo = np.zeros(n_vert)
        self.round_lo[list(topo.LIPS_INNER_LOWER)] = narrow[list(topo.LIPS_INNER_LOWER)]

        # Around the mouth: how much a vertex follows the lip corners.
        prox = np.exp(-((du / (1.5 * wh)) ** 2) - ((v - vc) / (1.1 * wh)) ** 2)
        self.prox = np.where(face, prox, 0.0)
        corner = np.clip(np.abs(du) / wh, 0, 1.3) ** 2
        side = np.exp(-((np.maximum(0.0, np.abs(du) - wh) / (0.8 * wh)) ** 2))
        lift = corner * side * np.exp(-(((v - vc) / (0.9 * wh)) ** 2))
        self.smile_lift = np.where(face, lift, 0.0)
        cheek_u = 1.35 * wh
        cheek_v = 0.5 * (uv[1, 1] + vc) - 0.05  # between the nose tip and the mouth, up a bit
        cheek = np.exp(-(((np.abs(du) - cheek_u) / 0.12) ** 2) - ((v - cheek_v) / 0.12) ** 2)
        self.cheek = np.where(face, cheek, 0.0)

        # Brows: 1 on the brows, 0 at the upper lids, 0.3 at the forehead top.
        brows = list(topo.RIGHT_BROW + topo.LEFT_BROW)
        lids = list(topo.RIGHT_EYE_UPPER + topo.LEFT_EYE_UPPER)
        v_brow, v_lid = uv[brows, 1].mean(), uv[lids, 1].mean()
        v_top = uv[topo.FOREHEAD_TOP, 1]
        below = _smoothstep((v_lid - v) / max(v_lid - v_brow, 1e-3))
        above = 1 - 0.7 * np.clip((v_brow - v) / max(v_brow - v_top, 1e-3), 0, 1)
        brow = np.where(v < v_brow, above, below)
        span = np.exp(-((np.maximum(0.0, np.abs(u) - 0.38) / 0.1) ** 2))
        self.brow = np.where(face, brow * span, 0.0)

        # Head motion: face points all of it, hair anchors as the mask allows, neck less.
        mob = np.zeros(n_vert)
        mob[:N_FACE] = 1.0
        ring = N_FACE + np.arange(mesh.n_ring)
        # 0 beside the head, 1 from a little above the chin down: neck, collar and shoulders
        # stay (a turning head does not drag the clothes).
        neck = _smoothstep((v[ring] - vc) / max(v_chin - vc, 1e-3))
        ring_follow = np.where(mesh.ring == 1, 0.9, 0.45) * (1 - neck)
        mob[ring] = ring_follow * np.clip(anchor_mobility, 0, 1)
        self.mobility = mob
        # Sideways, the face's outline turns less than its middle: a turning head keeps its
        # silhouette (a ball turning about its axis), and what would come into view beyond a
        # three-quarter face's far cheek is not in the photo, so the cheek stretches instead.
        oval = (uv[list(topo.FACE_OVAL)] * 1000).astype(np.float32).reshape(-1, 1, 2)
        edge = np.ones(n_vert)
        for i in range(N_FACE):
            dist = cv2.pointPolygonTest(oval, (float(u[i] * 1000), float(v[i] * 1000)), True)
            edge[i] = 0.35 + 0.65 * _smoothstep(max(dist, 0.0) / 1000 / 0.15)
        self.turn_u = edge
        self.photo_yaw = float(head_pose(landmarks)[0])
        # Pivot of the head: behind the face, a little below its centre (the neck's top).
        self.pivot = np.array([0.0, 0.15, 0.45])

    @staticmethod
    def _half_width(uv: np.ndarray, contour: tuple[int, ...]) -> float:
        return float(abs(uv[contour[-1], 0] - uv[contour[0], 0]) / 2)

    def effective_yaw(self, yaw: np.ndarray) -> np.ndarray:
        """The turn the warp can show for a requested yaw, given how the photo is turned."""
        y0 = self.photo_yaw
        yaw = yaw * (1 - min(abs(y0) / YAW_DAMP, 0.6))
        return _ease(y0 + yaw) - _ease(np.asarray(y0))  # 0 stays 0: neutral is the photo

    def displacements(self, params: np.ndarray) -> np.ndarray:
        """Vertex displacements for a batch of frames.

        Args:
            params: (T, 16) float32 in FRAME_FIELDS order.

        Returns:
            (T, V, 2) float32 displacement of every mesh vertex in image pixels.
        """
        p = params.astype(np.float64)
        col = {name: p[:, i : i + 1] for name, i in F.items()}  # (T, 1) each
        u, v = self.uv[None, :, 0], self.uv[None, :, 1]  # (1, V)
        uc = self.mouth_centre[0]
        du = u - uc
        # Expression, in face heights.
        theta = JAW_OPEN * col["mouth_open"] + JAW_EXTRA * col["jaw"]  # (T, 1)
        dv_h, dz_h = v - self.hinge_v, self.z[None] - self.hinge_z
        jaw_v = dv_h * (np.cos(theta) - 1) - dz_h * np.sin(theta)
        jaw_z = dv_h * np.sin(theta) + dz_h * (np.cos(theta) - 1)
        e_v = self.lower * jaw_v
        e_z = self.lower * jaw_z
        mo = col["mouth_open"]
        e_v = e_v - UPPER_LIP_RAISE * mo * self.part_up + LOWER_LIP_DROP * mo * self.part_lo
        rd = col["mouth_round"]
        e_v = e_v - ROUND_PART * rd * self.round_up + ROUND_PART * rd * self.round_lo
        gain = WIDTH_GAIN * col["mouth_width"] + SMILE_WIDEN * col["smile"] - ROUND_NARROW * rd
        e_u = gain * du * self.prox
        sm = col["smile"]
        e_v = e_v - SMILE_LIFT * sm * self.smile_lift - CHEEK_LIFT * sm * self.cheek
        e_v = e_v - BROW_LIFT * col["brow_raise"] * self.brow

        # Head pose: rotate the displaced points about the pivot (weak perspective).
        pu = u + e_u - self.pivot[0]
        pv = v + e_v - self.pivot[1]
        pz = self.z[None] + e_z - self.pivot[2]
        yaw = self.effective_yaw(col["yaw"])
        cy, sy = np.cos(yaw), np.sin(yaw)
        cp, sp = np.cos(col["pitch"]), np.sin(col["pitch"])
        cr, sr = np.cos(col["roll"]), np.sin(col["roll"])
        # Yaw about the vertical axis (nose to the image right for yaw > 0), then pitch (nose
        # down for pitch > 0), then roll (clockwise in the image for roll > 0).
        u1, z1 = pu * cy - pz * sy, pu * sy + pz * cy
        v1 = pv * cp - z1 * sp
        u2, v2 = u1 * cr - v1 * sr, u1 * sr + v1 * cr
        m = self.mobility[None]
        ru = (u2 + self.pivot[0] - u - e_u) * m * self.turn_u[None]
        rv = (v2 + self.pivot[1] - v - e_v) * m
        d_face = np.stack([e_u + ru, e_v + rv], -1) * self.scale  # (T, V, 2) face frame px
        d_img = d_face @ self.axes  # (T, V, 2) image axes
        shift = np.concatenate([col["tx"], col["ty"]], 1)[:, None, :] * self.half_height
        return (d_img + shift * m[..., None]).astype(np.float32)
