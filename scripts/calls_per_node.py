"""Calls per node: how many live calls at once one machine carries before late frames pass 1 %.

For n = 1 .. --max-calls: `talkloop serve --max-sessions n` on the bundled default avatar (the
shipped portrait model, or --family studio) and n scripted calls at once, each client in its own
process as a browser would be, but on the same cores as the server (say so when quoting: the
clients' decoding takes CPU a real node would not spend). A cluster node with n slots runs its
calls with this same code (talkloop/rtc/call_host.py hosts AvatarServer's call), so it carries what this
server carries.

Reports, per call, the server's last stats message: frames sent, late frames (not generated in
time: the last frame repeated), overrun frames (the sender missed the slot), skipped frames (whole
chunks dropped to keep the lag bounded), and the rate frames arrived at the client.

Run as root inside a private network namespace (the calls stay on loopback):

    unshare -n sh -c 'ip link set lo up && ip addr add 127.0.0.2/8 dev lo && exec "$0" "$@"' \\
      .venv/bin/python scripts/calls_per_node.py --max-calls 2 --seconds 60 --out /tmp/cpn
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from talkloop.rtc.client import wait_serving  # noqa: E402

HOST = "127.0.0.2"


def one_call(data: dict) -> dict:
    stats = data["stats"][-1] if data["stats"] else {}
    t = data["video_times"]
    sent = stats.get("frames_sent") or 0
    overrun = stats.get("overrun_frames") or 0
    late = stats.get("late_frames") or 0
    slots = sent + overrun
    return {
        "frames_sent": sent,
        "late_frames": late,
        "overrun_frames": overrun,
        "skipped_frames": stats.get("skipped_frames"),
        "rtf": stats.get("rtf"),
        # every frame slot of the call that did not show a new frame on time
        "late_pct": round(100 * (late + overrun) / slots, 2) if slots else None,
        "arrival_fps": round((len(t) - 1) / (t[-1] - t[0]), 2) if len(t) > 1 else 0.0,
        "errors": data["errors"],
    }


def run(n: int, seconds: float, family: list[str], out: Path) -> dict:
    port = 8100 + n
    cmd = [
        sys.executable,
        "-m",
        "talkloop.pipeline.cli",
        "serve",
        "--host",
        HOST,
        "--port",
        str(port),
    ]
    cmd += ["--max-sessions", str(n), *family]
    log = open(out / f"serve-{n}.log", "w")  # noqa: SIM115 (open for the server's lifetime)
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_serving(f"http://{HOST}:{port}", server, timeout=300)
        url = f"ws://{HOST}:{port}/ws"
        files = [out / f"call-{n}-{i}.json" for i in range(n)]
        clients = [
            subprocess.Popen(
                [sys.executable, "-m", "talkloop.rtc.client", url, str(seconds), str(f)], cwd=ROOT
            )
            for f in files
        ]
        for c in clients:
            c.wait(timeout=seconds + 300)
        calls = [one_call(json.loads(f.read_text())) for f in files]
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    return {"calls": n, "per_call": calls, "worst_late_pct": max(c["late_pct"] or 0 for c in calls)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-calls", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--family", choices=("portrait", "studio"), default=None)
    ap.add_argument("--out", type=Path, default=Path("calls-per-node"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    family = ["--family", args.family] if args.family else []
    rows = []
    for n in range(1, args.max_calls + 1):
        row = run(n, args.seconds, family, args.out)
        rows.append(row)
        for i, c in enumerate(row["per_call"]):
            print(
                f"{n} call(s), call {i + 1}: {c['late_pct']} % late or missed "
                f"({c['late_frames']} late, {c['overrun_frames']} overrun of "
                f"{c['frames_sent'] + c['overrun_frames']} slots), skipped {c['skipped_frames']}, "
                f"arrival {c['arrival_fps']} fps, rtf {c['rtf']}, errors {len(c['errors'])}",
                flush=True,
            )
    (args.out / "calls_per_node.json").write_text(json.dumps(rows, indent=2))
    ok = [r["calls"] for r in rows if r["worst_late_pct"] <= 1.0]
    print(f"calls per node with <= 1 % late frames: {max(ok) if ok else 0}")


if __name__ == "__main__":
    main()
