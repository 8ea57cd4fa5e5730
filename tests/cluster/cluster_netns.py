"""Run a cluster scenario in a private network namespace (loopback only), as tests/rtc/netns.py
does for single-process calls: `unshare -n`, lo up, 127.0.0.2 added (aioice never offers
127.0.0.1). The Ray nodes bind to 127.0.0.1 inside it; nothing leaves the namespace, and every
Ray process dies with the scenario (it shuts its cluster down; the namespace's end kills what
is left). The script prints one line `RESULT <json>`; that JSON is returned.
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
SETUP = 'ip link set lo up && ip addr add 127.0.0.2/8 dev lo && exec "$0" "$@"'


def run_cluster_scenario(script: str, *args: str, timeout: float = 400) -> dict:
    pytest.importorskip("ray", reason="the cluster tests need ray (pip install 'talkloop[test]')")
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("cluster tests need root with unshare and ip to make a private network")
    # --kill-child: when the scenario ends (or times out), every process left in the namespace
    # gets SIGKILL, so no Ray process outlives a test.
    cmd = ["unshare", "-n", "--fork", "--pid", "--mount-proc", "--kill-child", "sh", "-c", SETUP]
    cmd += [sys.executable, str(SCENARIOS / script), *args]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as err:  # its progress lines say where it stopped
        said = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else ""
        raise AssertionError(
            f"scenario {script} ran past {timeout:.0f} s:\n{said[-6000:]}"
        ) from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"scenario {script} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n"
            f"{proc.stderr[-4000:]}"
        )
    return json.loads(lines[-1][len("RESULT ") :])
