"""The cluster subcommands: `talkloop render-batch` and `talkloop worker` (docs/scaling.md)."""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from talkloop.pipeline.args import (
    add_model_args,
    add_video_args,
    config_from_args,
    parse_size,
    serve_flags,
)
from talkloop.pipeline.bench.calls import measured_capacity
from talkloop.pipeline.cluster.batch import TASK_MEMORY_MB, run_batch, write_summary
from talkloop.pipeline.cluster.connect import (
    CALL_NAMESPACE,
    SLOT,
    connect,
    disconnect,
    import_ray,
    token_auth_env,
)
from talkloop.pipeline.cluster.manifest import read_manifest
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.spec import DEFAULT_FAMILY, family_names

EXIT_ROWS_FAILED = 1
EXIT_INTERRUPTED = 130
CLUSTER_HELP = (
    "auto (the Ray cluster this machine belongs to, else a local one), ray://HOST:PORT or "
    "HOST:PORT (a head's address)"
)


def add_cluster_parsers(sub: argparse._SubParsersAction) -> None:

    b = sub.add_parser(
        "render-batch",
        help="render every row of a CSV/JSONL manifest to an mp4, as Ray tasks across a cluster",
    )
    b.add_argument(
        "manifest",
        type=Path,
        help="CSV with a header row or JSONL; keys audio (required), reference, prompt, family, "
        "out (output stem, default the audio's); relative paths are the manifest folder's",
    )
    b.add_argument("--out", type=Path, required=True, help="output folder (made if missing)")
    b.add_argument("--cluster", default=None, help=CLUSTER_HELP + "; default: a local instance")
    b.add_argument(
        "--memory-mb",
        type=int,
        default=None,
        help="memory each row's task reserves on its node (default 3000)",
    )
    b.add_argument("--preview", action="store_true", help="fast draft: 2 steps, fastest encoder")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    add_video_args(b)
    add_model_args(b)

    w = sub.add_parser(
        "worker",
        help="join this machine to a talkloop Ray cluster (a thin wrapper over `ray start`)",
    )
    w.add_argument("--address", help="the head's HOST:PORT (what `ray start --head` printed)")
    w.add_argument(
        "--head", action="store_true", help="start the head node here instead (--port, --slots)"
    )
    w.add_argument("--port", type=int, default=6379, help="the head's GCS port (with --head)")
    w.add_argument(
        "--slots",
        type=parse_slots,
        default=1,
        help="live calls this node runs at once, or auto: the calls per node `talkloop bench "
        "--calls N` measured on this CPU for --family",
    )
    w.add_argument(
        "--family",
        choices=family_names(),
        default=None,
        help=f"with --slots auto: the family whose measured capacity it takes (default "
        f"{DEFAULT_FAMILY})",
    )
    w.add_argument(
        "--size",
        type=parse_size,
        default=None,
        help="with --slots auto: the frame size of the calls this node serves, as `talkloop "
        "bench --calls` measured it (default: the family's default size)",
    )
    w.add_argument("--num-cpus", type=int, default=None, help="CPUs offered to batch renders")
    w.add_argument(
        "--node-ip-address", default=None, help="this node's address as the others reach it"
    )
    w.add_argument("--block", action="store_true", help="stay in the foreground (containers)")
    w.add_argument(
        "--drain",
        action="store_true",
        help="drain a node instead: it takes no new calls or rows, its calls finish; waits until "
        "it is idle (--node-id, default the node at --node-ip-address or this machine's)",
    )
    w.add_argument("--node-id", default=None, help="the node to drain (hex, as ray status shows)")
    w.add_argument(
        "--wait-s", type=float, default=None, help="with --drain: wait at most this long for idle"
    )


def cmd_cluster(args: argparse.Namespace) -> int:
    if args.command == "render-batch":
        return cmd_render_batch(args)
    return cmd_drain(args) if args.drain else cmd_worker(args)


# -- render-batch ---------------------------------------------------------------------------------


def cmd_render_batch(args: argparse.Namespace) -> int:

    rows = read_manifest(args.manifest)  # a bad manifest stops here, before Ray starts
    memory_mb = TASK_MEMORY_MB if args.memory_mb is None else args.memory_mb
    if memory_mb < 100:
        raise ConfigError(f"--memory-mb must be at least 100, got {memory_mb}")
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out must be a folder, got the file {args.out}")
    args.out.mkdir(parents=True, exist_ok=True)
    configs: dict[str | None, dict] = {}

    def config_for(family: str | None) -> dict:
        if family not in configs:
            ns = copy.copy(args)
            ns.family = family or args.family
            configs[family] = config_from_args(ns).model_dump(mode="json")
        return configs[family]

    for row in rows:  # a bad flag for any family the rows name fails now, not in every task
        config_for(row.family)
    where = connect(args.cluster)
    try:
        if not args.quiet:
            print(f"talkloop: rendering {len(rows)} rows on {where}", file=sys.stderr)
        summary = run_batch(
            rows, args.out, config_for, memory_mb=memory_mb, progress=not args.quiet
        )
    finally:
        disconnect()
    path = write_summary(args.out, summary)
    c = summary.counts()
    print(
        f"talkloop: {c['ok']} rendered, {c['skipped']} skipped (complete already), "
        f"{c['failed']} failed in {summary.wall_seconds:.1f} s; summary: {path}"
    )
    if summary.interrupted:
        print("talkloop: interrupted: run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_ROWS_FAILED if c["failed"] else 0


# -- worker ---------------------------------------------------------------------------------------


def auto_slots(args: argparse.Namespace) -> tuple[int, list[str]]:
    """``--slots auto``: the calls per node ``talkloop bench --calls`` measured on this CPU for
    the worker's ``--family`` at its ``--size``, and the serve flags it was measured with."""
    measured_for = copy.copy(args)
    measured_for.family = args.family or DEFAULT_FAMILY
    flags = serve_flags(measured_for)
    measured = measured_capacity(flags)
    if not measured:
        raise ConfigError(
            f"--slots auto: no calls per node measured on this CPU for `talkloop serve "
            f"{' '.join(flags)}` (or it carried none); measure it with `talkloop bench --calls 6 "
            f"{' '.join(flags)}` (docs/scaling.md), or give --slots N"
        )
    return measured, flags


def parse_slots(text: str) -> int | str:
    """``--slots``: a count, or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--slots takes a number or auto, got {text!r}") from None


def ray_command(*args: str) -> list[str]:
    """The ``ray`` CLI of this Python (the venv's, whatever PATH says)."""

    import_ray()
    return [sys.executable, "-m", "ray.scripts.scripts", *args]


def cmd_worker(args: argparse.Namespace) -> int:

    given = [flag for flag in ("family", "size") if getattr(args, flag) is not None]
    if given and args.slots != "auto":
        raise ConfigError(
            f"--{given[0]} picks the measured figure --slots auto takes; with --slots N it would "
            "do nothing (the front's `talkloop serve` flags set the calls' family and size)"
        )
    if args.slots == "auto":
        args.slots, flags = auto_slots(args)
        print(
            f"talkloop worker: {args.slots} slots (calls per node measured here, {' '.join(flags)})"
        )
    if args.slots < 0:
        raise ConfigError(f"--slots must be 0 or more, got {args.slots}")
    if args.head == bool(args.address):
        raise ConfigError("give --address HEAD:PORT to join a cluster, or --head to start one")
    opts = [f"--resources={json.dumps({SLOT: args.slots})}", "--disable-usage-stats"]
    if args.head:
        opts += ["--head", f"--port={args.port}", "--include-dashboard=false"]
    else:
        opts.append(f"--address={args.address}")
    if args.num_cpus is not None:
        opts.append(f"--num-cpus={args.num_cpus}")
    if args.node_ip_address:
        opts.append(f"--node-ip-address={args.node_ip_address}")
    if args.block:
        opts.append("--block")

    return subprocess.call(ray_command("start", *opts), env=token_auth_env(dict(os.environ)))


def cmd_drain(args: argparse.Namespace) -> int:
    """Ask the head to drain one node (Ray's drain API), then wait until it is idle."""

    if not args.address or args.address.startswith("ray://"):
        raise ConfigError("--drain needs --address HEAD:PORT (the head's GCS address)")
    os.environ.update(token_auth_env(dict(os.environ)))  # before Ray reads its configuration
    ray = import_ray()
    from ray.core.generated import autoscaler_pb2

    ray.init(address=args.address, logging_level="WARNING", log_to_driver=False)
    try:
        alive = [n for n in ray.nodes() if n["Alive"]]
        node_id = args.node_id
        if node_id is None:
            ip = args.node_ip_address or ray.util.get_node_ip_address()
            here = [n for n in alive if n["NodeManagerAddress"] == ip and not _is_head(n)]
            if len(here) != 1:
                raise ConfigError(
                    f"{len(here)} worker nodes at {ip}: name the one to drain with --node-id "
                    f"({', '.join(n['NodeID'] for n in alive)})"
                )
            node_id = here[0]["NodeID"]
        node = next((n for n in alive if n["NodeID"] == node_id), None)
        if node is None:
            raise ConfigError(f"no live node {node_id} in the cluster at {args.address}")
        gcs = ray._raylet.GcsClient(address=args.address)
        accepted, why = gcs.drain_node(
            node_id,
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "talkloop worker --drain",
            0,
        )
        if not accepted:
            raise ConfigError(f"Ray refused to drain node {node_id}: {why}")
        print(f"talkloop: draining node {node_id}: it takes no new calls or rows", flush=True)
        total = node["Resources"]
        t0 = time.monotonic()
        while True:
            _stop_warm_actors(ray, node_id)
            free = ray._private.state.available_resources_per_node().get(node_id, {})
            busy = [k for k in (SLOT, "CPU") if free.get(k, 0) < total.get(k, 0)]
            if not busy:
                print(f"talkloop: node {node_id} is idle; stop it with `ray stop` on that machine")
                return 0
            if args.wait_s is not None and time.monotonic() - t0 > args.wait_s:
                print(f"talkloop: node {node_id} still busy after {args.wait_s:g} s", flush=True)
                return EXIT_ROWS_FAILED
            time.sleep(1.0)
    finally:
        ray.shutdown()


def _stop_warm_actors(ray, node_id: str) -> None:
    """Stop the call actors waiting for a page on ``node_id`` (a front keeps one warm while
    slots are free): they hold a slot but no call, and the node would never be idle. A front
    that hands one to a page just then places the page elsewhere."""

    for info in ray.util.list_named_actors(all_namespaces=True):
        if info.get("namespace") != CALL_NAMESPACE:
            continue
        try:
            actor = ray.get_actor(info["name"], namespace=CALL_NAMESPACE)
            if ray.get(actor.idle_on.remote(), timeout=5) == node_id:
                ray.kill(actor, no_restart=True)
        except Exception:  # gone meanwhile, or busy: not a waiting actor
            continue


def _is_head(node: dict) -> bool:
    return "node:__internal_head__" in node.get("Resources", {})
