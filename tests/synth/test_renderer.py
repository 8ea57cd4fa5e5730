"""The renderer: deterministic, parameters change the pixels where they should."""

from __future__ import annotations

import numpy as np
import pytest

from talkloop.pipeline.models.portrait.params import FrameParams
from talkloop.pipeline.synth.character import sample_character
from talkloop.pipeline.synth.renderer import Renderer

pytestmark = pytest.mark.unit


def _box_mask(box: np.ndarray, shape: tuple[int, int], pad: int = 2) -> np.ndarray:
    x0, y0, x1, y1 = box
    m = np.zeros(shape, bool)
    m[max(0, int(y0) - pad) : int(y1) + pad + 1, max(0, int(x0) - pad) : int(x1) + pad + 1] = True
    return m


def test_same_seed_same_pixels_other_seed_other_pixels() -> None:
    a = Renderer(sample_character(7), 96).render_neutral()
    b = Renderer(sample_character(7), 96).render_neutral()
    c = Renderer(sample_character(8), 96).render_neutral()
    assert a.shape == (96, 96, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    assert np.abs(a.astype(int) - c.astype(int)).mean() > 5


def test_mouth_opening_changes_mouth_box_only() -> None:
    r = Renderer(sample_character(3), 128)
    p = FrameParams.from_tracks(2, mouth_open=np.array([0.0, 1.0]), jaw=np.array([0.0, 0.8]))
    out = r.render(p)
    diff = np.abs(out.frames[0].astype(int) - out.frames[1].astype(int)).sum(-1) > 10
    mouth = _box_mask(out.mouth_box[1], diff.shape) | _box_mask(out.face_box[1], diff.shape)
    assert diff.sum() > 100  # the cavity is visible
    eyes = _box_mask(out.eye_box[0, 0], diff.shape) | _box_mask(out.eye_box[0, 1], diff.shape)
    assert not diff[eyes].any()
    # Outside the mouth box only the jaw line moves; nothing changes at eye level or above.
    assert not diff[: int(out.eye_box[0, :, 3].max()) + 1].any()
    assert diff[_box_mask(out.mouth_box[1], diff.shape)].sum() > 0.5 * diff[mouth].sum()
    # The open mouth box is taller than the closed one.
    h = out.mouth_box[:, 3] - out.mouth_box[:, 1]
    assert h[1] > 2 * h[0]


def test_open_mouth_shows_dark_cavity_and_teeth() -> None:
    r = Renderer(sample_character(5), 256)
    p = FrameParams.from_tracks(2, mouth_open=np.array([0.0, 1.0]), teeth=1.0)
    out = r.render(p)
    x0, y0, x1, y1 = out.mouth_box[1].astype(int)
    closed = out.frames[0, y0:y1, x0:x1].astype(int)
    opened = out.frames[1, y0:y1, x0:x1].astype(int)

    def ivory(x: np.ndarray) -> int:  # bright and unsaturated: teeth, not skin or lips
        return int(((x.min(-1) > 200) & (x.max(-1) - x.min(-1) < 30)).sum())

    assert (opened.sum(-1) < 200).sum() > (closed.sum(-1) < 200).sum() + 20  # dark cavity
    assert ivory(opened) > ivory(closed) + 10  # teeth


def test_blink_closes_the_eyes() -> None:
    r = Renderer(sample_character(11), 256)
    out = r.render(FrameParams.from_tracks(2, blink=np.array([0.0, 1.0])))
    x0, y0, x1, y1 = out.eye_box[0, 0].astype(int)
    open_eye = out.frames[0, y0:y1, x0:x1].astype(int).sum(-1)
    shut_eye = out.frames[1, y0:y1, x0:x1].astype(int).sum(-1)
    assert (open_eye < 120).sum() > 8  # the dark pupil and iris are visible
    assert (shut_eye < 120).sum() < 0.6 * (open_eye < 120).sum()  # only the lash line is left
    assert (shut_eye > 600).sum() == 0 < (open_eye > 600).sum()  # no white of the eye


def test_head_pose_moves_face_box() -> None:
    r = Renderer(sample_character(2), 128)
    p = FrameParams.from_tracks(2, tx=np.array([0.0, 0.1]), ty=np.array([0.0, 0.05]))
    out = r.render(p)
    shift = out.face_box[1] - out.face_box[0]
    assert np.allclose(shift, [6.4, 3.2, 6.4, 3.2], atol=0.01)  # 0.1 half-heights = 6.4 px


def test_batching_does_not_change_pixels() -> None:
    r = Renderer(sample_character(4), 64)
    p = FrameParams.from_tracks(5, mouth_open=np.linspace(0, 1, 5), yaw=np.linspace(-0.2, 0.2, 5))
    a, b = r.render(p, batch=5).frames, r.render(p, batch=2).frames
    # Shapes are clipped to per-batch boxes; a stray edge pixel may differ, nothing more.
    assert (np.abs(a.astype(int) - b.astype(int)) > 2).mean() < 1e-3
