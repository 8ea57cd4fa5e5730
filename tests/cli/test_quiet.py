"""Quiet, early errors: the real command prints its own lines and nothing from the libraries
under it off a terminal, and bad input is refused in one line before any model loads."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from talkloop.pipeline.assets import HELLO_WAV
from talkloop.pipeline.audio.io import write_wav
from talkloop.pipeline.cli import main
from talkloop.pipeline.console import native_stderr_muted, progress_bar
from talkloop.rtc.client import wait_serving

from support import TALKLOOP, serving


def run_cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """The command as a user runs it, stdout and stderr pipes (not a terminal)."""
    return subprocess.run(
        [*TALKLOOP, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("talkloop: error: "), proc.stderr
    return lines[0]


@pytest.mark.unit
def test_missing_audio_is_one_line_and_no_file(tmp_path: Path) -> None:
    proc = run_cli(["render", "--audio", "missing.wav", "--out", "x.mp4"], tmp_path)
    assert (
        one_error_line(proc)
        == "talkloop: error: audio file not found: missing.wav (check the path)"
    )
    assert list(tmp_path.iterdir()) == []  # no x.mp4, no partial file


def bad_inputs(folder: Path) -> dict[str, tuple[list[str], str]]:
    wav = folder / "speech.wav"
    write_wav(wav, np.zeros(16000, np.float32), 16000)
    text = folder / "notes.txt"
    text.write_text("not audio, not an image")
    out = ["--out", str(folder / "out.mp4")]
    return {
        "missing reference": (
            ["--audio", str(wav), "--reference", str(folder / "nope.jpg"), *out],
            "does not exist",
        ),
        "audio is text": (["--audio", str(text), *out], "not a readable audio"),
        "no such out folder": (
            ["--audio", str(wav), "--out", str(folder / "a" / "b.mp4")],
            "output directory does not exist",
        ),
    }


@pytest.mark.unit
@pytest.mark.parametrize("case", ["missing reference", "audio is text", "no such out folder"])
def test_bad_input_is_one_line_and_no_file(tmp_path: Path, case: str) -> None:
    args, words = bad_inputs(tmp_path)[case]
    before = sorted(tmp_path.iterdir())
    line = one_error_line(run_cli(["render", *args], tmp_path))
    assert words in line
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.unit
def test_serve_with_a_bad_reference_is_one_line(tmp_path: Path) -> None:
    proc = run_cli(["serve", "--port", "0", "--reference", str(tmp_path / "nope.jpg")], tmp_path)
    assert "does not exist" in one_error_line(proc)


@pytest.mark.unit
@pytest.mark.parametrize("case", ["missing audio", "audio is an image", "empty stream"])
def test_audio_is_checked_before_the_face_models_and_networks(
    tmp_path: Path, monkeypatch, capsys, case: str
) -> None:
    """The default (portrait) render frames its photo with the face models: a bad audio file
    must fail before that, and before any network loads."""
    import talkloop.pipeline.models.portrait.face as face
    import talkloop.pipeline.models.registry as registry

    def loaded(*args, **kwargs):
        raise AssertionError("a model loaded before the audio was checked")

    monkeypatch.setattr(face._Model, "__call__", loaded)
    monkeypatch.setattr(registry, "load_modules", loaded)
    image = tmp_path / "photo.png"
    Image.new("RGB", (64, 64), (120, 110, 100)).save(image)
    empty = tmp_path / "empty.wav"
    write_wav(empty, np.zeros(0, np.float32), 16000)
    audio, words = {
        "missing audio": (tmp_path / "nope.wav", "not found"),
        "audio is an image": (image, "audio"),
        "empty stream": (empty, "zero samples"),
    }[case]
    out = tmp_path / "out.mp4"
    assert main(["render", "--audio", str(audio), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("talkloop: error:") and "\n" not in err and words in err
    assert not out.exists()


@pytest.mark.unit
def test_render_file_refuses_a_prompt_that_is_not_text(tmp_path: Path) -> None:
    from talkloop.pipeline.core.errors import InputError
    from talkloop.pipeline.render import render_file

    from support import tiny_config

    with pytest.raises(InputError, match="prompt must be text, got int"):
        render_file(tiny_config(), HELLO_WAV, tmp_path / "out.mp4", prompt=3)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.unit
def test_progress_bars_draw_on_a_terminal_only() -> None:
    for file, drawn in ((_Terminal(), True), (io.StringIO(), False)):
        for _ in progress_bar(range(3), file=file, desc="work"):
            pass
        assert ("work" in file.getvalue()) is drawn
    off = _Terminal()
    for _ in progress_bar(range(3), enabled=False, file=off, desc="work"):
        pass
    assert off.getvalue() == ""


@pytest.mark.unit
def test_native_stderr_drops_info_lines_and_keeps_the_rest(capfd) -> None:
    with native_stderr_muted():
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
        os.write(2, b"ERROR: something real\n")
    assert capfd.readouterr().err == "ERROR: something real\n"
    with pytest.raises(RuntimeError), native_stderr_muted():  # the error text still surfaces
        os.write(2, b"ERROR: failed to prepare\n")
        raise RuntimeError("failed")
    assert capfd.readouterr().err == "ERROR: failed to prepare\n"


@pytest.mark.e2e
def test_a_render_off_a_terminal_prints_one_line(tmp_path: Path) -> None:
    """The default model, progress bar on (no --quiet): stderr is a pipe, so nothing there."""
    proc = run_cli(["render", "--audio", str(HELLO_WAV), "--out", "out.mp4"], tmp_path, 300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no XNNPACK INFO line, warning, or progress bar
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wrote 221 frames"), proc.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["out.mp4"]


@pytest.mark.e2e
def test_serve_prints_its_url_line_and_nothing_else(tmp_path: Path) -> None:
    """The default model on a free port: the URL line, nothing on stderr until /healthz answers
    (nor after), then "stopped" on SIGTERM."""
    with serving(["--host", "127.0.0.1", "--port", "0"], cwd=tmp_path) as served:
        # the first line it prints
        assert served.before == [], served.before
        assert served.line.startswith("talkloop: serving on http://127.0.0.1:"), served.line
        wait_serving(served.url.rstrip("/"), served.proc, 120)
        out, err = served.stop()
    assert served.proc.returncode == 0, err
    assert err == ""
    assert out == "talkloop: stopped\n"  # after the first line: nothing until stopped
