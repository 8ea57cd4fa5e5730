"""The face rig: per-frame motion parameters -> displacement of every warp-mesh vertex.

Motions are built in a face frame (u along the eye line, v down the face, z into the picture,
all in face heights of the neutral face: forehead top to chin) from the photo's own landmarks,
so they scale and tilt with the face.

Parameters move the face from a neutral rest, not from the photo. ``neutral.py`` reads the
photo's own expression; the rig builds the neutral face from it (lips closed where the photo
parts them: each inner-lip pair meets on a seam, the upper lip taking the share the photo's
teeth call for; a smile's corners brought in and down) and the parameters that describe the
photo (``photo_params``). A frame's expression displacement, from the photo, is

    E(p) - E(photo) + (1 - s_open(p)) Q_open + (1 - s_smile(p)) Q_smile

with E the generic motion bases (below), s a ramp that is 0 at rest and 1 at the photo's own
value of that motion, and Q what the photo's expression holds beyond the generic bases (its
own lip shape, a smile wider than the bases make). All-zero parameters give the neutral face;
the photo's parameters give zero displacement, bit for bit the photo. Between rest and the
photo's value a motion interpolates the photo's own shape; beyond it the generic bases go on.

- mouth: the lower jaw swings about a hinge near the ears (a rotation in the v-z plane: the chin,
  far in front of the hinge, drops most; the jaw line near the ears hardly moves); the lips part
  on top of that. The opening is in face heights: ``mouth_open`` and ``jaw`` open the middle of
  the inner lips by ``OPEN_GAP`` and ``JAW_GAP`` at 1 on every photo (the jaw's angle is solved
  per photo for it); ``teeth`` raises the upper lip off the teeth and drops the lower one.
  Width / smile / round move the lip corners, a smile also lifts the cheeks;
- brows: brows and forehead slide up, the lid skin below them stretches;
- teeth: two rows of anchor points on the seam (not mesh vertices) carry the upper teeth with
  the skull and the lower teeth with the jaw (``mouth.py`` hangs the teeth from them);
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
from talkloop.pipeline.models.portrait.neutral import CENTRE_PAIRS, PhotoExpression
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS

F = {name: i for i, name in enumerate(FRAME_FIELDS)}

# Mouth opening at parameter 1: the middle of the inner lips parts by this many face heights.
OPEN_GAP = 0.12  # from mouth_open (through ``lip_share``)
OPEN_FROM = 0.07  # mouth_open below this keeps the lips shut
OPEN_BOOST = 2.5  # how much faster than linear the opening rises from there (``lip_share``)
JAW_GAP = 0.035  # from jaw (speech drives jaw at 0.8 x mouth_open: 0.148 wide open)
UPPER_LIP_RAISE = 0.018  # of the opening, the upper lip's share at mouth_open 1 (teeth 1)
LOWER_LIP_DROP = 0.008  # the lower lip's drop on top of the jaw at mouth_open 1 (teeth 1)
MAX_JAW = 0.8  # rad: the jaw angle table's end
WIDTH_GAIN = 0.2  # corners move this fraction of the half-width per unit mouth_width
SMILE_WIDEN = 0.14
SMILE_LIFT = 0.035
CHEEK_LIFT = 0.018
ROUND_NARROW = 0.3
ROUND_PART = 0.012
BROW_LIFT = 0.035
CORNER_JAW = 0.3  # how much of the jaw's drop the mouth corners take
CORNER_STEP = 0.32  # smoothstep offset giving about CORNER_JAW on the line through the corners
CHIN_CLOSE = 0.5  # closing the photo's lips moves the chin this share of the lower lip's move
LIFT_REST_FH = 0.006  # at rest the mouth corners lie this much above the lips' middle
TEETH_DEPTH = 0.03  # teeth anchors lie this far behind the lips (face heights)
# A warp cannot show what the photo hides: a face already turned in the photo turns less, and
# the total turn (photo + parameter) eases off towards YAW_LIMIT. Beyond that the nose folds
# over the far cheek.
YAW_LIMIT = 0.5  # rad, about 29 degrees
YAW_DAMP = 0.8  # parameter yaw scaled by 1 - |photo yaw| / YAW_DAMP (at most by 0.6)

_CENTRE = list(CENTRE_PAIRS)  # the inner-lip pairs at the middle of the mouth
_IU, _IL = list(topo.LIPS_INNER_UPPER), list(topo.LIPS_INNER_LOWER)
# The two rings of mesh points inside each lip, between its outer and inner contours (right
# corner to left), in mediapipe's topology.
UPPER_LIP_RINGS = (
    (76, 184, 74, 73, 72, 11, 302, 303, 304, 408, 306),
    (62, 183, 42, 41, 38, 12, 268, 271, 272, 407, 292),
)
LOWER_LIP_RINGS = (
    (77, 90, 180, 85, 16, 315, 404, 320, 307),
    (96, 89, 179, 86, 15, 316, 403, 319, 325),
)
_OPEN_FIELDS = ("mouth_open", "jaw", "teeth")


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def _ease(total: np.ndarray) -> np.ndarray:
    """Total head yaw eased towards +-YAW_LIMIT: unchanged up to 80 % of it."""
    knee = 0.8 * YAW_LIMIT
    over = np.maximum(np.abs(total) - knee, 0.0)
    soft = np.minimum(np.abs(total), knee) + 0.2 * YAW_LIMIT * np.tanh(over / (0.2 * YAW_LIMIT))
    return np.sign(total) * soft


def lip_share(mouth_open: np.ndarray) -> np.ndarray:
    """The share of ``OPEN_GAP`` that ``mouth_open`` asks for: 0 up to ``OPEN_FROM``, 1 at 1.

    Not linear: the motion net's speech sits mostly in the small openings of consonants and
    unstressed vowels (its median mouth_open in speech is 0.26-0.34 on five voices), and a
    mouth that shuts between every pair of syllables reads as chattering, not talking. Rising
    ``OPEN_BOOST`` times faster at the start and flattening towards 1, the curve holds those
    openings (0.2 -> 0.40, 0.3 -> 0.60 of ``OPEN_GAP``) and moves the widest vowels little (0.7
    -> 0.85, 1 -> 1); below ``OPEN_FROM`` (a bilabial the net does not quite close: guided, its
    median there is about 0.06) the lips stay shut. Read back from frames by the shipped face mesh, the same
    speech opens 0.04-0.10 face heights (median over speech frames) with a serious face
    (``docs/benchmarks.md``).
    """
    h = np.clip((np.asarray(mouth_open, np.float64) - OPEN_FROM) / (1 - OPEN_FROM), 0.0, 1.0)
    return h + OPEN_BOOST * h * (1 - h) ** 2


def opening(params: np.ndarray) -> np.ndarray:
    """(T,) the inner lips' opening the parameters ask for, in face heights."""
    p = np.asarray(params, np.float64)
    return OPEN_GAP * lip_share(p[:, F["mouth_open"]]) + JAW_GAP * p[:, F["jaw"]]


def _lip_blend(uv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lip rings' points as blends of their lip's outer and inner contours.

    Moved independently, a ring point near a contour can pass it (some photos' landmarks
    already put the upper lip's inner ring below the inner contour) and fold the lip's
    triangles; moved as a blend of the two contours at its place across the mouth, in the
    proportion it lies between them, a lip band only ever stretches or thins.

    Returns:
        rings: (R,) the ring points; weights: (R, P) each row sums to 1 over contour points.
    """
    rings, rows = [], []
    for ring_set, outer, inner in (
        (UPPER_LIP_RINGS, topo.LIPS_OUTER_UPPER, topo.LIPS_INNER_UPPER),
        (LOWER_LIP_RINGS, topo.LIPS_OUTER_LOWER, topo.LIPS_INNER_LOWER),
    ):
        for ring in ring_set:
            for k in ring:
                row = np.zeros(len(uv))
                ends = []
                for contour in (outer, inner):
                    c = np.array(contour)
                    order = np.argsort(uv[c, 0])
                    cu, cv = uv[c[order], 0], uv[c[order], 1]
                    j = int(np.clip(np.searchsorted(cu, uv[k, 0]), 1, len(cu) - 1))
                    f = float(np.clip((uv[k, 0] - cu[j - 1]) / max(cu[j] - cu[j - 1], 1e-9), 0, 1))
                    ends.append(
                        (
                            (c[order][j - 1], 1 - f),
                            (c[order][j], f),
                            cv[j - 1] + f * (cv[j] - cv[j - 1]),
                        )
                    )
                (o0, o1, ov), (i0, i1, iv) = ends
                r = (
                    float(np.clip((uv[k, 1] - ov) / (iv - ov), 0, 1))
                    if abs(iv - ov) > 1e-9
                    else 1.0
                )
                for (idx, wgt), share in ((o0, 1 - r), (o1, 1 - r), (i0, r), (i1, r)):
                    row[idx] += wgt * share
                rings.append(k)
                rows.append(row)
    return np.array(rings), np.array(rows)


class _Bases:
    """The generic motion bases of a face, per point (all (P,) arrays, face units)."""

    def __init__(self, uv: np.ndarray, face: np.ndarray) -> None:
        u, v = uv[:, 0], uv[:, 1]
        iu, il = _IU, _IL
        mid = (uv[iu] + uv[il]) / 2  # (11, 2), right corner to left corner
        self.mouth_centre = mid.mean(0)
        uc, vc = self.mouth_centre
        wh = abs(uv[iu[-1], 0] - uv[iu[0], 0]) / 2
        self.mouth_half_width = wh
        du = u - uc
        # Lower-jaw membership: below the lip line, sharp at the lips, soft beyond the corners.
        order = np.argsort(mid[:, 0])
        self.lip_line = np.interp(u, mid[order, 0], mid[order, 1])
        thick = 0.015 + 1.5 * np.maximum(0.0, np.abs(du) - 0.8 * wh)
        # The mouth's corners (and the skin beside them) follow the jaw only by CORNER_JAW: an
        # opening mouth parts in the middle; corners that dropped with the chin would shear
        # the upper lip beside them.
        lower = _smoothstep((v - self.lip_line) / (2 * thick) + CORNER_STEP)
        lower = np.where(face, lower, 0.0)
        # On the lips the opening tapers to the corners, where both lips meet.
        outer_half = abs(uv[topo.LIPS_OUTER_UPPER[-1], 0] - uv[topo.LIPS_OUTER_UPPER[0], 0]) / 2
        for contours, half in (
            ((topo.LIPS_INNER_UPPER, topo.LIPS_INNER_LOWER), wh),
            ((topo.LIPS_OUTER_UPPER, topo.LIPS_OUTER_LOWER), outer_half),
        ):
            for contour, sign in zip(contours, (-1.0, 1.0), strict=True):
                idx = list(contour)
                taper = np.clip(1 - (du[idx] / half) ** 2, 0, 1) ** 0.75
                base = CORNER_JAW + (1 - CORNER_JAW) * taper
                lower[idx] = base if sign > 0 else CORNER_JAW * (1 - taper) ** 3
        self.lower = lower

        # Lip parting profiles: 1 on the inner lip, fading to the nose (above) / chin (below).
        su, sl = np.argsort(uv[iu, 0]), np.argsort(uv[il, 0])
        v_in_up = np.interp(u, uv[iu][su, 0], uv[iu][su, 1])
        v_in_lo = np.interp(u, uv[il][sl, 0], uv[il][sl, 1])
        v_nose = uv[2, 1]  # below the nose
        v_chin = uv[topo.CHIN, 1]
        lat = np.clip(1 - (du / (1.05 * wh)) ** 2, 0, 1) ** 0.75
        self.up_prof = np.clip((v - v_nose) / max(v_in_up.mean() - v_nose, 1e-3), 0, 1)
        self.lo_prof = np.clip(1 - (v - v_in_lo) / max(v_chin - v_in_lo.mean(), 1e-3), 0, 1)
        self.part_up = np.where(face, self.up_prof * lat * (1 - lower), 0.0)
        self.part_lo = np.where(face, self.lo_prof * lat * lower, 0.0)
        narrow = np.exp(-((du / (0.6 * wh)) ** 2))
        self.round_up = np.zeros(len(u))
        self.round_up[iu] = narrow[iu]
        self.round_lo = np.zeros(len(u))
        self.round_lo[il] = narrow[il]

        # Around the mouth: how much a point follows the lip corners.
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
        self.du = du

    def still(self, idx: slice | np.ndarray) -> None:
        """Points that no expression moves (the teeth anchors: the jaw is set apart)."""
        for name in ("lower", "part_up", "part_lo", "round_up", "round_lo", "prox"):
            getattr(self, name)[idx] = 0.0
        self.smile_lift[idx] = 0.0
        self.cheek[idx] = 0.0


class FaceRig:
    """Precomputed face frame, neutral face and motion bases of one photo's warp mesh.

    Args:
        mesh: the photo's warp mesh.
        landmarks: (478, 3) landmarks of the photo.
        image_height: the frame height in pixels (tx / ty are in half-heights of it).
        anchor_mobility: (R,) in [0, 1], how much each ring anchor follows the head (the person
            mask at the anchor: hair follows, background does not).
        expression: the photo's own expression (``neutral.read_expression``).

    Attributes:
        n_mesh: the mesh's vertex count; ``displacements`` returns these first, then the
            upper teeth anchors (``teeth_up``) and the lower ones (``teeth_lo``).
        seam: (11, 2) where the closed lips meet in the neutral face (photo pixels): the
            teeth anchors' rest positions.
        anchor_points: (22, 2) float32 the teeth anchors in the photo (the upper ones on the
            seam, the lower ones where the photo's open jaw holds them).
        photo_params: (16,) float32 the parameters that describe the photo.
    """

    def __init__(
        self,
        mesh: WarpMesh,
        landmarks: np.ndarray,
        image_height: int,
        anchor_mobility: np.ndarray,
        expression: PhotoExpression,
    ) -> None:
        lm = landmarks.astype(np.float64)
        eye_r = lm[list(topo.RIGHT_EYE_UPPER + topo.RIGHT_EYE_LOWER), :2].mean(0)
        eye_l = lm[list(topo.LEFT_EYE_UPPER + topo.LEFT_EYE_LOWER), :2].mean(0)
        ex = (eye_l - eye_r) / np.linalg.norm(eye_l - eye_r)
        self.axes = np.stack([ex, [-ex[1], ex[0]]])  # (2, 2): rows u, v (image -> face frame)
        self.origin = lm[:N_FACE, :2].mean(0)
        self.half_height = image_height / 2.0
        self.expression = expression
        n_mesh = len(mesh.points)
        self.n_mesh = n_mesh
        self.teeth_up = slice(n_mesh, n_mesh + 11)
        self.teeth_lo = slice(n_mesh + 11, n_mesh + 22)

        # The lips' closing, in image pixels: each inner-lip pair meets on the seam.
        up = lm[_IU, :2]
        share = expression.upper_share
        gap = expression.gap_px if expression.closes else np.zeros((11, 2))
        # Where the lips meet at rest (on a closed photo: between its lips, which stay).
        self.seam = up + share * expression.gap_px  # (11, 2)
        # Teeth anchors in the photo: the upper ones on the skull at the seam, the lower ones on
        # the jaw, which the closing lifts with the lower lip.
        points = np.concatenate([mesh.points, self.seam, self.seam + (1 - share) * gap])
        self.anchor_points = points[n_mesh:].astype(np.float32)  # (22, 2)
        n = len(points)
        face = np.zeros(n, bool)
        face[:N_FACE] = True
        photo_scale = float(np.linalg.norm(lm[topo.FOREHEAD_TOP, :2] - lm[topo.CHIN, :2]))
        self._photo_scale = photo_scale
        uv0 = (points - self.origin) @ self.axes.T / photo_scale
        b0 = _Bases(uv0, face)
        self._rings, self._blend = _lip_blend(uv0)
        close_up, close_lo = self._closing(uv0, b0, face, gap, share)  # (P, 2) px, image axes
        close = close_up + close_lo
        self.uv_smile = (points + close - self.origin) @ self.axes.T / photo_scale
        b1 = _Bases(self.uv_smile, face)
        unsmile = self._unsmiling(b1, expression)  # (P, 2) pixels, image axes
        unsmile[self._rings] = self._blend @ unsmile

        # The neutral face: its face height is the rig's unit.
        rest = points + close + unsmile
        self.scale = float(np.linalg.norm(rest[topo.FOREHEAD_TOP] - rest[topo.CHIN]))
        self.uv = (points - self.origin) @ self.axes.T / self.scale  # (P, 2) the photo's points
        uv_n = (rest - self.origin) @ self.axes.T / self.scale
        bases = _Bases(uv_n, face)
        bases.still(np.r_[self.teeth_up.start : self.teeth_lo.stop])
        bases.lower[self.teeth_lo] = 1.0  # the lower teeth ride the jaw
        self.bases = bases
        self.uv_rest = uv_n
        self.mouth_centre = bases.mouth_centre
        self.mouth_half_width = bases.mouth_half_width

        z = np.zeros(n)
        z[:N_FACE] = (lm[:N_FACE, 2] - lm[:N_FACE, 2].mean()) / self.scale
        z[N_FACE : N_FACE + mesh.n_ring] = 0.35  # hair: behind the face's mean depth
        z[self.teeth_up.start : self.teeth_lo.stop] = z[_IU + _IL].mean() + TEETH_DEPTH
        self.z = z

        # Jaw hinge: at the ears' height and behind the face.
        ears = [234, 454]
        self.hinge_v = float(uv_n[ears, 1].mean())
        self.hinge_z = float(z[ears].mean()) + 0.1
        self._jaw_table(uv_n)

        # Brows: 1 on the brows, 0 at the upper lids, 0.3 at the forehead top.
        u, v = self.uv[:, 0], self.uv[:, 1]
        brows = list(topo.RIGHT_BROW + topo.LEFT_BROW)
        lids = list(topo.RIGHT_EYE_UPPER + topo.LEFT_EYE_UPPER)
        v_brow, v_lid = v[brows].mean(), v[lids].mean()
        v_top = v[topo.FOREHEAD_TOP]
        below = _smoothstep((v_lid - v) / max(v_lid - v_brow, 1e-3))
        above = 1 - 0.7 * np.clip((v_brow - v) / max(v_brow - v_top, 1e-3), 0, 1)
        brow = np.where(v < v_brow, above, below)
        span = np.exp(-((np.maximum(0.0, np.abs(u) - 0.38) / 0.1) ** 2))
        self.brow = np.where(face, brow * span, 0.0)

        # Head motion: face points (and teeth) all of it, hair anchors as the mask allows.
        mob = np.zeros(n)
        mob[:N_FACE] = 1.0
        mob[self.teeth_up.start : self.teeth_lo.stop] = 1.0
        ring = N_FACE + np.arange(mesh.n_ring)
        # 0 beside the head, 1 from a little above the chin down: neck, collar and shoulders
        # stay (a turning head does not drag the clothes).
        vc = self.mouth_centre[1]
        neck = _smoothstep((v[ring] - vc) / max(v[topo.CHIN] - vc, 1e-3))
        ring_follow = np.where(mesh.ring == 1, 0.9, 0.45) * (1 - neck)
        mob[ring] = ring_follow * np.clip(anchor_mobility, 0, 1)
        self.mobility = mob
        # Sideways, the face's outline turns less than its middle: a turning head keeps its
        # silhouette (a ball turning about its axis), and what would come into view beyond a
        # three-quarter face's far cheek is not in the photo, so the cheek stretches instead.
        oval = (self.uv[list(topo.FACE_OVAL)] * 1000).astype(np.float32).reshape(-1, 1, 2)
        edge = np.ones(n)
        for i in list(range(N_FACE)) + list(range(self.teeth_up.start, self.teeth_lo.stop)):
            dist = cv2.pointPolygonTest(oval, (float(u[i] * 1000), float(v[i] * 1000)), True)
            edge[i] = 0.35 + 0.65 * _smoothstep(max(dist, 0.0) / 1000 / 0.15)
        self.turn_u = edge
        self.photo_yaw = float(head_pose(landmarks)[0])
        # Pivot of the head: behind the face, a little below its centre (the neck's top).
        self.pivot = np.array([0.0, 0.15, 0.45])

        # The photo's own parameters, and what its expression holds beyond the bases.
        self.photo_params = self._photo_params(gap)
        ph = self.photo_params[None].astype(np.float64)
        self._open_photo = float(opening(ph)[0])
        self._smile_photo = float(ph[0, F["smile"]])
        self._e_photo = self._expression(ph)  # (3, 1, P)
        only_open = np.zeros_like(ph)
        for name in _OPEN_FIELDS:
            only_open[0, F[name]] = ph[0, F[name]]
        only_smile = np.zeros_like(ph)
        only_smile[0, F["smile"]] = ph[0, F["smile"]]
        to_face = self.axes / self.scale  # image pixels -> face units (rows u, v)
        # The photo's opening: the lower lip's part with the jaw, the upper lip's part (its
        # raise off the teeth) with the smile as well (a smile bares the teeth, speech without
        # one opens the jaw further instead: ``_bared``).
        self._q_lower = close_lo @ to_face.T + self._expression(only_open)[:2, 0].T  # (P, 2)
        self._q_upper = close_up @ to_face.T
        centre = np.array(_IU)[_CENTRE]
        self._raised = float(np.mean(close_up[centre] @ self.axes[1])) / self.scale
        self._q_smile = unsmile @ to_face.T + self._expression(only_smile)[:2, 0].T

    # -- the neutral face --------------------------------------------------------------------

    def _closing(
        self, uv: np.ndarray, b: _Bases, face: np.ndarray, gap: np.ndarray, share: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Two (P, 2) pixel moves that close the photo's lips (the inner-lip pairs meet on the
        seam): the upper lip's, down (it and the skin up to the nose take ``share`` of the
        gap), and the lower lip's, up (the rest; the chin ``CHIN_CLOSE`` of that)."""
        u, v = uv[:, 0], uv[:, 1]

        def along(contour: list[int], values: np.ndarray) -> np.ndarray:
            """(P, 2) a contour's own move at each point's place across the mouth."""
            order = np.argsort(uv[contour, 0])
            cu = uv[contour, 0][order]
            return np.stack(
                [np.interp(u, cu, values[order, k], left=0.0, right=0.0) for k in (0, 1)], 1
            )

        below = _smoothstep((v - b.lip_line) / 0.01 + 0.5)  # which lip a point belongs to
        w_up = np.where(face, b.up_prof * (1 - below), 0.0)
        w_lo = np.where(face, below * (CHIN_CLOSE + (1 - CHIN_CLOSE) * b.lo_prof), 0.0)
        # Each point moves at most as its lip's inner edge at its place: no lip folds over.
        down = along(_IU, share * gap) * w_up[:, None]
        up = -along(_IL, (1 - share) * gap) * w_lo[:, None]
        down[_IL], up[_IU] = 0.0, 0.0
        down[_IU], up[_IL] = share * gap, -(1 - share) * gap
        for part in (down, up):
            part[_IL[0]] = part[_IL[-1]] = 0.0  # the corners (shared by both contours) stay
            part[self.teeth_up] = 0.0
            part[self.teeth_lo] = 0.0
            part[self._rings] = self._blend @ part
        up[self.teeth_lo] = -(1 - share) * gap
        return down, up

    def _unsmiling(self, b: _Bases, expression: PhotoExpression) -> np.ndarray:
        """(P, 2) pixels that take the photo's smile off (by its strength ``smile``).

        Each place along the closed lips comes down to the level of their middle (the corners
        a touch higher, ``LIFT_REST``) and the mouth narrows by ``corner_in`` at each corner;
        the lips move as a whole (their thickness kept), the skin with them, fading to nothing
        at the nose's tip, the chin's crease and beside the cheeks.
        """
        sm = expression.smile
        n = len(self.uv_smile)
        if sm <= 0.0:
            return np.zeros((n, 2))
        uv = self.uv_smile  # the photo's points with the lips closed, face units
        u, v = uv[:, 0], uv[:, 1]
        seam_u, seam_v = uv[_IU, 0], uv[_IU, 1]  # the closed lips' line, right to left
        uc = float(seam_u[_CENTRE].mean())
        half = max(float(np.abs(seam_u[[0, -1]] - uc).max()), 1e-3)
        level = float(seam_v[_CENTRE].mean())
        a_seam = (seam_u - uc) / half
        drop = sm * np.maximum(level - LIFT_REST_FH * a_seam**2 - seam_v, 0.0)  # (11,)
        order = np.argsort(seam_u)
        a = (u - uc) / half
        beside = 1 - _smoothstep((np.abs(a) - 1) / 0.6)  # 1 inside the corners
        d_v = np.interp(u, seam_u[order], drop[order]) * beside
        d_u = -expression.corner_in / self._photo_scale * np.clip(a, -1, 1) * beside
        # Up and down: all of the lips, then fading to the nose tip and the chin's crease.
        outer = list(topo.LIPS_OUTER_UPPER + topo.LIPS_OUTER_LOWER)
        top, bottom = float(uv[outer, 1].min()), float(uv[outer, 1].max())
        nose, chin = float(uv[1, 1]), float(uv[topo.CHIN, 1])
        fall = np.where(
            v < top,
            1 - _smoothstep((top - v) / max(top - nose, 1e-3)),
            1 - _smoothstep((v - bottom) / max(0.6 * (chin - bottom), 1e-3)),
        )
        face = np.arange(n) < N_FACE
        move = np.where(face[:, None], np.stack([d_u, d_v], 1) * fall[:, None], 0.0)
        return move @ self.axes * self._photo_scale  # face frame -> image pixels

    def _photo_params(self, gap: np.ndarray) -> np.ndarray:
        e = self.expression
        p = np.zeros(len(FRAME_FIELDS), np.float32)
        # The photo's opening (closed or not), measured as the rig measures it.
        gap_v = max(float(np.mean(e.gap_px[_CENTRE] @ self.axes[1])), 0.0) / self.scale
        # mouth_open with jaw = 0.8 mouth_open (as speech moves them) up to the widest; beyond
        # it the jaw opens the rest.
        mos = np.linspace(0.0, 1.0, 1001)
        gaps = OPEN_GAP * lip_share(mos) + JAW_GAP * 0.8 * mos
        mo = float(np.interp(gap_v, gaps, mos)) if gap_v < gaps[-1] else 1.0
        jaw = 0.8 * mo if mo < 1.0 else min(max((gap_v - OPEN_GAP) / JAW_GAP, 0.8), 1.0)
        p[F["mouth_open"]], p[F["jaw"]] = mo, jaw
        p[F["teeth"]] = 1.0 if e.teeth and e.closes else 0.0
        p[F["smile"]] = e.smile
        p[F["brow_raise"]] = e.brow
        return p

    # -- motion ------------------------------------------------------------------------------

    def _jaw_table(self, uv_n: np.ndarray) -> None:
        """The jaw angle that parts the middle of the lips by a given amount (face heights)."""
        theta = np.linspace(0.0, MAX_JAW, 161)[:, None]
        b = self.bases
        pts = np.r_[np.array(_IL)[_CENTRE], np.array(_IU)[_CENTRE]]
        jv = self._jaw_v(theta, uv_n[pts, 1], self.z[pts]) * b.lower[pts]  # (161, 6)
        gap = jv[:, :3].mean(1) - jv[:, 3:].mean(1)
        self._theta = theta[:, 0]
        self._jaw_gap = np.maximum.accumulate(gap)
        self._part_up = float(b.part_up[np.array(_IU)[_CENTRE]].mean())
        self._part_lo = float(b.part_lo[np.array(_IL)[_CENTRE]].mean())

    def _jaw_v(self, theta: np.ndarray, v: np.ndarray, z: np.ndarray) -> np.ndarray:
        dv_h, dz_h = v - self.hinge_v, z - self.hinge_z
        return dv_h * (np.cos(theta) - 1) - dz_h * np.sin(theta)

    def _expression(self, p: np.ndarray, extra: np.ndarray | float = 0.0) -> np.ndarray:
        """(3, T, P) the generic bases' displacement (u, v, z; face units) for ``p`` (T, 16),
        the jaw opening ``extra`` (T, 1) face heights more than the parameters ask for."""
        col = {name: p[:, i : i + 1] for name, i in F.items()}  # (T, 1) each
        b = self.bases
        v_n = self.uv_rest[None, :, 1]
        mo, teeth = col["mouth_open"], col["teeth"]
        lip_up = UPPER_LIP_RAISE * mo * (0.5 + 0.5 * teeth)
        lip_lo = LOWER_LIP_DROP * mo * (0.4 + 0.6 * teeth)
        # The jaw opens what the lips' own parting leaves of the opening asked for.
        rest = opening(p)[:, None] + extra - lip_up * self._part_up - lip_lo * self._part_lo
        theta = np.interp(np.maximum(rest, 0.0), self._jaw_gap, self._theta)  # (T, 1)
        dv_h, dz_h = v_n - self.hinge_v, self.z[None] - self.hinge_z
        jaw_v = dv_h * (np.cos(theta) - 1) - dz_h * np.sin(theta)
        jaw_z = dv_h * np.sin(theta) + dz_h * (np.cos(theta) - 1)
        e_v = b.lower * jaw_v
        e_z = b.lower * jaw_z
        e_v = e_v - lip_up * b.part_up + lip_lo * b.part_lo
        rd = col["mouth_round"]
        e_v = e_v - ROUND_PART * rd * b.round_up + ROUND_PART * rd * b.round_lo
        gain = WIDTH_GAIN * col["mouth_width"] + SMILE_WIDEN * col["smile"] - ROUND_NARROW * rd
        e_u = gain * b.du * b.prox
        sm = col["smile"]
        e_v = e_v - SMILE_LIFT * sm * b.smile_lift - CHEEK_LIFT * sm * b.cheek
        e_v = e_v - BROW_LIFT * col["brow_raise"] * self.brow
        e = np.stack([e_u, e_v, e_z])  # (3, T, P)
        e[:, :, self._rings] = e @ self._blend.T  # the lip rings follow their contours
        return e

    def effective_yaw(self, yaw: np.ndarray) -> np.ndarray:
        """The turn the warp can show for a requested yaw, given how the photo is turned."""
        y0 = self.photo_yaw
        yaw = yaw * (1 - min(abs(y0) / YAW_DAMP, 0.6))
        return _ease(y0 + yaw) - _ease(np.asarray(y0))  # 0 stays 0: no turn is the photo's

    def displacements(self, params: np.ndarray) -> np.ndarray:
        """Displacements of every mesh vertex and teeth anchor for a batch of frames.

        Args:
            params: (T, 16) float32 in FRAME_FIELDS order.

        Returns:
            (T, P, 2) float32 displacement from the photo in image pixels: the ``n_mesh``
            mesh vertices, then the teeth anchors (``teeth_up``, ``teeth_lo``).
        """
        p = params.astype(np.float64)
        col = {name: p[:, i : i + 1] for name, i in F.items()}  # (T, 1) each
        u, v = self.uv[None, :, 0], self.uv[None, :, 1]  # (1, P)
        # How far each of the photo's own motions is towards the photo's value: 0 at rest, 1 at
        # the photo's (and beyond); a motion the photo does not show is always "there".
        n = len(p)
        s_open = np.ones(n)
        if self._open_photo > 0:
            s_open = np.clip(opening(p) / self._open_photo, 0, 1)
        s_smile = np.ones(n)
        if self._smile_photo > 0:
            s_smile = np.clip(p[:, F["smile"]] / self._smile_photo, 0, 1)
        bared = s_open * s_smile  # the upper lip's raise off the teeth
        # What the upper lip does not raise of the photo's opening, the jaw opens.
        extra = (self._raised * s_open * (1 - s_smile))[:, None]
        e_u, e_v, e_z = self._expression(p, extra) - self._e_photo  # (T, P) each
        back = [(1 - s_open), (1 - bared), (1 - s_smile)]
        for b, q in zip(back, (self._q_lower, self._q_upper, self._q_smile), strict=True):
            e_u = e_u + b[:, None] * q[None, :, 0]
            e_v = e_v + b[:, None] * q[None, :, 1]

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
        d_face = np.stack([e_u + ru, e_v + rv], -1) * self.scale  # (T, P, 2) face frame px
        d_img = d_face @ self.axes  # (T, P, 2) image axes
        shift = np.concatenate([col["tx"], col["ty"]], 1)[:, None, :] * self.half_height
        return (d_img + shift * m[..., None]).astype(np.float32)
