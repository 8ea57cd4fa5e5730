"""The ``talkloop`` command line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from talkloop.pipeline.core.errors import ConfigError, TalkloopError
from talkloop.pipeline.models.spec import DEFAULT_FAMILY, family_names, get_spec, specs

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def parse_size(text: str) -> tuple[int, int]:
    """'256' or '320x256' (width x height)."""
    parts = text.lower().split("x")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"size must look like 256 or 320x256, got {text!r}"
        ) from None
    if len(nums) == 1:
        return nums[0], nums[0]
    if len(nums) == 2:
        return nums[0], nums[1]
    raise argparse.ArgumentTypeError(f"size must look like 256 or 320x256, got {text!r}")


def size_help() -> str:
    """The help of --size: each family's size rule and default size (its spec)."""
    rules = []
    for name, fam in specs().items():
        r, (w, h) = fam.size_rule, fam.native_sizes[0]
        rules.append(f"{name}: multiples of {r.step} from {r.low} to {r.high}, default {w}x{h}")
    return (
        "512 or WxH ("
        + "; ".join(rules)
        + "). Other sizes run, but the weights were not trained for them: expect a degraded, "
        "less animated face (a warning says so; README, Sizes)"
    )


def add_video_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--size",
        type=parse_size,
        default=None,
        help=size_help(),
    )
    p.add_argument("--fps", type=int, default=25)
    p.add_argument("--steps", type=int, default=None, help="A2V sampler steps (default 3)")
    p.add_argument("--seed", type=int, default=0)


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--family",
        choices=family_names(),
        default=DEFAULT_FAMILY,
        help="; ".join(f"{name}: {fam.summary}" for name, fam in specs().items()),
    )
    g.add_argument("--weights", type=Path, help="checkpoint folder (default: installed weights)")
    g.add_argument(
        "--untrained", action="store_true", help="random weights (no face: tests, benchmarks)"
    )
    g.add_argument(
        "--preset", choices=["default", "tiny", "large"], default="default", help="network sizes"
    )
    g.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="compute dtype of the torch networks (auto: float32 or bfloat16, whichever runs "
        "this family's chunks faster here, timed once and cached; float32 where bf16 is "
        "emulated)",
    )
    g.add_argument(
        "--backend",
        choices=["auto", "torch", "onnxruntime", "openvino"],
        default="auto",
        help="what runs the studio family's hot networks: torch, or graphs exported from the "
        "same weights (cached in ~/.cache/talkloop) on ONNX Runtime or OpenVINO, decoder in "
        "int8; auto: the fastest here, timed once and cached. The portrait family ignores it",
    )
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where networks run")
    g.add_argument(
        "--placement",
        type=parse_placement,
        default={},
        help="per module: resident|offloaded|sharded, e.g. a2v=offloaded,sr=sharded "
        "(sharded: run under torchrun; docs/offload.md)",
    )


def parse_placement(text: str) -> dict[str, str]:
    """'a2v=offloaded,sr=sharded' -> {"a2v": "offloaded", "sr": "sharded"}."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, mode = part.partition("=")
        if not sep or not name or not mode:
            raise argparse.ArgumentTypeError(
                f"placement must look like a2v=offloaded,sr=sharded, got {text!r}"
            )
        out[name.strip()] = mode.strip()
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="talkloop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    r = sub.add_parser("render", help="render an audio file to an mp4 of the avatar speaking")
    r.add_argument("--audio", required=True, help="driving audio (wav, flac, mp3, ogg, m4a, video)")
    r.add_argument("--out", required=True, help="output .mp4")
    r.add_argument("--reference", help="avatar image (PNG/JPEG); default: the bundled avatar")
    r.add_argument("--prompt", default="", help='style text, e.g. "calm, friendly, nods a lot"')
    r.add_argument(
        "--size",
        type=parse_size,
        default=None,
        help=size_help(),
    )
    r.add_argument("--fps", type=int, default=25)
    r.add_argument("--steps", type=int, default=None, help="A2V sampler steps (default 3)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--preview", action="store_true", help="fast draft: 2 steps, fastest encoder")
    r.add_argument(
        "--quiet", action="store_true", help="no progress bar (there is none off a terminal)"
    )
    r.add_argument(
        "-v", "--verbose", action="store_true", help="show library logs and warnings, INFO logs"
    )
    add_model_args(r)
    from talkloop.pipeline.outputs.kvs.args import add_kvs_args

    add_kvs_args(r)

    sv = sub.add_parser("serve", help="serve live avatar calls in the browser (WebRTC)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8080)
    sv.add_argument("--reference", help="avatar image; default: the bundled avatar")
    sv.add_argument("--prompt", default="", help="initial style prompt of each session")
    sv.add_argument("--max-sessions", type=int, default=1, help="concurrent calls at most")
    sv.add_argument(
        "--cluster",
        default=None,
        help="run each call on a Ray cluster's worker node: auto (this machine's cluster, else a "
        "local one with --max-sessions slots), ray://HOST:PORT or HOST:PORT (docs/scaling.md)",
    )
    sv.add_argument(
        "--playout-delay-ms",
        type=int,
        default=None,
        help="audio-to-screen delay (default: two chunks + look-ahead + 40 ms)",
    )
    sv.add_argument(
        "--max-lag-ms",
        type=int,
        default=None,
        metavar="MS",
        help="generation this far behind real time skips whole chunks to catch up, so the lag "
        "stays bounded (100-60000; default 1000, lower when a chunk could not play on time)",
    )
    sv.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log sessions and connections; show library logs and warnings",
    )
    add_video_args(sv)
    add_model_args(sv)
    from talkloop.pipeline.outputs.kvs.args import add_kvs_args as add_serve_kvs_args

    add_serve_kvs_args(sv)
    from talkloop.rtc.args import add_serving_args

    add_serving_args(sv)

    b = sub.add_parser("bench", help="measure ttff, rtf, fps and memory against a naive baseline")
    from talkloop.pipeline.bench.run import add_bench_args, add_live_args

    add_bench_args(b)
    add_live_args(b)
    add_video_args(b)
    add_model_args(b)

    from talkloop.pipeline.studio.cli import add_studio_parser

    add_studio_parser(sub)
    from talkloop.pipeline.train.cli import add_eval_parser, add_train_parser

    add_train_parser(sub)
    add_eval_parser(sub)
    from talkloop.pipeline.cluster.cli import add_cluster_parsers

    add_cluster_parsers(sub)
    return parser


def config_from_args(args: argparse.Namespace):
    from talkloop.pipeline.core.config import build_config

    family = getattr(args, "family", DEFAULT_FAMILY)
    width, height = getattr(args, "size", None) or get_spec(family).native_sizes[0]
    sampler: dict[str, object] = {}
    output: dict[str, object] = {}
    steps = getattr(args, "steps", None)
    if getattr(args, "preview", False):
        sampler["steps"] = 2 if steps is None else steps
        sampler["i_steps"] = 1
        output["preset"] = "ultrafast"
    elif steps is not None:
        sampler["steps"] = steps
    return build_config(
        video={"width": width, "height": height, "fps": getattr(args, "fps", 25)},
        sampler=sampler,
        output=output,
        model={
            "family": family,
            "preset": args.preset,
            "weights": args.weights,
            "untrained": args.untrained,
            "dtype": args.dtype,
            "backend": getattr(args, "backend", "auto"),
            "device": getattr(args, "device", "cpu"),
            "placement": getattr(args, "placement", {}),
        },
        seed=getattr(args, "seed", 0),
    )


def cmd_render(args: argparse.Namespace) -> int:
    from talkloop.pipeline.render import check_output_path, render_file

    config = config_from_args(args)
    check_output_path(args.out)
    from talkloop.pipeline.outputs.kvs.args import kvs_sink_from_args

    mirror = kvs_sink_from_args(args)  # None without --kvs-stream; bad flags fail here, early
    result = render_file(
        config,
        args.audio,
        args.out,
        args.reference,
        args.prompt,
        progress=not args.quiet,
        extra_sinks=[mirror] if mirror is not None else (),
    )
    if mirror is not None:
        print(mirror.status.line())
    what = f"{result.frames} frames ({result.media_seconds:.2f} s) to {result.path}"
    if result.interrupted:
        print(f"talkloop: interrupted: wrote {what}", file=sys.stderr)
        return EXIT_INTERRUPTED
    from talkloop.pipeline.offload.distributed import is_publisher

    if is_publisher():  # under torchrun every rank renders; only rank 0 wrote the file
        print(f"wrote {what} in {result.wall_seconds:.1f} s (rtf {result.rtf:.2f})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from talkloop.pipeline.console import LOG_FORMAT
    from talkloop.pipeline.core.config import build_config
    from talkloop.rtc.app import (
        check_sessions,
        live_config_dict,
        load_avatar,
        resolve_weights,
        serve_forever,
    )
    from talkloop.rtc.args import serving_from_args
    from talkloop.rtc.call import CallConfig

    logging.basicConfig(format=LOG_FORMAT)  # the levels: console.quiet (main)
    if args.max_sessions < 1:
        raise ConfigError(f"--max-sessions must be at least 1, got {args.max_sessions}")
    serving = serving_from_args(args)  # TLS, token, origins: refused now, before loading
    args.untrained, notice = resolve_weights(args.untrained, args.weights, args.family)
    base = config_from_args(args).model_dump(mode="json")
    base.pop("schedule")
    config = build_config(**live_config_dict(base, sampler_given=args.steps is not None))
    check_sessions(config, args.max_sessions)
    reference = load_avatar(args.reference, config)
    flags = {"playout_delay_ms": args.playout_delay_ms, "max_lag_ms": args.max_lag_ms}
    try:
        call_config = CallConfig(**{k: v for k, v in flags.items() if v is not None})
    except ValueError as err:  # pydantic's ValidationError: say which flag and value are wrong
        bad = err.errors()[0]
        flag = "--" + str(bad["loc"][0]).replace("_", "-")
        raise ConfigError(f"{flag}: {bad['msg']}, got {bad['input']}") from None
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server installs its own handlers
    from talkloop.pipeline.outputs.kvs.args import check_kvs_args, kvs_sink_from_args

    # Bad --kvs-* flags, or one stream for several sessions, fail now, before the server starts.
    check_kvs_args(args, args.max_sessions)

    def mirrors(slot: int) -> list:
        """The KVS mirror of one call, into the stream named for its slot (1..max)."""
        sink = kvs_sink_from_args(args, slot)
        return [sink] if sink is not None else []

    asyncio.run(
        serve_forever(
            config,
            reference,
            args.prompt,
            args.host,
            args.port,
            args.max_sessions,
            call_config,
            notice,
            mirror_factory=mirrors if args.kvs_stream else None,
            access=serving.access,
            ssl_context=serving.ssl_context,
            offer_timeout_s=serving.offer_timeout_s,
            notes=serving.notes,
            ice=serving.ice,
            cluster=args.cluster,
        )
    )
    return 0


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


QUIET_COMMANDS = ("render", "serve")  # library noise off unless -v (talkloop/pipeline/console.py)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    if command not in QUIET_COMMANDS:
        return _main(words)
    from talkloop.pipeline.console import quiet

    # Before the parser is built: building it imports torch, which reads its log level then.
    with quiet(verbose="-v" in words or "--verbose" in words):
        return _main(words)


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        if args.command == "render":
            return cmd_render(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "bench":
            from talkloop.pipeline.bench.run import cmd_bench

            return cmd_bench(args, config_from_args(args))
        if args.command == "studio":
            from talkloop.pipeline.studio.cli import cmd_studio

            return cmd_studio(args)
        if args.command in ("render-batch", "worker"):
            from talkloop.pipeline.cluster.cli import cmd_cluster

            return cmd_cluster(args)
        if args.command in ("train", "eval"):
            from talkloop.pipeline.train.cli import cmd_eval, cmd_train

            return cmd_train(args) if args.command == "train" else cmd_eval(args)
    except TalkloopError as err:
        print(f"talkloop: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("talkloop: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
