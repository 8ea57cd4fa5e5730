"""The wheel is the whole product: built from this tree, installed into a fresh venv outside the
repository, `talkloop render` and `talkloop serve` work from a folder that is not the repository.

The fresh venv gets the wheel and nothing else (``pip install --no-deps``); the dependencies come
from the test's own venv through a ``.pth`` line naming its site-packages. A ``.pth`` line that
is a folder only adds it to ``sys.path`` (the ``.pth`` files inside it are not run), so that
venv's editable ``talkloop`` finder stays off and ``talkloop`` can only come from the wheel;
each test checks so.

test_container.py imports ``source_copy`` and ``check_mp4`` from here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import av
import pytest

from support import http_get, serving

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# Tracked files of the package that no installed command reads: the record of a training run,
# which only the model-card step of a training run (talkloop/pipeline/models/studio/card.py) opens.
NOT_SHIPPED = ("train_log.jsonl",)


def source_files(repo: Path = REPO) -> list[str]:
    """The tree's files as a fresh clone plus local edits has them: tracked and not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    return sorted({p for p in out.decode().split("\0") if p and (repo / p).is_file()})


def source_copy(dest: Path, repo: Path = REPO) -> Path:
    """Copy the tree's files to ``dest``: no .venv, no build/ left over from earlier builds
    (setuptools would pack stale files from build/lib into the wheel)."""
    for rel in source_files(repo):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, target)
    return dest


def check_mp4(path: Path, seconds: float) -> None:
    """``path`` opens as an mp4 with one H.264 video and one AAC audio stream, both decoding,
    about ``seconds`` long."""
    assert path.is_file() and path.stat().st_size > 10_000, path
    with av.open(str(path)) as c:
        assert c.format.name.startswith("mov,mp4"), c.format.name
        video, audio = c.streams.video, c.streams.audio
        assert len(video) == 1 and len(audio) == 1, (video, audio)
        assert (video[0].codec_context.name, audio[0].codec_context.name) == ("h264", "aac")
        assert abs(c.duration / 1e6 - seconds) < 0.5, (c.duration, seconds)
        frames = sum(1 for _ in c.decode(video=0))
        assert frames >= seconds * 20, frames  # 25 fps, give or take the ends
        c.seek(0)
        samples = sum(f.samples for f in c.decode(audio=0))
        assert abs(samples / audio[0].rate - seconds) < 0.5, samples


def wav_seconds(path: Path) -> float:
    with av.open(str(path)) as c:
        return c.duration / 1e6


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = source_copy(tmp_path_factory.mktemp("src"))
    dist = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", ".", "-w", str(dist)]
    subprocess.run(cmd, cwd=src, check=True, timeout=300)
    (built,) = dist.glob("talkloop-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel: Path) -> Path:
    """A fresh venv outside the repository with the wheel installed (not editable)."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    assert REPO not in root.parents
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    py = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # The dependencies: this venv's site-packages, as a plain path (see the module docstring).
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "talkloop-test-deps.pth").write_text("".join(f"{p}\n" for p in sorted(deps)))
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps"]
    subprocess.run([*pip, str(wheel)], check=True, timeout=300)
    return root


def venv_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(VIRTUAL_ENV=str(venv), PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    return env


def venv_python(venv: Path, code: str) -> str:
    """What ``code`` prints, run by the venv's python from the venv's folder."""
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=venv_env(venv),
        cwd=venv,
    ).stdout


def installed_package(venv: Path) -> Path:
    return Path(venv_python(venv, "import talkloop; print(talkloop.__file__)").strip()).parent


def test_wheel_contents(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"talkloop-{wheel.name.split('-')[1]}.dist-info"
    tops = {n.split("/")[0] for n in names}
    assert tops == {"talkloop", dist_info}, tops
    meta = {n.split("/")[-1]: n for n in names if n.startswith(f"{dist_info}/")}
    with zipfile.ZipFile(wheel) as z:
        assert z.read(meta["top_level.txt"]).decode().split() == ["talkloop"]
        entry = z.read(meta["entry_points.txt"]).decode()
    assert "talkloop = talkloop.__main__:main" in entry
    for page in ("index.html", "app.js", "style.css"):
        assert f"talkloop/web/{page}" in names
    # Every file of the package in the tree is in the wheel: modules, weights, assets, page.
    wanted = [
        p
        for p in source_files()
        if p.startswith("talkloop/")
        and "/__pycache__/" not in p
        and Path(p).name not in NOT_SHIPPED
    ]
    missing = sorted(set(wanted) - set(names))
    assert not missing, f"not in the wheel: {missing}"
    for family in ("studio", "portrait"):
        weights = [n for n in names if n.startswith(f"talkloop/pipeline/models/{family}/weights/")]
        assert any(n.endswith(".safetensors") for n in weights), family
    assert "talkloop/pipeline/assets/hello.wav" in names


def test_installed_package_is_the_wheel(venv: Path) -> None:
    package = installed_package(venv)
    assert venv in package.parents and REPO not in package.parents, package
    code = (
        "import importlib.metadata as m, talkloop.pipeline.cli, talkloop.rtc.server, "
        "talkloop.agent; print(talkloop.rtc.server.WEB_DIR); "
        "print(m.distribution('talkloop').locate_file('talkloop/__init__.py'))"
    )
    out = venv_python(venv, code).split()
    assert [Path(p).resolve().is_relative_to(venv.resolve()) for p in out] == [True, True], out


def test_render_outside_the_repo(venv: Path, tmp_path: Path) -> None:
    hello = installed_package(venv) / "pipeline" / "assets" / "hello.wav"
    assert hello.is_file()
    cmd = ["talkloop", "render", "--audio", str(hello), "--out", "x.mp4"]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=venv_env(venv), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrote" in proc.stdout, proc.stdout
    check_mp4(tmp_path / "x.mp4", wav_seconds(hello))


def test_serve_outside_the_repo(venv: Path, tmp_path: Path) -> None:
    args = ["--host", "127.0.0.1", "--port", "0"]
    with serving(args, command=["talkloop"], cwd=tmp_path, env=venv_env(venv)) as served:
        base = served.url
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", base), served.line
        status, ctype, body = http_get(base)
        assert status == 200 and ctype.startswith("text/html"), (status, ctype)
        assert b"<html" in body and b'src="app.js"' in body
        status, ctype, body = http_get(base + "app.js")
        assert status == 200 and "javascript" in ctype and b"WebSocket" in body, (status, ctype)
        assert http_get(base + "healthz")[:1] == (200,)
        out, err = served.stop()
    assert served.proc.returncode == 0, err[-3000:]
    assert "talkloop: stopped" in out and "Traceback" not in err, (out, err[-3000:])
