"""Run a scenario script inside a private network namespace (loopback only).

aioice never offers 127.0.0.1 as an ICE candidate, so WebRTC needs another address. As root,
`unshare -n` gives the script a namespace of its own where `lo` is brought up and 127.0.0.2 is
added: that is the only candidate, both peers use it, and no packet leaves the namespace.
The script prints one line `RESULT <json>`; that JSON is returned.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIOS = Path(__file__).parent / "scenarios"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"  # screenshots, kept for a look
needs_chromium = pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists(), reason="needs Debian's chromium"
)
SETUP = 'ip link set lo up && ip addr add 127.0.0.2/8 dev lo && exec "$0" "$@"'


def artifact(name: str) -> Path:
    """A fresh path in artifacts/ (an earlier run's file of that name removed)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    path.unlink(missing_ok=True)
    return path


def run_in_netns(script: str, *args: str, timeout: float = 300) -> dict:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip(
            "WebRTC tests need root with unshare and ip to make a private network namespace"
        )
    cmd = ["unshare", "-n", "sh", "-c", SETUP, sys.executable, str(SCENARIOS / script), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"scenario {script} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return json.loads(lines[-1][len("RESULT ") :])
