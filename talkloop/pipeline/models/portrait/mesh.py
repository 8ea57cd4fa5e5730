"""The warp mesh of one photo: landmark triangles plus fixed anchors, and the dense flow it drives.

The 468 face-mesh points are triangulated with mediapipe's own tesselation (so no triangle jumps
the lip line), its eye and mouth holes filled with strips between the lids / lips; outside the
face oval a Delaunay triangulation joins the oval to two rings of anchors (hair, neck,
shoulders) and to anchors on the frame border, which never move. Every point of a coarse grid
(``STEP`` pixels apart) over the region that can move gets its barycentric weights over the
three corners of its triangle once per photo, as one sparse matrix: a frame's displacement
field is then a single sparse product (the field is smooth; where it is not, at the parting
lips, ``exact_inverse`` rasterises the moved triangles at full resolution).
"""

from __future__ import annotations

import cv2
import numpy as np
from scipy import sparse
from scipy.spatial import Delaunay

from talkloop.pipeline.models.portrait import topology as topo

N_FACE = 468  # mesh points; the irises (468..477) are moved by the eye warp, not the mesh
RING_SCALES = (1.3, 1.75)  # anchor rings: the face oval scaled about its centre
BORDER_STEP = 64  # pixels between frame-border anchors
STEP = 4  # the displacement field lives on a grid this many pixels apart (it is smooth)


def _strip(upper: tuple[int, ...], lower: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Triangles between two contours that share their end points (a lid pair, a lip pair)."""
    tris = []
    for i in range(len(upper) - 1):
        for t in ((upper[i], lower[i], upper[i + 1]), (upper[i + 1], lower[i], lower[i + 1])):
            if len(set(t)) == 3:
                tris.append(t)
    return tris


MOUTH_GAP = np.array(_strip(topo.LIPS_INNER_UPPER, topo.LIPS_INNER_LOWER), np.int32)
FACE_TRIANGLES = np.concatenate(
    [
        topo.TESSELATION,
        MOUTH_GAP,
        _strip(topo.RIGHT_EYE_UPPER, topo.RIGHT_EYE_LOWER),
        _strip(topo.LEFT_EYE_UPPER, topo.LEFT_EYE_LOWER),
    ]
).astype(np.int32)


class WarpMesh:
    """Vertices, triangles and grid barycentric weights of one photo's warp mesh.

    Args:
        landmarks: (478, 3) face-mesh points in the photo's pixels.
        shape: (height, width) of the photo.

    Attributes:
        points: (V, 2) float32 vertex positions; the first 468 are the face mesh, then
            ``n_ring`` ring anchors, then ``n_border`` border anchors.
        ring: (n_ring,) int which ring (1 inner, 2 outer) each ring anchor belongs to.
        box: (y0, y1, x0, x1) the region whose pixels can move (everything else is static).
    """

    def __init__(self, landmarks: np.ndarray, shape: tuple[int, int]) -> None:
        h, w = shape
        face = landmarks[:N_FACE, :2].astype(np.float64)
        oval = face[list(topo.FACE_OVAL)]
        centre = oval.mean(0)
        rings, ring_id = [], []
        for k, s in enumerate(RING_SCALES, start=1):
            step = 2 if k == 1 else 3
            pts = centre + (oval[::step] - centre) * s
            rings.append(pts)
            ring_id += [k] * len(pts)
        rings = np.concatenate(rings)
        # Anchors that fall outside the frame are pulled onto it: they would only thin the
        # triangles at the border.
        rings[:, 0] = rings[:, 0].clip(0, w - 1)
        rings[:, 1] = rings[:, 1].clip(0, h - 1)
        xs = np.unique(np.r_[np.arange(0, w - 1, BORDER_STEP), w - 1])
        ys = np.unique(np.r_[np.arange(0, h - 1, BORDER_STEP), h - 1])
        border = np.concatenate(
            [
                np.c_[xs, np.zeros_like(xs)],
                np.c_[xs, np.full_like(xs, h - 1)],
                np.c_[np.zeros_like(ys[1:-1]), ys[1:-1]],
                np.c_[np.full_like(ys[1:-1], w - 1), ys[1:-1]],
            ]
        ).astype(np.float64)
        # Drop ring anchors that landed on (or next to) a border anchor or each other.
        keep = []
        for i, p in enumerate(rings):
            near_border = np.min(np.abs(border - p).max(1)) < 6
            near_prev = any(np.abs(rings[j] - p).max() < 6 for j in keep)
            if not (near_border or near_prev):
                keep.append(i)
        rings, ring_id = rings[keep], np.asarray(ring_id)[keep]
        self.points = np.concatenate([face, rings, border]).astype(np.float32)  # (V, 2)
        self.ring = ring_id.astype(np.int32)  # (R,)
        self.n_ring = len(rings)
        self.n_border = len(border)

        # Outside the face oval: Delaunay over the oval, the rings and the border.
        outer_idx = np.r_[list(topo.FACE_OVAL), N_FACE + np.arange(len(rings) + len(border))]
        outer = Delaunay(self.points[outer_idx]).simplices
        outer_tris = outer_idx[outer].astype(np.int32)
        # The outer triangles first, the face mesh over them: a pixel inside the oval takes its
        # face triangle, a pixel in a sliver the oval's concave bits leave takes a Delaunay one.
        self.triangles = np.concatenate([outer_tris, FACE_TRIANGLES])  # (M, 3)

        moving = np.concatenate([face, rings]) if len(rings) else face
        x0, y0 = np.floor(moving.min(0)).astype(int) - 2
        x1, y1 = np.ceil(moving.max(0)).astype(int) + 3
        self.box = (max(0, y0), min(h, y1), max(0, x0), min(w, x1))
        self.weights = self._barycentric()  # (grid points of the box, V) csr

    def _barycentric(self) -> sparse.csr_matrix:
        """Weights of the coarse grid (every ``STEP``-th pixel of the box) over the vertices."""
        y0, y1, x0, x1 = self.box
        ch, cw = self.coarse_shape
        corners = np.full((ch, cw, 3), -1, np.int64)  # the triangle's vertices per grid point
        bary = np.zeros((ch, cw, 3), np.float32)
        pts = (self.points.astype(np.float64) - (x0, y0)) / STEP  # in grid steps
        top = np.array([cw - 1, ch - 1])
        for tri in self.triangles:
            a, b, c = pts[tri]
            det = (b[1] - c[1]) * (a[0] - c[0]) + (c[0] - b[0]) * (a[1] - c[1])
            if abs(det) < 1e-9:
                continue
            lo = np.floor(np.minimum(np.minimum(a, b), c)).astype(int).clip(0, top)
            hi = np.ceil(np.maximum(np.maximum(a, b), c)).astype(int).clip(0, top)
            gy, gx = np.mgrid[lo[1] : hi[1] + 1, lo[0] : hi[0] + 1]
            l1 = ((b[1] - c[1]) * (gx - c[0]) + (c[0] - b[0]) * (gy - c[1])) / det
            l2 = ((c[1] - a[1]) * (gx - c[0]) + (a[0] - c[0]) * (gy - c[1])) / det
            l3 = 1.0 - l1 - l2
            inside = (l1 >= -1e-6) & (l2 >= -1e-6) & (l3 >= -1e-6)
            yy, xx = gy[inside], gx[inside]
            bary[yy, xx] = np.stack([l1[inside], l2[inside], l3[inside]], 1)
            corners[yy, xx] = tri
        corners, bary = corners.reshape(-1, 3), bary.reshape(-1, 3)
        covered = corners[:, 0] >= 0
        if not covered.all():
            # Cannot happen while the border anchors span the frame; a silent zero row would
            # tear the picture, so say it.
            raise RuntimeError(f"warp mesh leaves {int((~covered).sum())} grid points uncovered")
        n = ch * cw
        return sparse.csr_matrix(
            (bary.ravel(), (np.repeat(np.arange(n), 3), corners.ravel())),
            shape=(n, len(self.points)),
            dtype=np.float32,
        )

    @property
    def coarse_shape(self) -> tuple[int, int]:
        y0, y1, x0, x1 = self.box
        return (y1 - y0 - 1) // STEP + 1, (x1 - x0 - 1) // STEP + 1

    def field(self, disp: np.ndarray) -> np.ndarray:
        """Displacement on the coarse grid of the moving box from per-vertex displacements.

        Args:
            disp: (V, 2) float32 displacement of every vertex, in pixels.

        Returns:
            (coarse height, coarse width, 2) float32 displacement (pixels) at the grid points.
        """
        return np.asarray(self.weights @ disp, np.float32).reshape(*self.coarse_shape, 2)


def inverse_offsets(field: np.ndarray, iterations: int = 3) -> np.ndarray:
    """Where each coarse-grid output point samples the source, as an offset from itself.

    The warp moves source point ``s`` to ``s + field(s)``; the output point ``p`` needs the
    ``s`` with ``s + field(s) = p``. The first guess is the usual backward approximation
    ``p - field(p)``; Newton steps with the field's Jacobian refine it (plain fixed-point steps
    oscillate where the warp stretches by 2x or more, as beside a turning nose). Where the warp
    folds (the Jacobian's determinant near zero: a cheek going behind the nose) the step falls
    back to half the residual. The lips, whose gap stretches without bound, are rasterised
    exactly instead (``exact_inverse``).

    Args:
        field: (h, w, 2) displacement in pixels on the coarse grid (``STEP`` pixels apart).

    Returns:
        (h, w, 2) float32 ``s - p`` in pixels.
    """
    h, w = field.shape[:2]
    # Planar (h, w) channels throughout: numpy on contiguous planes is several times faster
    # than on the interleaved channels of an (h, w, 2) array.
    field = np.ascontiguousarray(field, np.float32)
    fx, fy = cv2.split(field)
    gx = np.arange(w, dtype=np.float32)[None]  # (1, w) grid steps
    gy = np.arange(h, dtype=np.float32)[:, None]  # (h, 1)
    # d field_x / dx, dfx/dy, dfy/dx, dfy/dy, per pixel.
    jac = cv2.merge(
        [np.gradient(fx, axis=1), np.gradient(fx, axis=0)]
        + [np.gradient(fy, axis=1), np.gradient(fy, axis=0)]
    ) * np.float32(1 / STEP)
    ox, oy = -fx, -fy  # (h, w) s - p
    best_x, best_y, best_res = ox, oy, None
    for k in range(iterations):
        sx, sy = gx + ox / STEP, gy + oy / STEP
        f = cv2.remap(field, sx, sy, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        f_x, f_y = cv2.split(f)
        rx, ry = -ox - f_x, -oy - f_y  # p - s - field(s)
        res = rx * rx + ry * ry
        if best_res is None:
            best_x, best_y, best_res = ox, oy, res
        else:
            # Where the warp folds there is no exact inverse and the steps wander: keep the
            # best guess each point has seen.
            better = res < best_res
            best_x, best_y = np.where(better, ox, best_x), np.where(better, oy, best_y)
            best_res = np.minimum(res, best_res)
        if k == iterations - 1:
            break
        ja, b, c, jd = cv2.split(
            cv2.remap(jac, sx, sy, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        )
        a, d = ja + 1, jd + 1
        det = a * d - b * c
        # Newton where the warp is locally invertible; half the residual where it folds.
        fold = det <= 0.15
        inv = 1.0 / np.maximum(det, 0.15)
        ox = ox + np.where(fold, 0.5 * rx, (d * rx - b * ry) * inv)
        oy = oy + np.where(fold, 0.5 * ry, (a * ry - c * rx) * inv)
    return cv2.merge([best_x, best_y])


def exact_inverse(
    src: np.ndarray, dst: np.ndarray, triangles: np.ndarray, box: tuple[int, int, int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact piecewise-affine inverse of a few triangles: the moved triangles are rasterised.

    Where the warp stretches hard (the lips parting, the corners of the mouth) the fixed-point
    steps of ``inverse_map`` do not converge; there each output pixel finds its moved triangle
    and maps back through that triangle's affine map instead.

    Args:
        src: (V, 2) vertex positions in the photo.
        dst: (V, 2) vertex positions in the frame.
        triangles: (M, 3) the triangles to rasterise, drawn in order (later ones win).
        box: (y0, y1, x0, x1) output region.

    Returns:
        map_x, map_y: (h, w) float32 photo coordinates; covered: (h, w) bool.
    """
    y0, y1, x0, x1 = box
    h, w = y1 - y0, x1 - x0
    ids = np.full((h, w), -1, np.int32)
    d = dst[triangles].astype(np.float64) - (x0, y0)  # (M, 3, 2) in box pixels
    s = src[triangles].astype(np.float64)
    area = (d[:, 1, 0] - d[:, 0, 0]) * (d[:, 2, 1] - d[:, 0, 1]) - (d[:, 2, 0] - d[:, 0, 0]) * (
        d[:, 1, 1] - d[:, 0, 1]
    )
    live = np.flatnonzero(np.abs(area) > 1e-3)
    corners = np.round(d * 16).astype(np.int32)  # 4 sub-pixel bits
    for k, c in zip(live.tolist(), corners[live], strict=True):
        cv2.fillConvexPoly(ids, c, k, cv2.LINE_8, 4)
    # Affine frame -> photo per triangle in closed form: a box pixel X at X = D0 + l1 e1 + l2 e2
    # (e the moved edges from corner 0) samples the photo at S0 + l1 f1 + l2 f2.
    e1, e2 = d[:, 1] - d[:, 0], d[:, 2] - d[:, 0]  # (M, 2)
    f1, f2 = s[:, 1] - s[:, 0], s[:, 2] - s[:, 0]
    det = np.where(np.abs(area) > 1e-3, area, 1.0)[:, None]  # e1 x e2 (unused where degenerate)
    col_x = (f1 * e2[:, 1:] - f2 * e1[:, 1:]) / det  # (M, 2) d photo / d box x
    col_y = (f2 * e1[:, :1] - f1 * e2[:, :1]) / det  # d photo / d box y
    shift = s[:, 0] - col_x * d[:, :1, 0] - col_y * d[:, :1, 1]  # photo at box pixel (0, 0)
    # One lookup per pixel and coefficient (box coordinates keep them small enough for
    # float32); the last row (index -1) is zeros for the pixels no triangle covers.
    gx = np.arange(w, dtype=np.float32)[None]
    gy = np.arange(h, dtype=np.float32)[:, None]
    # A pixel drawn for a triangle samples inside that triangle's part of the photo (its box, a
    # pixel wider): the rasteriser also marks pixels whose centres lie just outside a moved
    # triangle, and where the triangle is a sliver its map sends them far off (a stray dot).
    lo, hi = s.min(1) - 1.0, s.max(1) + 1.0  # (M, 2)
    maps = []
    for k in range(2):
        cx, cy, c0 = (np.append(c[:, k], 0.0).astype(np.float32) for c in (col_x, col_y, shift))
        m = cx.take(ids) * gx + cy.take(ids) * gy + c0.take(ids)
        low = np.append(lo[:, k], -np.inf).astype(np.float32).take(ids)
        high = np.append(hi[:, k], np.inf).astype(np.float32).take(ids)
        maps.append(np.clip(m, low, high))
    mx, my = maps
    return mx, my, ids >= 0
