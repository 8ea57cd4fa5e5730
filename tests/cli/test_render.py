"""`talkloop render`: bad input is refused cleanly; a tiny render gives a correct mp4."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from talkloop.pipeline.audio.io import write_wav
from talkloop.pipeline.cli import main

from support import TALKLOOP, make_reference, tiny_args

TINY = [*tiny_args(), "--steps", "2", "--quiet"]


@pytest.fixture
def files(tmp_path: Path, speech: np.ndarray) -> dict[str, Path]:
    ref = tmp_path / "ref.png"
    Image.fromarray(make_reference(96, 80)).save(ref)
    wav = tmp_path / "speech.wav"
    write_wav(wav, speech[: 16000 * 2], 16000)
    empty = tmp_path / "empty.wav"
    write_wav(empty, np.zeros(0, np.float32), 16000)
    text = tmp_path / "notes.txt"
    text.write_text("not audio, not an image")
    return {"ref": ref, "wav": wav, "empty": empty, "text": text, "dir": tmp_path}


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    code = main(["render", *args])
    return code, capsys.readouterr().err.strip()


def render_args(wav: Path, ref: Path, out: Path, *more: str) -> list[str]:
    """`talkloop render`'s arguments: ``wav`` on ``ref`` into ``out``, the tiny model."""
    return ["--audio", str(wav), "--reference", str(ref), "--out", str(out), *more, *TINY]


BAD_CASES = [
    ("missing audio", lambda f: ["--audio", str(f["dir"] / "nope.wav")], "audio file not found"),
    ("audio is text", lambda f: ["--audio", str(f["text"])], "not a readable audio"),
    ("audio is image", lambda f: ["--audio", str(f["ref"])], "audio"),
    ("empty audio", lambda f: ["--audio", str(f["empty"])], "empty"),
    (
        "missing reference",
        lambda f: ["--audio", str(f["wav"]), "--reference", str(f["dir"] / "x.png")],
        "reference image not found",
    ),
    (
        "reference not image",
        lambda f: ["--audio", str(f["wav"]), "--reference", str(f["text"])],
        "not a readable image",
    ),
    (
        "unsupported size",
        lambda f: ["--audio", str(f["wav"]), "--size", "100"],
        "unsupported width 100",
    ),
    ("bad fps", lambda f: ["--audio", str(f["wav"]), "--fps", "0"], "video.fps"),
    (
        "no such out dir",
        lambda f: ["--audio", str(f["wav"]), "--out", str(f["dir"] / "a" / "b.mp4")],
        "output directory does not exist",
    ),
    (
        "out not mp4",
        lambda f: ["--audio", str(f["wav"]), "--out", str(f["dir"] / "b.avi")],
        "must be an .mp4",
    ),
]


@pytest.mark.unit
@pytest.mark.parametrize(("case", "args", "message"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input_one_line_error_no_file(files, capsys, case, args, message) -> None:
    out = files["dir"] / "out.mp4"
    argv = ["--out", str(out), "--reference", str(files["ref"]), *TINY, *args(files)]
    code, err = run_cli(argv, capsys)
    assert code == 2
    assert err.startswith("talkloop: error:") and "\n" not in err
    assert message in err
    assert not out.exists()
    assert not [p for p in files["dir"].iterdir() if "partial" in p.name]


@pytest.mark.unit
def test_unwritable_output_directory(files, capsys) -> None:
    locked = files["dir"] / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores permissions: make the parent a file instead
            target = files["dir"] / "afile" / "out.mp4"
            (files["dir"] / "afile").write_text("x")
        else:
            target = locked / "out.mp4"
        code, err = run_cli(render_args(files["wav"], files["ref"], target), capsys)
    finally:
        locked.chmod(0o700)
    assert code == 2 and "output directory" in err


@pytest.mark.unit
def test_default_model_without_installed_weights_says_so(files, capsys, monkeypatch) -> None:
    import talkloop.pipeline.models.studio.family as registry

    monkeypatch.setattr(registry, "INSTALLED_WEIGHTS", files["dir"] / "no-weights-here")
    out = files["dir"] / "out.mp4"
    code, err = run_cli(
        ["--family", "studio", "--audio", str(files["wav"]), "--reference", str(files["ref"])]
        + ["--out", str(out)],
        capsys,
    )
    assert code == 2 and "no trained weights are installed" in err
    assert not out.exists()


def probe(path: Path) -> dict:
    with av.open(str(path)) as c:
        v, a = c.streams.video[0], c.streams.audio[0]
        info = {
            "vcodec": v.codec_context.name,
            "acodec": a.codec_context.name,
            "v_start": float(v.start_time * v.time_base),
            "a_start": float(a.start_time * a.time_base),
            "v_dur": float(v.duration * v.time_base),
            "a_dur": float(a.duration * a.time_base),
        }
        info["frames"] = sum(1 for _ in c.decode(video=0))
    with av.open(str(path)) as c:
        # Audio as played: the edit list hides the AAC encoder's 1024 priming samples (first
        # packet at -1024), which the container's stream duration still counts; the last packet
        # ends at the last real sample.
        packets = [p for p in c.demux(audio=0) if p.size]
        tb = packets[0].time_base
        info["a_first_packet"] = int(packets[0].pts)
        info["a_end"] = float((packets[-1].pts + packets[-1].duration) * tb)
        info["a_first"] = 0.0 if packets[0].pts < 0 else float(packets[0].pts * tb)
    return info


@pytest.mark.e2e
@pytest.mark.parametrize("fps", [25, 30])
def test_render_mp4_durations_match_audio(files, capsys, fps) -> None:
    out = files["dir"] / f"out{fps}.mp4"
    code, err = run_cli(render_args(files["wav"], files["ref"], out, "--fps", str(fps)), capsys)
    assert code == 0, err
    info = probe(out)
    duration = 2.0
    assert info["vcodec"] == "h264" and info["acodec"] == "aac"
    assert info["v_start"] == 0 and info["a_start"] == 0
    assert abs(info["v_dur"] - duration) <= 1 / fps
    assert info["a_first"] == 0
    assert abs(info["a_end"] - duration) <= 1 / fps
    assert info["frames"] == int(np.ceil(duration * fps))


@pytest.mark.e2e
def test_interrupted_render_leaves_playable_mp4(files, speech, tmp_path) -> None:
    long_wav = tmp_path / "long.wav"
    write_wav(long_wav, np.resize(speech, 16000 * 60), 16000)
    out = tmp_path / "interrupted.mp4"
    proc = subprocess.Popen(
        [*TALKLOOP, "render", *render_args(long_wav, files["ref"], out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until frames are being written
        partial = [p for p in tmp_path.iterdir() if "partial" in p.name]
        if partial and partial[0].stat().st_size > 20000:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: wrote" in err
    info = probe(out)
    assert 0 < info["frames"] < 60 * 25
    assert abs(info["v_dur"] - info["frames"] / 25) < 1e-6
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]
