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
sys.path.insert(0, str(ROOT))

from talkloop.pipeline.cluster.connect import token_auth_env  # noqa: E402
from talkloop.rtc.client import run_call, wait_serving  # noqa: E402

HEAD, WORKER, FRONT = "127.0.0.1", "127.0.0.2", "127.0.0.2"
GCS_PORT, FRONT_PORT = 6390, 8091
TALKLOOP = [sys.executable, "-m", "talkloop.pipeline.cli"]
TINY = ["--family", "studio", "--untrained", "--preset", "tiny", "--size", "64"]
TINY += ["--steps", "2", "--backend", "torch"]


def note(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


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
    front = None
    try:
        talkloop("worker", "--head", "--port", str(GCS_PORT), "--slots", "0", "--num-cpus", "0",
                 "--node-ip-address", HEAD)  # fmt: skip
        talkloop("worker", "--address", f"{HEAD}:{GCS_PORT}", "--slots", "1", "--num-cpus", "1",
                 "--node-ip-address", WORKER)  # fmt: skip
        result["nodes"] = slot_nodes()
        cmd = [*TALKLOOP, "serve", "--cluster", f"{HEAD}:{GCS_PORT}", "--host", FRONT]
        cmd += ["--port", str(FRONT_PORT), *TINY]
        front = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        base = f"http://{FRONT}:{FRONT_PORT}"
        result["front_ready_s"] = wait_serving(base, front, timeout=120)
        note("front up; calling")
        mic = np.zeros(16000 * int(args.seconds + 5), np.float32)
        call = asyncio.run(run_call(f"ws://{FRONT}:{FRONT_PORT}/ws", args.seconds, mic=mic))
        result["call"] = {**call.summary(), "video_pts": call.video_pts}
        result["session"] = call.session
        result["stats"] = call.stats[-1] if call.stats else {}
    finally:
        if front is not None:
            front.terminate()
            try:
                out, _ = front.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                front.kill()
                out, _ = front.communicate()
            result["front_rc"] = front.returncode
            result["front_output"] = out[-3000:]
        env = {**os.environ, "RAY_ADDRESS": ""}
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"],
                       capture_output=True, timeout=60, env=env)  # fmt: skip
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
