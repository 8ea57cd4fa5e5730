"""The portrait family's pixel-level evaluation (``models/portrait/pixel_eval.py``).

Units: the pause/speech split of a clip's audio, the face-height normalisation of the mouth
figures on synthetic landmarks (a similarity of the face leaves them unchanged), bilabial phones
from label files and from a transcript, the teeth figure's pairs. End to end: ``talkloop eval
--family portrait --photos --audio`` renders the bundled avatar with one of the committed flite
voices (``tests/data/voices/``), as ``talkloop render`` does, and writes the figures, a contact
sheet per clip and the clips' mp4s.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from talkloop.pipeline.audio.io import load_audio
from talkloop.pipeline.cli import build_parser, main
from talkloop.pipeline.core.clock import frames_for_samples
from talkloop.pipeline.core.errors import ConfigError, InputError
from talkloop.pipeline.models.portrait import bilabials as bl
from talkloop.pipeline.models.portrait import pixel_eval as pe
from talkloop.pipeline.models.portrait.family import DEFAULT_REFERENCE
from talkloop.pipeline.train.cli import cmd_eval

VOICES = Path(__file__).parents[2] / "data" / "voices"
RATE, FPS = 16000, 25


# -- the pause / speech split ------------------------------------------------------------------------


def _tone(seconds: float, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def _silence(seconds: float, floor: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    return (floor * rng.standard_normal(int(seconds * RATE))).astype(np.float32)


@pytest.mark.unit
@pytest.mark.parametrize("gain", [1.0, 0.05])
def test_pauses_are_long_quiet_stretches_relative_to_the_clips_speech(gain: float) -> None:
    # 0.4 s quiet, 1 s speech, 0.12 s gap (too short for a pause), 1 s speech, 0.6 s quiet; the
    # quiet has a noise floor 40 dB under the speech. Frames are 40 ms: 10 | 25 | 3 | 25 | 15.
    floor = 0.3 / np.sqrt(2) * 10 ** (-40 / 20)
    audio = np.concatenate(
        [_silence(0.4, floor), _tone(1.0), _silence(0.12, floor), _tone(1.0), _silence(0.6, floor)]
    )
    split = pe.split_speech(gain * audio, 78, FPS, RATE)
    expected_speech = np.zeros(78, bool)
    expected_speech[10:35] = expected_speech[38:63] = True
    np.testing.assert_array_equal(split.speech, expected_speech)
    expected_pauses = np.zeros(78, bool)
    expected_pauses[2:8] = True  # 10 quiet frames less 2 at either end
    expected_pauses[65:76] = True  # 15 quiet frames less 2 at either end
    np.testing.assert_array_equal(split.pauses, expected_pauses)
    assert split.level == pytest.approx(gain * 0.3 / np.sqrt(2), rel=0.02)


@pytest.mark.unit
def test_a_quieter_stretch_above_the_threshold_is_speech() -> None:
    # -20 dB under the speech level is still speech; -35 dB is a pause.
    audio = np.concatenate([_tone(1.0), _tone(0.4, 0.03), _tone(1.0), _tone(0.4, 0.3 * 10**-1.75)])
    split = pe.split_speech(audio, 70, FPS, RATE)
    assert split.speech[25:35].all()
    assert not split.speech[60:70].any() and split.pauses[62:68].all()


# -- mouth figures on synthetic landmarks ------------------------------------------------------------


def _face(gap: float = 14.0) -> np.ndarray:
    """(478, 3) landmarks: eye line at y 100, chin at y 240 (face height 140), inner lips
    ``gap`` px apart, mouth 80 px wide, face 180 px wide."""
    lm = np.zeros((478, 3), np.float32)
    lm[[33, 133, 362, 263], :2] = [[110, 101], [135, 99], [165, 99], [190, 101]]
    lm[152, :2] = [150, 240]
    lm[[78, 308], :2] = [[122, 200], [178, 200]]
    lm[[82, 13, 312], :2] = [[140, 200 - gap / 2], [150, 200 - gap / 2], [160, 200 - gap / 2]]
    lm[[87, 14, 317], :2] = [[140, 200 + gap / 2], [150, 200 + gap / 2], [160, 200 + gap / 2]]
    lm[[61, 291], :2] = [[110, 200], [190, 200]]
    lm[[234, 454], :2] = [[60, 150], [240, 150]]
    return lm


def _moved(lm: np.ndarray, angle: float, scale: float, shift: tuple[float, float]) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    out = lm.copy()
    out[:, :2] = scale * lm[:, :2] @ np.array([[c, s], [-s, c]]) + np.array(shift)
    return out


@pytest.mark.unit
def test_openings_are_in_face_heights_whatever_the_faces_size_and_roll() -> None:
    face = _face(gap=14.0)
    assert pe.face_height(face) == pytest.approx(140.0)
    assert pe.mouth_opening(face[None], pe.face_height(face))[0] == pytest.approx(0.1)
    assert pe.mouth_width(face[None])[0] == pytest.approx(80 / 180)
    moved = _moved(face, angle=0.5, scale=2.5, shift=(40.0, -30.0))
    unit = pe.face_height(moved)
    assert unit == pytest.approx(350.0)
    assert pe.mouth_opening(moved[None], unit)[0] == pytest.approx(0.1)
    assert pe.mouth_width(moved[None])[0] == pytest.approx(80 / 180)
    # The unit is the photo's: a frame measured against another face's height scales with it.
    assert pe.mouth_opening(moved[None], 140.0)[0] == pytest.approx(0.25)


@pytest.mark.unit
def test_lips_pressed_past_each_other_read_below_zero() -> None:
    pressed = _face(gap=-4.0)
    assert pe.mouth_opening(pressed[None], 140.0)[0] == pytest.approx(-4 / 140)
    frames = np.stack([_face(0.0), _face(7.0), pressed])
    np.testing.assert_allclose(pe.mouth_opening(frames, 140.0), [0.0, 0.05, -4 / 140], atol=1e-6)


# -- bilabials ------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_label_files_give_the_bilabials_and_bad_lines_name_the_file(tmp_path: Path) -> None:
    lab = tmp_path / "a.lab"
    lab.write_text("# phones\n0.10\t0.20\tb\n0.20 0.35 aa1\n\n0.35 0.42 M\n0.42 0.5 'p\n")
    phones = bl.read_lab(lab)
    assert [p.phone for p in bl.bilabials(phones)] == ["b", "M", "'p"]
    assert phones[1] == bl.Phone(0.20, 0.35, "aa1")
    lab.write_text("0.1 b\n")
    with pytest.raises(InputError, match=r"a\.lab:1: expected 'start end phone'"):
        bl.read_lab(lab)


@pytest.mark.unit
def test_bilabial_closure_is_measured_against_what_closed_lips_read() -> None:
    phones = [bl.Phone(0.40, 0.48, "b"), bl.Phone(0.48, 0.60, "aa"), bl.Phone(1.00, 1.08, "m")]
    opening = np.full(40, 0.08)
    opening[10:12] = 0.031  # the b's frames: closed on a face whose closed lips read 0.025
    opening[25:28] = 0.05  # the m: still open
    summary, rows = pe.bilabial_figures(phones, opening, FPS, closed=0.025)
    assert summary["count"] == 2 and summary["closed_fraction"] == 0.5
    assert [r["frame"] for r in rows] == [10, 25]
    assert [r["min_opening"] for r in rows] == [0.031, 0.05]
    summary, _ = pe.bilabial_figures(phones, opening, FPS, closed=0.0)
    assert summary["closed_fraction"] == 0.0


@pytest.mark.unit
def test_a_transcript_finds_the_bilabials_near_the_synthesisers_own_times() -> None:
    path = VOICES / "flite_rms.ogg"
    audio = load_audio(path, RATE)
    truth = bl.bilabials(bl.read_lab(path.with_suffix(".lab")))
    found = bl.bilabials(bl.align_transcript(path.with_suffix(".txt").read_text(), audio, RATE))
    assert [bl.phone_name(p.phone) for p in found] == [p.phone for p in truth]
    error = np.array(
        [(f.start + f.end - t.start - t.end) / 2 for f, t in zip(found, truth, strict=True)]
    )
    assert np.median(np.abs(error)) < 0.04 and np.abs(error).max() < 0.1


@pytest.mark.unit
def test_a_warp_path_follows_a_stretched_copy() -> None:
    a = np.sin(np.linspace(0, 6, 60))[:, None] * np.array([[1.0, 0.5]])
    b = np.repeat(a, 2, axis=0)  # b is a at half speed
    path = bl.warp_path(a, b)
    assert path[0] == 0 and path[-1] == len(b) - 2  # the last of a pairs the last two of b
    assert np.all(np.diff(path) >= 0)
    assert np.abs(path - 2 * np.arange(60)).max() <= 2


# -- teeth pairs ------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_teeth_change_compares_only_frames_of_the_same_mouth_shape() -> None:
    h, w = pe.PATCH[1], pe.PATCH[0]
    patches = np.zeros((4, h, w, 3), np.uint8)
    patches[1] = 30  # same shape as frame 0, interior 30 grey levels brighter
    patches[2:] = 200  # different shapes
    masks = np.ones((4, h, w), bool)
    opening = np.array([0.10, 0.102, 0.20, 0.10])
    width = np.array([0.40, 0.40, 0.40, 0.45])  # frame 3: as open as 0 and 1, but wider
    speech = np.ones(4, bool)
    got = pe.teeth_change(patches, masks, opening, width, speech, closed=0.02)
    assert got["pairs"] == 1 and got["median"] == 30.0
    assert pe.teeth_change(patches, masks, opening, width, speech, closed=0.08)["pairs"] == 0


# -- the command ------------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--photos", str(DEFAULT_REFERENCE)], "needs both --photos and --audio"),
        (["--prompt", "serious"], "--prompt and --live belong to the pixel evaluation"),
    ],
)
def test_the_pixel_options_are_refused_alone(tmp_path: Path, extra, message) -> None:
    out = tmp_path / "out"
    args = build_parser().parse_args(["eval", "--family", "portrait", "--out", str(out), *extra])
    with pytest.raises(ConfigError, match=message):
        cmd_eval(args)
    assert not out.exists()


@pytest.mark.unit
def test_a_folder_without_photos_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no photo files \(\.jpg"):
        pe.collect([tmp_path], pe.PHOTO_SUFFIXES, "photo")


@pytest.mark.e2e  # ~11 s on 2 cores beside a CI run: two 5 s clips rendered and read back
def test_eval_renders_the_photo_and_writes_figures_sheets_and_clips(tmp_path: Path) -> None:
    voice = VOICES / "flite_slt.ogg"
    out = tmp_path / "eval"
    argv = ["eval", "--family", "portrait", "--out", str(out), "--quiet", "--dtype", "float32"]
    argv += ["--photos", str(DEFAULT_REFERENCE), "--audio", str(voice)]
    argv += ["--prompt", "serious", "--prompt", "smiling"]
    assert main(argv) == 0
    result = json.loads((out / "eval.json").read_text())
    assert set(result["definitions"]) >= {"face_height", "opening", "pauses", "speech"}
    photo = result["photos"]["default_portrait"]
    assert 100 < photo["face_height_px"] < 250  # the face is ~42 % of a 512 frame
    # The rig opens the lips in face units, and the frames read back an opening that grows too.
    sweep = photo["opening_by_parameter"]
    assert sweep["mouth_open"] == [0.25, 0.5, 1.0]
    assert 0.05 < sweep["rig"][0] < sweep["rig"][1] < sweep["rig"][2] < 0.3
    assert 0.05 < sweep["read"][0] < sweep["read"][1] < 0.3
    clips = {c["prompt"]: c for c in result["clips"]}
    assert set(clips) == {"serious", "smiling"}
    frames = frames_for_samples(len(load_audio(voice, RATE)), FPS, RATE)
    for prompt, clip in clips.items():
        assert clip["photo"] == "default_portrait" and clip["voice"] == "flite_slt"
        assert clip["schedule"] == "offline"
        assert clip["frames"] == frames and clip["frames_without_face"] == 0
        assert clip["speech_frames"] > 40 and clip["pause_frames"] > 20
        # The mouth opens in speech and rests in pauses, as the shipped models read the frames.
        assert clip["opening_speech_median"] > clip["opening_pause_median"] + 0.01, prompt
        assert clip["opening_pause_median"] < photo["closed_reads"] + 0.03, prompt
        assert 0.2 < clip["envelope_corr"]["r"] <= 1.0
        assert abs(clip["envelope_corr"]["lag_ms"]) <= 80
        b = clip["bilabials"]
        assert b["source"] == "lab" and b["count"] == 13
        assert len(clip["bilabial_phones"]) == 13
        assert 0.2 < clip["width_rest_median"] < 0.7
        assert clip["background_change"]["mean"] is not None
        assert clip["background_change"]["mean"] < 2.0  # the background plate does not move
        sheet = (out / clip["sheet"]).read_bytes()
        assert sheet[:8] == b"\x89PNG\r\n\x1a\n" and len(sheet) > 100_000
        assert (out / clip["video"]).stat().st_size > 10_000
    assert clips["smiling"]["width_rest_median"] > clips["serious"]["width_rest_median"]


# -- contact sheets ----------------------------------------------------------------------------------


@pytest.mark.unit
def test_a_contact_sheets_label_is_outlined_along_its_whole_length() -> None:
    """The black outline follows the white letters to the line's end (a thick black copy, spaced
    wider by OpenCV, drifted off them, 15 pixels past their end, and made the label unreadable)."""
    grey = np.full((40, 256, 3), 128, np.uint8)
    out = pe._label(grey, ["p/b/m (median): frame 111 (4.44 s)"])
    white = np.nonzero((out > 200).all(2).any(0))[0]
    black = np.nonzero((out < 40).all(2).any(0))[0]
    assert white.size and black.size
    assert abs(int(black.max()) - int(white.max())) <= 2
    assert abs(int(black.min()) - int(white.min())) <= 2
