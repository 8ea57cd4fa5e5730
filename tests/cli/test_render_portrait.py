"""`talkloop render --family portrait`: a photo becomes an mp4; bad photos exit 2 and write nothing."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from talkloop.pipeline.audio.io import write_wav
from talkloop.pipeline.cli import main
from talkloop.pipeline.models.portrait.family import DEFAULT_REFERENCE

from support import portraits

pytestmark = pytest.mark.e2e

FAST = ["--family", "portrait", "--untrained", "--preset", "tiny", "--size", "256", "--quiet"]
HOPPER = portraits()["grace_hopper"]


@pytest.fixture
def wav(tmp_path: Path, speech: np.ndarray) -> Path:
    path = tmp_path / "speech.wav"
    write_wav(path, speech[: int(16000 * 1.5)], 16000)
    return path


def bad_photos(folder: Path) -> dict[str, tuple[Path, str]]:
    blank = folder / "blank.png"
    Image.new("RGB", (400, 400), (180, 170, 160)).save(blank)
    tiny = folder / "tiny_face.png"
    canvas = Image.new("RGB", (1600, 1600), (90, 90, 90))
    with Image.open(DEFAULT_REFERENCE) as im:
        canvas.paste(im.convert("RGB").resize((340, 340)), (600, 600))
    canvas.save(tiny)
    truncated = folder / "cut.jpg"
    with Image.open(DEFAULT_REFERENCE) as im:
        im.convert("RGB").save(folder / "whole.jpg")
    truncated.write_bytes((folder / "whole.jpg").read_bytes()[:3000])
    text = folder / "notes.png"
    text.write_text("not an image")
    return {
        "no face": (blank, "no face"),
        "face too small": (tiny, "px"),
        "truncated file": (truncated, "truncated"),
        "not an image": (text, "image"),
        "missing file": (folder / "nope.jpg", "does not exist"),
    }


@pytest.mark.parametrize(
    "case", ["no face", "face too small", "truncated file", "not an image", "missing file"]
)
def test_bad_photo_exits_2_with_one_line_and_no_file(case, tmp_path, wav, capsys) -> None:
    photo, words = bad_photos(tmp_path)[case]
    out = tmp_path / "out.mp4"
    code = main(
        ["render", "--audio", str(wav), "--reference", str(photo), "--out", str(out)] + FAST
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("talkloop: error:")
    assert words in err.lower()
    assert not out.exists()


@pytest.mark.parametrize("photo", [None, HOPPER], ids=["default portrait", "grace hopper"])
def test_a_photo_renders_to_an_mp4_with_sound(photo, tmp_path, wav, capsys) -> None:
    out = tmp_path / "out.mp4"
    ref = [] if photo is None else ["--reference", str(photo)]
    code = main(["render", "--audio", str(wav), "--out", str(out), *ref] + FAST)
    assert code == 0, capsys.readouterr().err
    with av.open(str(out)) as c:
        v, a = c.streams.video[0], c.streams.audio[0]
        assert (v.codec_context.name, a.codec_context.name) == ("h264", "aac")
        assert (v.codec_context.width, v.codec_context.height) == (256, 256)
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 38  # 1.5 s at 25 fps, rounded up
    # A person, not noise: the frame keeps the photo's skin, hair and background.
    first = frames[0].astype(np.int16)
    assert 40 < first.mean() < 220 and first.std() > 20


@pytest.mark.unit
def test_the_portrait_family_is_the_default() -> None:
    from talkloop.pipeline.args import config_from_args
    from talkloop.pipeline.cli import build_parser

    args = build_parser().parse_args(["render", "--audio", "a.wav", "--out", "b.mp4"])
    config = config_from_args(args)
    assert config.model.family == "portrait"
    assert (config.video.width, config.video.height) == (512, 512)


def test_the_default_opens_the_mouth_in_speech_and_closes_it_in_pauses(tmp_path, speech) -> None:
    """Read from the pixels (no network): the dark mouth cavity in speech vs pauses."""
    from talkloop.pipeline.models.portrait.face import detect_faces, face_landmarks

    pause = np.zeros(int(1.2 * 16000), np.float32)
    wav, out = tmp_path / "speech.wav", tmp_path / "out.mp4"
    write_wav(wav, np.concatenate([pause, speech[: 3 * 16000], pause]), 16000)
    assert main(["render", "--audio", str(wav), "--out", str(out), "--quiet"]) == 0
    with av.open(str(out)) as c:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    lm = face_landmarks(frames[0], detect_faces(frames[0])[0])
    lips = lm[[61, 291, 0, 17], :2]  # mouth corners, upper and lower lip
    x0, y0 = lips.min(0).astype(int) - 4
    x1, y1 = lips.max(0).astype(int) + 4
    mouth = frames[:, y0:y1, x0:x1].astype(np.float32).mean(-1)  # (T, h, w) brightness
    opening = (mouth < 70).mean(axis=(1, 2))  # share of dark (cavity) pixels
    first_pause, talk = opening[3:27], opening[32:100]  # frames of 1.2 s pause, then speech
    last_pause = opening[-25:-3]
    assert talk.max() > 4 * max(first_pause.mean(), 1e-3)
    assert talk.mean() > 2 * first_pause.mean() and talk.mean() > 2 * last_pause.mean()


@pytest.mark.unit
def test_missing_portrait_weights_say_so(tmp_path, wav, capsys, monkeypatch) -> None:
    import talkloop.pipeline.models.portrait.family as portrait

    monkeypatch.setattr(portrait, "INSTALLED_WEIGHTS", tmp_path / "no-weights-here")
    out = tmp_path / "out.mp4"
    code = main(["render", "--audio", str(wav), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "no trained weights are installed for the portrait model" in err
    assert not out.exists()
