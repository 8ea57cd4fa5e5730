"""Figures of docs/scaling.md: call placement time (page connect to first video frame) on a Ray
cluster against a single process, and batch throughput (media seconds per wall second) on one
and on two worker nodes. Tiny untrained studio networks at 64x64: the figures are about the
machinery, not the model.

Run as root inside a private network namespace (Ray and the calls stay on loopback):

    unshare -n --fork --pid --mount-proc --kill-child sh -c \
      'ip link set lo up && ip addr add 127.0.0.2/8 dev lo && exec "$0" "$@"' \
      .venv/bin/python scripts/cluster_figures.py --out /tmp/cluster-figures

Prints a table and writes ``OUT/figures.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # support.tiny_config, make_reference

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from talkloop.pipeline.assets import HELLO_WAV  # noqa: E402
from talkloop.pipeline.audio.io import load_audio  # noqa: E402
from talkloop.pipeline.cluster.batch import run_batch  # noqa: E402
from talkloop.pipeline.cluster.connect import SLOT  # noqa: E402
from talkloop.pipeline.cluster.manifest import read_manifest  # noqa: E402
from talkloop.pipeline.core.config import build_config  # noqa: E402
from talkloop.pipeline.models.registry import build_pipeline  # noqa: E402
from talkloop.rtc.app import live_config_dict  # noqa: E402
from talkloop.rtc.call import CallConfig  # noqa: E402
from talkloop.rtc.call_host import HostSpec  # noqa: E402
from talkloop.rtc.client import run_call  # noqa: E402
from talkloop.rtc.cluster import ClusterServer  # noqa: E402
from talkloop.rtc.ice import IceConfig  # noqa: E402
from talkloop.rtc.server import AvatarServer  # noqa: E402

from support import make_reference, tiny_config  # noqa: E402

HOST = "127.0.0.2"
SIZE = 64
NODE = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024}


def live_config() -> dict:
    base = tiny_config(
        video={"width": SIZE, "height": SIZE}, model={"backend": "torch"}
    ).model_dump(mode="json")
    base.pop("schedule")
    return build_config(**live_config_dict(base)).model_dump(mode="json")


async def placement(server, calls: int) -> list[float]:
    """Seconds from opening the page's websocket to its first video frame, calls one by one.
    On a cluster each page comes when the front has a warm actor ready (an idle cluster), except
    the first, which comes at once (the cold start: a new process loads the networks)."""
    port = await server.start(HOST, 0)
    out = []
    for i in range(calls):
        deadline = time.monotonic() + 120
        while i and hasattr(server, "idle") and not server.idle and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        t0 = time.monotonic()
        r = await run_call(f"ws://{HOST}:{port}/ws", 6.0)
        if r.errors or not r.video_times:
            raise RuntimeError(f"call failed: {r.errors}")
        out.append(r.video_times[0] - t0)
        await asyncio.sleep(1.0)  # the previous call's slot is released
    await server.stop()
    return out


def batch(folder: Path, rows: int, seconds: float) -> dict:
    speech = load_audio(HELLO_WAV, 16000)
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["audio"]
    for i in range(rows):
        with wave.open(str(folder / f"clip{i}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            x = np.resize(speech, int(16000 * seconds))
            w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
        lines.append(f"clip{i}.wav")
    (folder / "jobs.csv").write_text("\n".join(lines) + "\n")
    config = tiny_config(
        video={"width": SIZE, "height": SIZE}, model={"backend": "torch"}
    ).model_dump(mode="json")
    summary = run_batch(
        read_manifest(folder / "jobs.csv"),
        folder,
        lambda family: config,
        memory_mb=300,
        progress=False,
    )
    s = summary.to_json()
    return {k: s[k] for k in ("ok", "failed", "wall_seconds", "media_seconds")} | {
        "media_s_per_wall_s": s["media_seconds_per_wall_second"],
        "nodes": len(s["nodes"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--no-batch", action="store_true", help="placement figures only")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    figures: dict = {}
    config = live_config()
    single = AvatarServer(
        build_pipeline(build_config(**config)),
        make_reference(SIZE, SIZE),
        "",
        CallConfig(),
        1,
        ice=IceConfig(urls=[]),
    )
    figures["placement_single_s"] = asyncio.run(placement(single, args.calls))
    cluster = Cluster(
        initialize_head=True, head_node_args={**NODE, "num_cpus": 0, "include_dashboard": False}
    )
    try:
        cluster.add_node(**NODE, num_cpus=1, resources={SLOT: 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
        if not args.no_batch:
            figures["batch_1_node"] = batch(args.out / "batch1", args.rows, args.seconds)
        cluster.add_node(**NODE, num_cpus=1, resources={SLOT: 1})
        cluster.wait_for_nodes()
        if not args.no_batch:
            figures["batch_2_nodes"] = batch(args.out / "batch2", args.rows, args.seconds)
        spec = HostSpec(
            config, make_reference(SIZE, SIZE), "", CallConfig(), "", IceConfig(urls=[]), 60.0
        )
        figures["placement_cluster_s"] = asyncio.run(placement(ClusterServer(spec), args.calls))
    finally:
        ray.shutdown()
        cluster.shutdown()
    (args.out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{'figure':<36}{'value':>30}")
    single, cluster_s = figures["placement_single_s"], figures["placement_cluster_s"]
    rows = [
        ("placement_single_s", f"median {np.median(single):.2f} of {len(single)}"),
        ("placement_cluster_cold_s", f"{cluster_s[0]:.2f}"),
        (
            "placement_cluster_warm_s",
            f"median {np.median(cluster_s[1:]):.2f} of {len(cluster_s) - 1}",
        ),
    ]
    for name, text in rows:
        print(f"{name:<36}{text:>30}")
    for name in ("batch_1_node", "batch_2_nodes") if not args.no_batch else ():
        b = figures[name]
        text = f"{b['media_s_per_wall_s']:.2f} media s/wall s ({b['nodes']} node(s))"
        print(f"{name:<36}{text:>30}")


if __name__ == "__main__":
    main()
