"""Head-and-shoulders framing of real portraits, and the bad photos it refuses."""

from __future__ import annotations

import logging
import math

import cv2
import numpy as np
import pytest
from PIL import Image

from talkloop.pipeline.core.errors import InputError
from talkloop.pipeline.models.portrait import face as F
from talkloop.pipeline.models.portrait import framing
from talkloop.pipeline.models.portrait.framing import (
    EYE_LINE,
    eye_centre,
    face_height,
    frame_portrait,
    load_image,
)
from talkloop.pipeline.train.metrics import pearson

from support import load_rgb, portraits, two_faces

pytestmark = pytest.mark.unit

PORTRAITS = portraits()
SIZES = [(512, 512), (384, 384), (768, 768), (720, 1280)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", list(PORTRAITS))
def test_framing_puts_the_face_at_its_share_and_the_eyes_on_the_upper_third(name, size):
    width, height = size
    p = frame_portrait(PORTRAITS[name], width, height)
    assert p.image.shape == (height, width, 3) and p.image.dtype == np.uint8
    assert p.landmarks.shape == (478, 3) and p.landmarks.dtype == np.float32
    assert p.mask.shape == (height, width) and p.mask.dtype == np.float32
    assert p.faces_found == 1
    lm = p.landmarks  # re-fitted on the framed image, so these measure the framed pixels
    assert 0.40 <= face_height(lm) / height <= 0.45
    assert eye_centre(lm)[1] / height == pytest.approx(EYE_LINE, abs=0.02)
    mesh_x = lm[:468, 0]
    assert (mesh_x.min() + mesh_x.max()) / 2 / width == pytest.approx(0.5, abs=0.03)
    # The landmarks sit on the framed face: the nose tip is inside the person mask.
    nose = np.round(lm[F.NOSE_TIP, :2]).astype(int)
    assert p.mask[nose[1], nose[0]] > 0.9


def test_framed_landmarks_match_a_fresh_detection_on_the_framed_image():
    p = frame_portrait(PORTRAITS["grace_hopper"], 512, 512)
    fresh = F.face_landmarks(p.image, F.detect_faces(p.image)[0])
    assert np.median(np.linalg.norm(fresh[:, :2] - p.landmarks[:, :2], axis=1)) < 1.5


def test_an_array_frames_like_its_file():
    a = frame_portrait(PORTRAITS["grace_hopper"])
    b = frame_portrait(load_rgb(PORTRAITS["grace_hopper"]))
    assert np.array_equal(a.image, b.image)
    assert a.image.shape == (512, 512, 3)


@pytest.mark.parametrize(
    "orientation, undo, fmt",
    [
        (6, Image.Transpose.ROTATE_90, "png"),
        (3, Image.Transpose.ROTATE_180, "png"),
        (8, Image.Transpose.ROTATE_270, "png"),
        (6, Image.Transpose.ROTATE_90, "jpeg"),
    ],
)
def test_exif_rotated_photo_frames_like_the_upright_one(tmp_path, orientation, undo, fmt):
    upright = Image.open(PORTRAITS["grace_hopper"]).convert("RGB")
    # Stored turned, with the EXIF tag that says how to turn it back (what phones write).
    stored = upright.transpose(undo)
    exif = Image.Exif()
    exif[0x0112] = orientation
    if fmt == "jpeg":
        # The upright twin goes through the same lossy round trip, turned back losslessly.
        stored.save(tmp_path / "rotated.jpg", quality=95, exif=exif.tobytes())
        rotated_path = tmp_path / "rotated.jpg"
        with Image.open(rotated_path) as im:
            upright = im.convert("RGB").transpose({6: Image.Transpose.ROTATE_270}[orientation])
    else:
        stored.save(tmp_path / "rotated.png", exif=exif.tobytes())
        rotated_path = tmp_path / "rotated.png"
    upright.save(tmp_path / "upright.png")
    with Image.open(rotated_path) as im:
        assert im.getexif()[0x0112] == orientation
    a = frame_portrait(tmp_path / "upright.png")
    b = frame_portrait(rotated_path)
    assert np.abs(a.image.astype(int) - b.image.astype(int)).mean() < 1.0
    assert np.abs(a.landmarks[:, :2] - b.landmarks[:, :2]).max() < 1.0


def test_the_larger_of_two_faces_is_framed(caplog):
    with caplog.at_level(logging.INFO, logger="talkloop.portrait"):
        two = frame_portrait(two_faces())
    assert two.faces_found == 2
    assert "found 2 faces" in caplog.text and "largest" in caplog.text
    alone = frame_portrait(load_rgb(PORTRAITS["grace_hopper"]))
    # Same face, same framing (to detection noise): the landmarks agree and the frames correlate;
    # the smaller face's framing would not.
    assert np.median(np.linalg.norm(two.landmarks[:, :2] - alone.landmarks[:, :2], axis=1)) < 1.5
    assert pearson(two.image, alone.image) > 0.9
    other = frame_portrait(PORTRAITS["astronaut"])
    assert pearson(two.image, other.image) < 0.5


def test_a_crop_past_the_photo_is_filled_with_blurred_edge_colours_and_logged(caplog):
    # luispedro.jpg is cropped tight: a 512x512 head-and-shoulders frame reaches past every edge
    # but the top.
    with caplog.at_level(logging.INFO, logger="talkloop.portrait"):
        p = frame_portrait(PORTRAITS["luispedro"], 512, 512)
    assert "past the photo's edge" in caplog.text
    assert "bottom" in caplog.text and "left" in caplog.text
    bottom = p.image[-40:].astype(float)
    assert bottom.mean() > 40  # not black bars
    # Blurred, not streaked: little detail along the filled rows and columns.
    assert np.abs(np.diff(bottom, axis=1)).mean() < 1.0
    assert np.abs(np.diff(p.image[:, :30].astype(float), axis=0)).mean() < 1.0
    # The colours come from the photo's edge: the filled band next to the bottom edge is close to
    # the photo's last rows there.
    source = load_rgb(PORTRAITS["luispedro"])
    assert np.abs(bottom.reshape(-1, 3).mean(0) - source[-20:].reshape(-1, 3).mean(0)).max() < 40


def test_a_crop_inside_the_photo_logs_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="talkloop.portrait"):
        frame_portrait(PORTRAITS["grace_hopper"], 384, 384)
    assert "past the photo's edge" not in caplog.text


# -- bad photos -------------------------------------------------------------------------------------


def test_no_face_in_a_blank_photo(tmp_path):
    path = tmp_path / "blank.png"
    Image.new("RGB", (640, 480), (200, 200, 200)).save(path)
    with pytest.raises(InputError, match="no face found in portrait blank.png"):
        frame_portrait(path)


def test_a_tiny_face_is_too_small():
    image = load_rgb(PORTRAITS["grace_hopper"])
    small = cv2.resize(image, None, fx=0.35, fy=0.35, interpolation=cv2.INTER_AREA)
    canvas = np.full((900, 1200, 3), 128, np.uint8)  # forehead to chin ~70 px
    canvas[400 : 400 + small.shape[0], 500 : 500 + small.shape[1]] = small
    with pytest.raises(InputError, match=r"too small: \d+ px from forehead to chin.*96 px"):
        frame_portrait(canvas)


def test_a_face_just_over_the_limit_is_accepted():
    image = load_rgb(PORTRAITS["grace_hopper"])
    small = cv2.resize(image, None, fx=0.6, fy=0.6, interpolation=cv2.INTER_AREA)  # ~120 px
    canvas = np.full((900, 1200, 3), 128, np.uint8)
    canvas[300 : 300 + small.shape[0], 500 : 500 + small.shape[1]] = small
    p = frame_portrait(canvas)
    assert 0.40 <= face_height(p.landmarks) / 512 <= 0.45


def _turned(deg: float):
    """face_landmarks that returns the real landmarks turned by ``deg`` about the vertical."""
    real = F.face_landmarks

    def turned(image, face):
        lm = real(image, face)
        c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
        centre = lm.mean(0)
        rot = np.array([[c, 0, -s], [0, 1, 0], [s, 0, c]])
        return ((lm - centre) @ rot.T + centre).astype(np.float32)

    return turned


@pytest.mark.parametrize("deg", [45.0, -50.0])
def test_a_head_turned_past_35_degrees_is_refused(monkeypatch, deg):
    # No freely licensed photo of a strongly turned head was found: the real landmarks of a
    # frontal face are turned in 3-D, and the real head_pose and rule judge them.
    monkeypatch.setattr(framing, "face_landmarks", _turned(deg))
    with pytest.raises(InputError, match=r"turned \d+ degrees to the side \(at most 35\)"):
        frame_portrait(PORTRAITS["grace_hopper"])


def test_a_head_turned_25_degrees_is_framed(monkeypatch):
    monkeypatch.setattr(framing, "face_landmarks", _turned(25.0))
    assert frame_portrait(PORTRAITS["grace_hopper"]).faces_found == 1


def test_a_missing_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        frame_portrait(tmp_path / "nobody.jpg")


def test_a_text_file_is_not_an_image(tmp_path):
    path = tmp_path / "notes.jpg"
    path.write_text("this is not a photo\n")
    with pytest.raises(InputError, match="notes.jpg is not an image"):
        frame_portrait(path)


def test_a_truncated_jpeg(tmp_path):
    data = PORTRAITS["grace_hopper"].read_bytes()
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="cut.jpg is truncated or corrupt"):
        frame_portrait(path)


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_image(tmp_path)


@pytest.mark.parametrize(
    "bad, needle",
    [
        (np.zeros((64, 64), np.uint8), r"\(H, W, 3\) uint8"),
        (np.zeros((64, 64, 3), np.float64), r"\(H, W, 3\) uint8"),
        (12, "file path or an image array"),
    ],
)
def test_bad_arrays(bad, needle):
    with pytest.raises(InputError, match=needle):
        load_image(bad)


@pytest.mark.parametrize("width, height", [(0, 512), (512, 10_000), (512.0, 512)])
def test_bad_sizes(width, height):
    with pytest.raises(InputError, match="must be an integer in"):
        frame_portrait(PORTRAITS["grace_hopper"], width, height)


def test_a_transparent_png_gets_a_white_background(tmp_path):
    rgba = Image.open(PORTRAITS["grace_hopper"]).convert("RGBA")
    alpha = np.full(rgba.size[::-1], 255, np.uint8)
    alpha[:, :60] = 0  # a transparent strip on the left
    rgba.putalpha(Image.fromarray(alpha))
    rgba.save(tmp_path / "cutout.png")
    image, name = load_image(tmp_path / "cutout.png")
    assert name == "portrait cutout.png"
    assert (image[:, :60] == 255).all()
    assert np.array_equal(image[:, 60:], load_rgb(PORTRAITS["grace_hopper"])[:, 60:])
