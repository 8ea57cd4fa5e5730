"""The container image (Dockerfile, docs/container.md): built from this tree on a Debian
bookworm base, it renders an mp4 from a mounted wav and serves the page as a non-root user, and
its HEALTHCHECK turns healthy.

Everything runs on a Docker daemon of the test's own (Debian's docker.io: /usr/sbin/dockerd and
/usr/bin/docker, whatever else is on PATH), with its own socket, data root and exec root in a
temporary folder, no bridge and no iptables rules; it is stopped and its folder removed at the
end. No registry is reached: the base image is a `debootstrap --variant=minbase bookworm` of the
mirror apt uses here, imported with `docker import` (its tarball is kept in
/var/cache/talkloop-test for the next run). The build runs with `--network host` (apt and PyPI
through this machine's own network and pip settings, passed to the build stage as the context's
pip/ folder, never as Dockerfile defaults); torch is this machine's CPU wheel, put in the
context's wheels/ folder with `pip download`. The containers only use loopback:
render runs with `--network none`, serve with `--network host` listening on 127.0.0.1.

Storage: overlay2, falling back to vfs where the kernel or the data root's file system has no
overlay (vfs copies the whole image for every layer and container: measured here, about 4x the
build time, minutes per container start and a quarter of an hour to delete the data root).
Needs root (dockerd), like the network-namespace tests.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
from test_wheel import REPO, check_mp4, source_copy, wav_seconds

from support import http_get

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

DOCKER, DOCKERD, DEBOOTSTRAP = "/usr/bin/docker", "/usr/sbin/dockerd", "/usr/sbin/debootstrap"
BASE = "talkloop-test-base:bookworm"
IMAGE = "talkloop-test:latest"
CACHE = Path("/var/cache/talkloop-test")
HELLO = REPO / "talkloop" / "pipeline" / "assets" / "hello.wav"


def run(cmd: list[str], timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)[:300]} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-3000:]}"
        )
    return proc


class Daemon:
    """A dockerd of this test: ``docker(...)`` runs Debian's CLI against its socket."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock = root / "docker.sock"
        self.proc: subprocess.Popen | None = None
        self.driver = ""

    def start(self, driver: str, timeout: float = 60) -> bool:
        (self.root / "daemon.json").write_text("{}")  # not /etc/docker/daemon.json
        cmd = [DOCKERD, "--config-file", str(self.root / "daemon.json")]
        cmd += ["--host", f"unix://{self.sock}", "--data-root", str(self.root / "data")]
        cmd += ["--exec-root", str(self.root / "exec"), "--pidfile", str(self.root / "pid")]
        cmd += ["--iptables=false", "--ip6tables=false", "--bridge=none"]
        cmd += ["--storage-driver", driver]
        self.log = open(self.root / f"dockerd-{driver}.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.sock.exists():
                info = subprocess.run(
                    [DOCKER, "-H", f"unix://{self.sock}", "info", "--format", "{{.Driver}}"],
                    capture_output=True,
                    text=True,
                )
                if info.returncode == 0:
                    self.driver = info.stdout.strip()
                    return self.driver == driver
            time.sleep(0.5)
        self.stop()
        return False

    def docker(self, *args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        env.pop("DOCKER_HOST", None)
        return run([DOCKER, "-H", f"unix://{self.sock}", *args], timeout=timeout, env=env, **kw)

    def stop(self) -> None:
        t0 = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.log.close()
        # What the daemon leaves behind: its netns mount, and (after a kill) container mounts.
        mine = str(self.root) + "/"
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        for point in sorted((p for p in points if p.startswith(mine)), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        t1 = time.monotonic()
        shutil.rmtree(self.root / "data", ignore_errors=True)
        shutil.rmtree(self.root / "exec", ignore_errors=True)
        print(
            f"dockerd stopped in {t1 - t0:.0f} s, its data removed in {time.monotonic() - t1:.0f} s"
        )


def leftover_processes(root: Path) -> list[int]:
    """Processes whose command line names ``root`` (containerd, shims): none once stopped."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(root).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def daemon():
    if os.geteuid() != 0:
        pytest.skip("the container test starts its own dockerd, which needs root")
    missing = [p for p in (DOCKER, DOCKERD, DEBOOTSTRAP) if not os.access(p, os.X_OK)]
    assert not missing, (
        f"missing {missing}: apt-get install docker.io debootstrap (setup.sh --test)"
    )
    root = Path(tempfile.mkdtemp(prefix="talkloop-docker-"))
    d = Daemon(root)
    try:
        if not d.start("overlay2"):
            warnings.warn(
                "no overlay2 here: Docker runs on vfs, several times slower", stacklevel=1
            )
            assert d.start("vfs"), (root / "dockerd-vfs.log").read_text()[-3000:]
        yield d
    finally:
        try:
            d.stop()
            left = leftover_processes(root)
            for pid in left:
                os.kill(pid, 9)
            assert not left, f"processes of the test's dockerd outlived it: {left}"
        finally:
            shutil.rmtree(root, ignore_errors=True)


def debian_mirror() -> str:
    """The mirror of bookworm (or the first Debian suite) apt uses here."""
    stanzas: list[tuple[list[str], list[str]]] = []  # (uris, suites)
    apt = Path("/etc/apt")
    for path in sorted(apt.glob("sources.list.d/*.sources")):
        for block in path.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in block.splitlines() if ":" in line and line[0] != "#"
            )
            fields = {k.strip(): v.split() for k, v in fields.items()}
            if "deb" in fields.get("Types", []) and fields.get("Enabled", ["yes"]) != ["no"]:
                stanzas.append((fields.get("URIs", []), fields.get("Suites", [])))
    for path in [apt / "sources.list", *sorted(apt.glob("sources.list.d/*.list"))]:
        for line in path.read_text().splitlines() if path.is_file() else []:
            words = [w for w in line.split("#")[0].split() if not w.startswith("[")]
            if len(words) >= 3 and words[0] == "deb":
                stanzas.append(([words[1]], [words[2]]))
    for uris, suites in stanzas:
        if "bookworm" in suites and uris:
            return uris[0]
    for uris, suites in stanzas:  # another release's mirror serves bookworm too
        if uris and "debian" in uris[0] and not any("security" in s for s in suites):
            return uris[0]
    return "http://deb.debian.org/debian"


def base_tarball(work: Path) -> Path:
    """A minbase bookworm root file system as a tarball, debootstrapped once and cached."""
    cached = CACHE / "bookworm-minbase.tar"
    if cached.is_file():
        return cached
    rootfs = work / "rootfs"
    run([DEBOOTSTRAP, "--variant=minbase", "bookworm", str(rootfs), debian_mirror()], timeout=900)
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".partial")
    run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], timeout=300)
    partial.rename(cached)
    shutil.rmtree(rootfs, ignore_errors=True)
    return cached


def pip_settings() -> dict[str, str]:
    """This machine's pip settings (config files and PIP_* variables), by option name."""
    out = run([sys.executable, "-m", "pip", "config", "list"]).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():  # e.g. global.cert='/etc/ssl/certs/ca-certificates.crt'
        key, _, value = line.partition("=")
        found[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
    for key, value in os.environ.items():
        if key.startswith("PIP_"):
            found[key[4:].lower().replace("_", "-")] = value
    return found


def build_context(ctx: Path) -> None:
    """This tree plus wheels/ (the CPU torch this machine installs) and pip/ (its index, CA
    certificate and timeout: what pip needs to reach PyPI from here; nothing else)."""
    source_copy(ctx)
    import torch

    if torch.version.cuda is None and "+cpu" in torch.__version__:
        wheels = ctx / "wheels"
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        run([*cmd, "-d", str(wheels), f"torch=={torch.__version__}"], timeout=600)
    settings = pip_settings()
    lines = ["[global]"]
    for key in ("index-url", "extra-index-url"):
        urls = [u for u in settings.get(key, "").split() if u.startswith(("http:", "https:"))]
        if urls:
            lines.append(f"{key} = {' '.join(urls)}")
    if settings.get("cert"):
        (ctx / "pip").mkdir()
        shutil.copy(settings["cert"], ctx / "pip" / "ca.pem")
        lines.append("cert = /src/pip/ca.pem")
    if settings.get("default-timeout") or settings.get("timeout"):
        lines.append(f"timeout = {settings.get('default-timeout') or settings.get('timeout')}")
    if len(lines) > 1:
        (ctx / "pip").mkdir(exist_ok=True)
        (ctx / "pip" / "pip.conf").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def image(daemon: Daemon) -> str:
    t0 = time.monotonic()
    work = daemon.root / "work"
    work.mkdir()
    tarball = base_tarball(work)
    with open(tarball, "rb") as f:
        daemon.docker("import", "-", BASE, stdin=f)
    t_base = time.monotonic()
    ctx = work / "context"
    build_context(ctx)
    log = daemon.root / "build.log"
    cmd = ["build", "--network", "host", "--progress", "plain", "--build-arg", f"BASE={BASE}"]
    try:
        proc = daemon.docker(*cmd, "-t", IMAGE, str(ctx), timeout=1200)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    log.write_text(proc.stdout + proc.stderr)
    size = int(daemon.docker("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout)
    print(
        f"\nimage {IMAGE} ({daemon.driver}): {size / 1e9:.2f} GB; base {t_base - t0:.0f} s, "
        f"build {time.monotonic() - t_base:.0f} s"
    )
    return IMAGE


def test_image_settings(daemon: Daemon, image: str) -> None:
    config = json.loads(daemon.docker("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == "talkloop"
    assert "8080/tcp" in config["ExposedPorts"]
    assert "/healthz" in " ".join(config["Healthcheck"]["Test"])
    assert "talkloop serve --host" in " ".join(config["Cmd"])
    assert "/opt/talkloop/bin" in next(e for e in config["Env"] if e.startswith("PATH="))


def test_render_from_a_mounted_wav(daemon: Daemon, image: str) -> None:
    io = daemon.root / "io"
    io.mkdir()
    io.chmod(0o777)  # the container's user (uid 10001) writes the mp4 here
    shutil.copy(HELLO, io / "in.wav")
    cmd = ["run", "--rm", "--network", "none", "-v", f"{io}:/data", image]
    proc = daemon.docker(
        *cmd, "talkloop", "render", "--audio", "/data/in.wav", "--out", "/data/out.mp4"
    )
    assert "wrote" in proc.stdout, proc.stdout
    assert (io / "out.mp4").stat().st_uid == 10001  # written by the image's non-root user
    check_mp4(io / "out.mp4", wav_seconds(HELLO))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_healthy_as_non_root(daemon: Daemon, image: str) -> None:
    port = free_port()
    env = ["-e", "TALKLOOP_HOST=127.0.0.1", "-e", f"TALKLOOP_PORT={port}"]
    # The image's own CMD (talkloop serve), on this machine's loopback only.
    cid = daemon.docker("run", "-d", "--network", "host", *env, image).stdout.strip()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # a bound against a hang only, not a speed judged
        while True:
            state = json.loads(daemon.docker("inspect", cid).stdout)[0]["State"]
            assert state["Running"], daemon.docker("logs", cid).stderr[-3000:]
            try:
                if http_get(f"{base}/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server never answered /healthz (hung?)"
            time.sleep(0.5)
        status, ctype, body = http_get(f"{base}/")
        assert status == 200 and ctype.startswith("text/html") and b'src="app.js"' in body
        assert http_get(f"{base}/app.js")[0] == 200
        assert daemon.docker("exec", cid, "id", "-u").stdout.strip() == "10001"
        uids = daemon.docker("exec", cid, "grep", "^Uid:", "/proc/1/status").stdout.split()[1:]
        assert uids and "0" not in uids, uids  # the server itself, not only `docker exec`
        # Where named volumes go (docs/container.md): the user's, so volumes there are too.
        folders = ["/data", "/home/talkloop/.config/talkloop", "/home/talkloop/.cache/talkloop"]
        owners = daemon.docker("exec", cid, "stat", "-c", "%u", *folders).stdout.split()
        assert owners == ["10001"] * 3, owners
        # HEALTHCHECK: first probe 15 s after the start, healthy on its first success.
        deadline = time.monotonic() + 600  # a bound against a hang only
        while (health := state["Health"]["Status"]) != "healthy":
            assert health != "unhealthy" and time.monotonic() < deadline, state["Health"]
            time.sleep(1)
            state = json.loads(daemon.docker("inspect", cid).stdout)[0]["State"]
        daemon.docker("stop", "-t", "30", cid)  # SIGTERM
        state = json.loads(daemon.docker("inspect", cid).stdout)[0]["State"]
        logs = daemon.docker("logs", cid)
        assert state["ExitCode"] == 0, logs.stderr[-3000:]
        assert "talkloop: stopped" in logs.stdout and "Traceback" not in logs.stderr
    finally:
        subprocess.run(
            [DOCKER, "-H", f"unix://{daemon.sock}", "rm", "-f", cid], capture_output=True
        )
