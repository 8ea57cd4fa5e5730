"""Faces in a photo: detection, dense landmarks, head pose and a person mask.

mediapipe's face models (``assets/``, Apache-2.0, see ``assets/SOURCES.md``) run on LiteRT. This
module is the glue mediapipe's graphs would otherwise supply: SSD anchors, box decoding and
weighted NMS for the BlazeFace detectors, the rotated face crop (eyes level, box enlarged 1.5x) for
the face-mesh model, eye crops for the iris model, and every output mapped back to image pixels.

All functions take ``(H, W, 3)`` uint8 RGB images of any size. Coordinates are image pixels
(x right, y down); landmark z is relative depth in the same pixel scale, larger = farther.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from talkloop.pipeline.console import native_stderr_muted
from talkloop.pipeline.core.errors import InputError

ASSETS = Path(__file__).parent / "assets"

# Face-mesh indices used here (mediapipe's canonical topology; "right" = the subject's right,
# which is image-left in a photo facing the camera).
RIGHT_EYE_CORNERS = (33, 133)  # outer, inner
LEFT_EYE_CORNERS = (263, 362)
RIGHT_EYE_CONTOUR = (33, 7, 163, 144, 145, 153, 154, 155, 133, 173, 157, 158, 159, 160, 161, 246)
LEFT_EYE_CONTOUR = (263, 249, 390, 373, 374, 380, 381, 382, 362, 398, 384, 385, 386, 387, 388, 466)
MOUTH_CORNERS = (61, 291)  # subject's right, left
FOREHEAD, CHIN, NOSE_TIP = 10, 152, 1
RIGHT_IRIS = 468  # centre; 469..472 its contour
LEFT_IRIS = 473  # centre; 474..477 its contour
NUM_LANDMARKS = 478

# Symmetric (subject's right, left) pairs that define the face's left-right axis in head_pose.
_PAIRS = ((33, 263), (133, 362), (234, 454), (61, 291), (127, 356), (93, 323), (132, 361))
_IRIS_SCALE = 2.3  # eye crop side = eye-corner distance x this (mediapipe's iris graph)
_FACE_SCALE = 1.5  # face crop side = box side x this (mediapipe's face-mesh graph)
_NMS_IOU = 0.3
_PRESENCE_MIN = 0.5


@dataclass(frozen=True)
class FaceBox:
    """One detected face, in the pixels of the image it was found in.

    ``keypoints`` (6, 2) float32: right eye, left eye, nose tip, mouth, right ear, left ear (the
    subject's right and left: in a photo facing the camera the right eye is image-left).
    """

    x0: float
    y0: float
    x1: float
    y1: float
    score: float
    keypoints: np.ndarray

    @property
    def width(self) -> float:
        return self.x1 - self.x0

    @property
    def height(self) -> float:
        return self.y1 - self.y0


# -- LiteRT models ---------------------------------------------------------------------------------


class _Model:
    """One .tflite model, loaded on first use; a lock because an interpreter is not re-entrant."""

    def __init__(self, filename: str) -> None:
        self.path = ASSETS / filename
        self._interpreter = None
        self._lock = threading.Lock()

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        with self._lock:
            if self._interpreter is None:
                from ai_edge_litert.interpreter import Interpreter

                # LiteRT prints "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." from
                # C++ to fd 2 (no option or variable turns it off); other lines pass through.
                with native_stderr_muted():
                    it = Interpreter(model_path=str(self.path), num_threads=1)
                    it.allocate_tensors()
                self._interpreter = it
            it = self._interpreter
            it.set_tensor(it.get_input_details()[0]["index"], x[None].astype(np.float32))
            it.invoke()
            return [it.get_tensor(d["index"])[0] for d in it.get_output_details()]


@dataclass(frozen=True)
class _Detector:
    """A BlazeFace model: its input size, SSD anchor layout and score threshold."""

    model: _Model
    size: int
    strides: tuple[int, ...]
    min_score: float

    def anchors(self) -> np.ndarray:
        """(N, 2) anchor centres in [0, 1], in the model's output order.

        mediapipe's SsdAnchorsCalculator with fixed anchor size: consecutive layers that share a
        stride share one grid, and each layer puts two anchors (aspect 1 and the interpolated
        scale) on every cell, except a single-layer model, which puts one.
        """
        out = []
        i = 0
        per_layer = 1 if len(self.strides) == 1 else 2
        while i < len(self.strides):
            stride, n = self.strides[i], 0
            while i < len(self.strides) and self.strides[i] == stride:
                n += per_layer
                i += 1
            g = math.ceil(self.size / stride)
            ys, xs = np.meshgrid((np.arange(g) + 0.5) / g, (np.arange(g) + 0.5) / g, indexing="ij")
            cells = np.stack([xs.ravel(), ys.ravel()], 1)
            out.append(np.repeat(cells, n, axis=0))
        return np.concatenate(out).astype(np.float32)


_SHORT = _Detector(_Model("face_detection_short_range.tflite"), 128, (8, 16, 16, 16), 0.5)
_FULL = _Detector(_Model("face_detection_full_range_sparse.tflite"), 192, (4,), 0.6)
_MESH = _Model("face_landmark.tflite")
_IRIS = _Model("iris_landmark.tflite")
_SELFIE = _Model("selfie_segmentation.tflite")
_ANCHORS: dict[int, np.ndarray] = {}


# -- detection ---------------------------------------------------------------------------------------


def _check_image(image: np.ndarray) -> np.ndarray:
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3:
        shape = getattr(image, "shape", type(image).__name__)
        raise InputError(f"expected an (H, W, 3) RGB image, got {shape}")
    if image.dtype != np.uint8:
        raise InputError(f"expected a uint8 image, got {image.dtype}")
    if min(image.shape[:2]) < 8:
        raise InputError(
            f"image of {image.shape[1]}x{image.shape[0]} px is too small to hold a face"
        )
    return image


def resample(
    image: np.ndarray,
    to_source: np.ndarray,
    width: int,
    height: int,
    *,
    replicate: bool = True,
    cubic: bool = False,
) -> np.ndarray:
    """Output pixel (u, v) takes the image at ``to_source @ (u, v, 1)``.

    Coordinates are continuous pixels (pixel i spans [i, i + 1)), in which landmarks are given.
    A reduction by more than 2x first area-averages the part of the image it reads, so the
    result does not alias. Outside the image: the edge repeats (``replicate``) or zeros.

    Args:
        image: (H, W, C) array.
        to_source: (2, 3) affine map from output to image coordinates.
        width, height: output size.

    Returns:
        (height, width, C) array of the image's dtype.
    """
    a = np.asarray(to_source, np.float64)
    h, w = image.shape[:2]
    corners = np.array([[0, 0, 1], [width, 0, 1], [0, height, 1], [width, height, 1]], np.float64)
    src = corners @ a.T  # (4, 2)
    k = 1.0 / math.sqrt(abs(np.linalg.det(a[:, :2])))  # output px per image px
    # Read only the part of the image the output covers (plus a margin for the filters).
    pad = 2.0 / min(k, 1.0) + 2.0
    ix0, iy0 = (max(0, math.floor(v - pad)) for v in src.min(0))
    ix1, iy1 = min(w, math.ceil(src[:, 0].max() + pad)), min(h, math.ceil(src[:, 1].max() + pad))
    if ix1 <= ix0 or iy1 <= iy0:  # entirely outside: the nearest edge pixel, or zeros
        ix0, iy0 = min(max(ix0, 0), w - 1), min(max(iy0, 0), h - 1)
        ix1, iy1 = ix0 + 1, iy0 + 1
    part = image[iy0:iy1, ix0:ix1]
    a = a - np.array([[0, 0, ix0], [0, 0, iy0]])
    if k < 0.5:
        f = 2.0 * k
        size = (max(1, round(part.shape[1] * f)), max(1, round(part.shape[0] * f)))
        sx, sy = size[0] / part.shape[1], size[1] / part.shape[0]
        part = cv2.resize(part, size, interpolation=cv2.INTER_AREA)
        a = np.diag([sx, sy]) @ a
    # Continuous -> OpenCV's index coordinates (pixel centres at integers), both sides.
    a[:, 2] += 0.5 * a[:, :2].sum(1) - 0.5
    flags = (cv2.INTER_CUBIC if cubic else cv2.INTER_LINEAR) | cv2.WARP_INVERSE_MAP
    border = cv2.BORDER_REPLICATE if replicate else cv2.BORDER_CONSTANT
    out = cv2.warpAffine(part, a, (width, height), flags=flags, borderMode=border)
    return out.reshape(height, width, *image.shape[2:])


def _square_input(
    image: np.ndarray, x0: float, y0: float, side: float, size: int
) -> tuple[np.ndarray, float]:
    """The square ``[x0, x0 + side)^2`` of the image as a (size, size, 3) float32 input in [0, 1]
    (zeros outside the image), and its scale (input px per image px)."""
    scale = size / side
    to_source = np.array([[1 / scale, 0, x0], [0, 1 / scale, y0]])
    tile = resample(image, to_source, size, size, replicate=False)
    return tile.astype(np.float32) / 255.0, scale


def _run_detector(
    det: _Detector, image: np.ndarray, x0: float, y0: float, side: float
) -> list[FaceBox]:
    """Detections of one model on one square region, in image pixels (before NMS)."""
    tile, scale = _square_input(image, x0, y0, side, det.size)
    raw, logits = det.model(tile * 2.0 - 1.0)  # (N, 16), (N, 1); the detectors take [-1, 1]
    scores = 1.0 / (1.0 + np.exp(-np.clip(logits[:, 0].astype(np.float64), -100.0, 100.0)))
    keep = np.nonzero(scores >= det.min_score)[0]
    if keep.size == 0:
        return []
    anchors = _ANCHORS.setdefault(det.size, det.anchors())[keep]  # (K, 2)
    r = raw[keep] / det.size  # (K, 16) in units of the input side
    centre = r[:, 0:2] + anchors
    half = r[:, 2:4] / 2.0
    kps = r[:, 4:16].reshape(-1, 6, 2) + anchors[:, None, :]
    to_px = det.size / scale  # input-normalised -> image pixels
    out = []
    for j in range(keep.size):
        (cx, cy), (hw, hh) = centre[j] * to_px, half[j] * to_px
        out.append(
            FaceBox(
                x0 + cx - hw,
                y0 + cy - hh,
                x0 + cx + hw,
                y0 + cy + hh,
                float(scores[keep[j]]),
                (kps[j] * to_px + np.array([x0, y0])).astype(np.float32),
            )
        )
    return out


def _iou(a: FaceBox, b: FaceBox) -> float:
    ix = max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0))
    iy = max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))
    inter = ix * iy
    union = a.width * a.height + b.width * b.height - inter
    return inter / union if union > 0 else 0.0


def _weighted_nms(boxes: list[FaceBox]) -> list[FaceBox]:
    """mediapipe's WEIGHTED non-max suppression: overlapping boxes average, weighted by score."""
    rest = sorted(boxes, key=lambda b: -b.score)
    out = []
    while rest:
        top = rest[0]
        group = [b for b in rest if _iou(top, b) > _NMS_IOU]
        rest = [b for b in rest if _iou(top, b) <= _NMS_IOU]
        w = np.array([b.score for b in group])[:, None]
        coords = np.array([[b.x0, b.y0, b.x1, b.y1] for b in group])
        x0, y0, x1, y1 = (coords * w).sum(0) / w.sum()
        kps = (np.stack([b.keypoints for b in group]) * w[:, :, None]).sum(0) / w.sum()
        out.append(FaceBox(x0, y0, x1, y1, top.score, kps.astype(np.float32)))
    return out


def detect_faces(image: np.ndarray) -> list[FaceBox]:
    """Every face in the image, largest first.

    Both BlazeFace models look at the whole (letterboxed) image: the short-range one is trained on
    faces that fill much of the frame, the full-range one on small and distant faces. When neither
    finds a face in a large photo, the full-range model scans overlapping tiles, so a face a few
    percent of the photo's width is still found.

    Args:
        image: (H, W, 3) uint8 RGB.

    Returns:
        Faces as :class:`FaceBox` in image pixels, sorted by box area, largest first.
    """
    image = _check_image(image)
    h, w = image.shape[:2]
    side = float(max(h, w))
    x0, y0 = (w - side) / 2.0, (h - side) / 2.0  # centred letterbox, like mediapipe's
    found = _run_detector(_SHORT, image, x0, y0, side) + _run_detector(_FULL, image, x0, y0, side)
    tile = 768.0
    if not found and side > 1.5 * tile:
        step = tile * 2.0 / 3.0
        for ty in np.arange(0.0, max(1.0, h - tile / 3.0), step):
            for tx in np.arange(0.0, max(1.0, w - tile / 3.0), step):
                found += _run_detector(_FULL, image, float(tx), float(ty), tile)
    faces = _weighted_nms(found)
    return sorted(faces, key=lambda f: -f.width * f.height)


# -- landmarks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Roi:
    """A rotated square crop: centre, side and angle (radians, image y down) in image pixels."""

    cx: float
    cy: float
    side: float
    angle: float

    def to_image(self, size: int) -> np.ndarray:
        """(2, 3) affine map from crop pixels (size x size) to image pixels."""
        c, s, k = math.cos(self.angle), math.sin(self.angle), self.side / size
        ox = self.cx - k * (c - s) * size / 2.0
        oy = self.cy - k * (s + c) * size / 2.0
        return np.array([[k * c, -k * s, ox], [k * s, k * c, oy]], np.float64)

    def crop(self, image: np.ndarray, size: int) -> np.ndarray:
        """(size, size, 3) float32 crop in [0, 1]; outside the image the border repeats."""
        return resample(image, self.to_image(size), size, size).astype(np.float32) / 255.0

    def points_to_image(self, pts: np.ndarray, size: int) -> np.ndarray:
        """(N, 3) crop-pixel points (x, y, z) to image pixels; z scales like x and y."""
        m = self.to_image(size)
        out = np.empty_like(pts, dtype=np.float32)
        out[:, :2] = pts[:, :2] @ m[:, :2].T + m[:, 2]
        out[:, 2] = pts[:, 2] * self.side / size
        return out


def _rotation(start: np.ndarray, end: np.ndarray) -> float:
    """Angle that levels the start->end line (mediapipe's rotation with target angle 0)."""
    return math.atan2(float(end[1] - start[1]), float(end[0] - start[0]))


def _roi_from_box(face: FaceBox) -> _Roi:
    angle = _rotation(face.keypoints[0], face.keypoints[1])
    side = max(face.width, face.height) * _FACE_SCALE
    return _Roi((face.x0 + face.x1) / 2.0, (face.y0 + face.y1) / 2.0, side, angle)


def _roi_from_landmarks(lm: np.ndarray) -> _Roi:
    """mediapipe's landmarks-to-ROI: eye-corner line levelled, landmark box enlarged 1.5x."""
    angle = _rotation(lm[33], lm[263])
    mesh = lm[:468, :2]
    lo, hi = mesh.min(0), mesh.max(0)
    side = float(max(hi - lo)) * _FACE_SCALE
    return _Roi(float(lo[0] + hi[0]) / 2.0, float(lo[1] + hi[1]) / 2.0, side, angle)


def _mesh(image: np.ndarray, roi: _Roi) -> tuple[np.ndarray, float]:
    """468 mesh landmarks (image pixels) and the model's face-presence probability."""
    raw, presence = _MESH(roi.crop(image, 192))  # (1, 1, 1404), (1, 1, 1)
    pts = raw.reshape(468, 3)
    p = 1.0 / (1.0 + math.exp(-float(np.ravel(presence)[0])))
    return roi.points_to_image(pts, 192), p


def _iris(image: np.ndarray, lm: np.ndarray, corners: tuple[int, int], flip: bool) -> np.ndarray:
    """(5, 3) iris centre + contour of one eye, from the iris model on a crop around the eye.

    The model is trained on one eye; the other eye's crop is mirrored in and out.
    """
    a, b = lm[corners[0], :2], lm[corners[1], :2]
    centre = (a + b) / 2.0
    side = float(np.linalg.norm(b - a)) * _IRIS_SCALE
    start, end = (b, a) if flip else (a, b)
    roi = _Roi(float(centre[0]), float(centre[1]), side, _rotation(start, end))
    crop = roi.crop(image, 64)
    if flip:
        crop = crop[:, ::-1]
    _, iris = _IRIS(np.ascontiguousarray(crop))  # (213,), (15,)
    pts = iris.reshape(5, 3).astype(np.float32)
    if flip:
        pts[:, 0] = 64.0 - pts[:, 0]
    out = roi.points_to_image(pts, 64)
    # The iris sits on the eye's surface: give it the eye contour's depth.
    contour = RIGHT_EYE_CONTOUR if corners == RIGHT_EYE_CORNERS else LEFT_EYE_CONTOUR
    out[:, 2] = lm[list(contour), 2].mean()
    return out


def _landmarks_from_roi(image: np.ndarray, roi: _Roi) -> tuple[np.ndarray, float]:
    """(478, 3) landmarks: the mesh twice (the second crop from the first's landmarks), irises."""
    lm, presence = _mesh(image, roi)
    lm, presence = _mesh(image, _roi_from_landmarks(lm))
    right = _iris(image, lm, RIGHT_EYE_CORNERS, flip=False)
    left = _iris(image, lm, LEFT_EYE_CORNERS, flip=True)
    return np.concatenate([lm, right, left]).astype(np.float32), presence


def face_landmarks(image: np.ndarray, face: FaceBox) -> np.ndarray:
    """Dense landmarks of one detected face.

    Args:
        image: (H, W, 3) uint8 RGB, the image ``face`` was detected in.
        face: a detection from :func:`detect_faces`.

    Returns:
        (478, 3) float32 in mediapipe's face-mesh topology (0..467 the mesh, 468..472 the right
        iris, 473..477 the left iris, centre first); x, y in image pixels, z relative depth in
        the same pixel scale (larger = farther).

    Raises:
        InputError: the landmark model sees no face inside the detection.
    """
    image = _check_image(image)
    lm, presence = _landmarks_from_roi(image, _roi_from_box(face))
    if presence < _PRESENCE_MIN:
        raise InputError(
            f"no face found: the landmark model rejects the detected face "
            f"(presence {presence:.2f} < {_PRESENCE_MIN})"
        )
    return lm


def refine_landmarks(image: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """Landmarks re-fitted on ``image`` around an estimate (e.g. landmarks moved by a crop).

    Args:
        image: (H, W, 3) uint8 RGB.
        landmarks: (478, 3) or (468, 3) estimate in ``image`` pixels.

    Returns:
        (478, 3) float32, as :func:`face_landmarks`.
    """
    image = _check_image(image)
    lm, presence = _landmarks_from_roi(image, _roi_from_landmarks(np.asarray(landmarks)))
    if presence < _PRESENCE_MIN:
        raise InputError(f"no face found where one was expected (presence {presence:.2f})")
    return lm


# -- pose and mask -----------------------------------------------------------------------------------


def head_pose(landmarks: np.ndarray) -> tuple[float, float, float]:
    """Head rotation from 3-D landmarks, in the units and signs of the frame parameters.

    The face's left-right axis is the mean of symmetric landmark pairs (subject's right -> left);
    its down axis runs from the eye corners to the mouth corners; the nose points along their
    cross product, towards the camera.

    Returns:
        (yaw, pitch, roll) in radians: yaw > 0 turns the nose towards image-right, pitch > 0 tilts
        it down, roll > 0 turns the face clockwise on screen (as talkloop/pipeline/synth's renderer).
    """
    lm = np.asarray(landmarks, np.float64)
    if lm.ndim != 2 or lm.shape[0] < 468 or lm.shape[1] != 3:
        raise InputError(f"expected (478, 3) landmarks, got {lm.shape}")
    r, lft = zip(*_PAIRS, strict=True)
    ex = (lm[list(lft)] - lm[list(r)]).mean(0)
    ex /= np.linalg.norm(ex)
    eyes = lm[list(RIGHT_EYE_CORNERS + LEFT_EYE_CORNERS)].mean(0)
    down = lm[list(MOUTH_CORNERS)].mean(0) - eyes
    ey = down - ex * (down @ ex)
    ey /= np.linalg.norm(ey)
    # The eye->mouth axis is upright in a face looking at the camera to within a few degrees
    # (mean pitch -1.4 degrees over six frontal portraits), so it needs no lean correction.
    nose = -np.cross(ex, ey)  # towards the camera when frontal: (0, 0, -1)
    # R = roll (in the screen plane) . yaw (about the vertical) . pitch: the left-right axis is
    # level after yaw and pitch, so its screen angle is the roll; undo it, then read the nose.
    roll = math.atan2(ex[1], ex[0])
    c, s = math.cos(roll), math.sin(roll)
    nx, ny = c * nose[0] + s * nose[1], -s * nose[0] + c * nose[1]
    yaw = math.atan2(nx, -nose[2])
    pitch = math.atan2(ny, math.hypot(nx, nose[2]))
    return yaw, pitch, roll


def person_mask(image: np.ndarray) -> np.ndarray:
    """Where the person is: mediapipe's selfie segmentation, upsampled and lightly feathered.

    Args:
        image: (H, W, 3) uint8 RGB.

    Returns:
        (H, W) float32 in [0, 1], 1 = the person.
    """
    image = _check_image(image)
    h, w = image.shape[:2]
    x = cv2.resize(image, (256, 256), interpolation=cv2.INTER_AREA).astype(np.float32) / 255.0
    (prob,) = _SELFIE(x)  # (256, 256, 1)
    mask = cv2.resize(prob[:, :, 0], (w, h), interpolation=cv2.INTER_LINEAR)
    sigma = max(h, w) / 400.0
    mask = cv2.GaussianBlur(mask, (0, 0), sigma)
    return np.clip(mask, 0.0, 1.0).astype(np.float32)
