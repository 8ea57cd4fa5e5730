"""Face detection, landmarks, head pose and person mask on real portraits (mediapipe on LiteRT)."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from talkloop.pipeline.core.errors import InputError
from talkloop.pipeline.models.portrait import face as F

from support import load_rgb, portraits, two_faces

pytestmark = pytest.mark.unit

PORTRAITS = portraits()
# Pupil centres (subject's right = image-left, then left) and mouth corners in source pixels,
# checked by eye on zoomed crops of each photo.
REFERENCE = {
    "astronaut": {"eyes": [(204, 101), (247, 103)], "mouth": [(201, 139), (246, 142)]},
    "grace_hopper": {"eyes": [(223, 191), (305, 188)], "mouth": [(232, 277), (304, 274)]},
    "luispedro": {"eyes": [(68, 172), (146, 158)], "mouth": [(73, 263), (135, 260)]},
}


@pytest.fixture(scope="module")
def found() -> dict[str, tuple[np.ndarray, list[F.FaceBox], np.ndarray]]:
    """Each portrait with its detections and the landmarks of its first face."""
    out = {}
    for name in PORTRAITS:
        image = load_rgb(PORTRAITS[name])
        faces = F.detect_faces(image)
        out[name] = (image, faces, F.face_landmarks(image, faces[0]))
    return out


def _eye_gap(name: str) -> float:
    (a, b) = REFERENCE[name]["eyes"]
    return math.dist(a, b)


@pytest.mark.parametrize("name", list(PORTRAITS))
def test_detector_finds_one_face_boxed_around_eyes_and_mouth(found, name):
    _, faces, _ = found[name]
    assert len(faces) == 1
    f = faces[0]
    ref = REFERENCE[name]
    for x, y in ref["eyes"] + ref["mouth"]:
        assert f.x0 < x < f.x1 and f.y0 < y < f.y1, (name, (x, y), f)
    # A face box, not a head-and-shoulders one: about two to three eye gaps wide.
    assert 1.5 < f.width / _eye_gap(name) < 3.5
    assert f.keypoints.shape == (6, 2) and f.keypoints.dtype == np.float32
    tol = 0.25 * _eye_gap(name)
    assert math.dist(f.keypoints[0], ref["eyes"][0]) < tol  # right eye, image-left
    assert math.dist(f.keypoints[1], ref["eyes"][1]) < tol


@pytest.mark.parametrize("name", list(PORTRAITS))
def test_landmarks_land_on_eyes_irises_and_mouth(found, name):
    _, faces, lm = found[name]
    f, ref = faces[0], REFERENCE[name]
    assert lm.shape == (478, 3) and lm.dtype == np.float32
    tol = 0.12 * _eye_gap(name)
    assert math.dist(lm[F.RIGHT_IRIS, :2], ref["eyes"][0]) < tol
    assert math.dist(lm[F.LEFT_IRIS, :2], ref["eyes"][1]) < tol
    assert math.dist(lm[61, :2], ref["mouth"][0]) < tol
    assert math.dist(lm[291, :2], ref["mouth"][1]) < tol
    # The subject's right eye is image-left of their left eye.
    assert lm[list(F.RIGHT_EYE_CONTOUR), 0].mean() < lm[list(F.LEFT_EYE_CONTOUR), 0].mean()
    # Mouth corners inside the detector's mouth area: within half a box width of its keypoint.
    for i in F.MOUTH_CORNERS:
        assert math.dist(lm[i, :2], f.keypoints[3]) < 0.5 * f.width
    # Each iris centre inside its eye contour, and its four contour points around it.
    for centre, contour in ((F.RIGHT_IRIS, F.RIGHT_EYE_CONTOUR), (F.LEFT_IRIS, F.LEFT_EYE_CONTOUR)):
        poly = lm[list(contour), :2].reshape(-1, 1, 2)
        c = lm[centre, :2]
        assert cv2.pointPolygonTest(poly, (float(c[0]), float(c[1])), False) > 0
        ring = lm[centre + 1 : centre + 5, :2]
        assert ring[:, 0].min() < c[0] < ring[:, 0].max()
        assert ring[:, 1].min() < c[1] < ring[:, 1].max()
    # Forehead above the nose above the chin.
    assert lm[F.FOREHEAD, 1] < lm[F.NOSE_TIP, 1] < lm[F.CHIN, 1]


def test_landmarks_follow_the_face_when_the_photo_moves(found):
    image, faces, lm = found["grace_hopper"]
    shifted = np.zeros_like(image)
    shifted[20:, 30:] = image[:-20, :-30]
    lm2 = F.face_landmarks(shifted, F.detect_faces(shifted)[0])
    d = lm2[:, :2] - lm[:, :2]
    assert np.abs(np.median(d, 0) - (30, 20)).max() < 1.0


def test_refine_landmarks_recovers_from_a_rough_estimate(found):
    image, _, lm = found["astronaut"]
    rough = lm.copy()
    rough[:, :2] += (4.0, -3.0)
    again = F.refine_landmarks(image, rough)
    assert np.median(np.linalg.norm(again[:, :2] - lm[:, :2], axis=1)) < 1.0


@pytest.mark.parametrize("name", list(PORTRAITS))
def test_head_pose_of_the_portraits(found, name):
    yaw, pitch, roll = (math.degrees(a) for a in F.head_pose(found[name][2]))
    if name == "luispedro":  # nose turned towards image-left
        assert -35 < yaw < -18
    else:
        assert abs(yaw) < 8
    assert abs(pitch) < 15
    assert abs(roll) < 8


def _rotate(lm: np.ndarray, axis: str, deg: float) -> np.ndarray:
    """Landmarks rotated about their centroid; signs as head_pose's (y down, z away)."""
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    r = {
        "yaw": [[c, 0, -s], [0, 1, 0], [s, 0, c]],  # the nose (z < 0) moves to +x
        "pitch": [[1, 0, 0], [0, c, -s], [0, s, c]],  # the nose moves to +y (down)
        "roll": [[c, -s, 0], [s, c, 0], [0, 0, 1]],  # clockwise on screen
    }[axis]
    centre = lm.mean(0)
    return ((lm - centre) @ np.array(r).T + centre).astype(np.float32)


@pytest.mark.parametrize("axis", ["yaw", "pitch", "roll"])
@pytest.mark.parametrize("deg", [-40.0, -20.0, 25.0, 45.0])
def test_head_pose_measures_a_3d_rotation(found, axis, deg):
    lm = found["astronaut"][2]
    before = dict(zip(("yaw", "pitch", "roll"), F.head_pose(lm), strict=True))
    after = dict(zip(("yaw", "pitch", "roll"), F.head_pose(_rotate(lm, axis, deg)), strict=True))
    assert math.degrees(after[axis] - before[axis]) == pytest.approx(deg, abs=3.0)
    for other in set(before) - {axis}:
        assert abs(math.degrees(after[other] - before[other])) < 5.0


def test_head_pose_rejects_a_wrong_shape():
    with pytest.raises(InputError, match="landmarks"):
        F.head_pose(np.zeros((68, 2), np.float32))


def test_person_mask_covers_the_person_not_the_background(found):
    image, _, lm = found["grace_hopper"]
    mask = F.person_mask(image)
    assert mask.shape == image.shape[:2] and mask.dtype == np.float32
    assert mask.min() >= 0.0 and mask.max() <= 1.0
    nose = lm[F.NOSE_TIP, :2].astype(int)
    assert mask[nose[1], nose[0]] > 0.9
    assert mask[-5:, image.shape[1] // 2].mean() > 0.9  # her uniform
    assert mask[:40, :40].mean() < 0.1  # the flag behind her
    assert mask[:40, -40:].mean() < 0.1  # the blue backdrop


def test_two_faces_come_largest_first():
    faces = F.detect_faces(two_faces())
    assert len(faces) == 2
    assert faces[0].width > faces[1].width
    assert faces[0].x0 > 500 > faces[1].x1  # the large face is Grace Hopper's, on the right


def test_a_small_face_in_a_large_photo_is_found():
    image = load_rgb(PORTRAITS["grace_hopper"])
    small = cv2.resize(image, None, fx=0.3, fy=0.3, interpolation=cv2.INTER_AREA)
    canvas = np.full((1800, 2400, 3), 128, np.uint8)  # face ~60 px tall: the tiled pass
    canvas[900 : 900 + small.shape[0], 1500 : 1500 + small.shape[1]] = small
    faces = F.detect_faces(canvas)
    assert len(faces) == 1
    lm = F.face_landmarks(canvas, faces[0])
    eye = np.array(REFERENCE["grace_hopper"]["eyes"][0]) * 0.3 + (1500, 900)
    assert math.dist(lm[F.RIGHT_IRIS, :2], eye) < 4.0


def test_no_face_in_a_blank_or_noise_image():
    assert F.detect_faces(np.full((480, 640, 3), 200, np.uint8)) == []
    noise = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    assert F.detect_faces(noise) == []


@pytest.mark.parametrize(
    "bad, needle",
    [
        (np.zeros((100, 100), np.uint8), "RGB"),
        (np.zeros((100, 100, 4), np.uint8), "RGB"),
        (np.zeros((100, 100, 3), np.float32), "uint8"),
        (np.zeros((4, 100, 3), np.uint8), "too small"),
    ],
)
def test_bad_images_are_rejected_with_a_named_problem(bad, needle):
    with pytest.raises(InputError, match=needle):
        F.detect_faces(bad)


def test_anchor_layouts_match_the_model_outputs():
    assert F._SHORT.anchors().shape == (896, 2)
    assert F._FULL.anchors().shape == (2304, 2)
    # The short-range model's first grid is 16x16 with two anchors per cell.
    a = F._SHORT.anchors()
    assert np.allclose(a[0], a[1]) and np.allclose(a[0], (1 / 32, 1 / 32))
