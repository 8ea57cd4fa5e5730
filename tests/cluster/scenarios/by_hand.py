"""The cluster as docs/scaling.md sets it up by hand, every part its own process: a head started
with `talkloop worker --head` (no call slots) on 127.0.0.1, a worker node joined with
`talkloop worker --address` (one slot) on 127.0.0.2, which stands in for another machine, and a
front started as its own command, `talkloop serve --cluster HOST:PORT`. A scripted page calls
the front. Runs inside a private network namespace (tests/cluster/cluster_netns.py).

Prints RESULT with what the page saw, where its call ran, and the front's output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from talkloop.pipeline.cluster.connect import token_auth_env  # noqa: E402
from talkloop.rtc.client import run_call, wait_serving  # noqa: E402

from support import TALKLOOP, emit, note, serving, tiny_args  # noqa: E402

HEAD, WORKER, FRONT = "127.0.0.1", "127.0.0.2", "127.0.0.2"
GCS_PORT, FRONT_PORT = 6390, 8091
TINY = [*tiny_args(), "--steps", "2", "--backend", "torch"]


def talkloop(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*TALKLOOP, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )
    note(f"talkloop {' '.join(args)}: rc {proc.returncode}")
    if proc.returncode != 0:
        raise RuntimeError(f"talkloop {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def slot_nodes() -> dict[str, float]:
    """Each live node's address and its talkloop_slot capacity, read by a separate driver."""
    code = f"""
import json, ray
ray.init(address="{HEAD}:{GCS_PORT}", logging_level="ERROR", log_to_driver=False)
alive = [n for n in ray.nodes() if n["Alive"]]
print(json.dumps({{n["NodeManagerAddress"]: n["Resources"].get("talkloop_slot", 0) for n in alive}}))
"""
    env = token_auth_env(dict(os.environ))  # as the front joins (docs/scaling.md)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    result: dict = {}
    try:
        talkloop("worker", "--head", "--port", str(GCS_PORT), "--slots", "0", "--num-cpus", "0",
                 "--node-ip-address", HEAD)  # fmt: skip
        talkloop("worker", "--address", f"{HEAD}:{GCS_PORT}", "--slots", "1", "--num-cpus", "1",
                 "--node-ip-address", WORKER)  # fmt: skip
        result["nodes"] = slot_nodes()
        serve = ["--cluster", f"{HEAD}:{GCS_PORT}", "--host", FRONT, "--port", str(FRONT_PORT)]
        started = time.monotonic()
        with serving([*serve, *TINY], cwd=ROOT, stderr=subprocess.STDOUT, timeout=120) as front:
            try:
                wait_serving(f"http://{FRONT}:{FRONT_PORT}", front.proc, timeout=120)
                result["front_ready_s"] = time.monotonic() - started
                note("front up; calling")
                mic = np.zeros(16000 * int(args.seconds + 5), np.float32)
                url = f"ws://{FRONT}:{FRONT_PORT}/ws"
                call = asyncio.run(run_call(url, args.seconds, mic=mic))
                result["call"] = {**call.summary(), "video_pts": call.video_pts}
                result["session"] = call.session
                result["stats"] = call.stats[-1] if call.stats else {}
            finally:
                out, _ = front.stop(timeout=30)
                result["front_rc"] = front.proc.returncode
                printed = [*front.before, front.line + "\n", out]
                result["front_output"] = "".join(printed)[-3000:]
    finally:
        env = {**os.environ, "RAY_ADDRESS": ""}
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"],
                       capture_output=True, timeout=60, env=env)  # fmt: skip
    emit(result)


if __name__ == "__main__":
    main()
