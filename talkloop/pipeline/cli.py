"""The ``talkloop`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from talkloop.pipeline.args import (
    add_model_args,
    add_video_args,
    config_from_args,
)
from talkloop.pipeline.bench.run import add_bench_args, add_live_args, cmd_bench
from talkloop.pipeline.cluster.cli import add_cluster_parsers, cmd_cluster
from talkloop.pipeline.console import LOG_FORMAT, quiet_for
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.core.errors import ConfigError, TalkloopError
from talkloop.pipeline.offload.distributed import is_publisher
from talkloop.pipeline.outputs.kvs.args import add_kvs_args, check_kvs_args, kvs_sink_from_args
from talkloop.pipeline.outputs.kvs.args import add_kvs_args as add_serve_kvs_args
from talkloop.pipeline.render import check_output_path, render_file
from talkloop.pipeline.synth.cli import add_synth_parser, cmd_synth
from talkloop.pipeline.train.cli import add_eval_parser, add_train_parser, cmd_eval, cmd_train
from talkloop.rtc.app import (
    check_max_calls,
    live_config_dict,
    load_avatar,
    resolve_weights,
    serve_forever,
)
from talkloop.rtc.args import add_serving_args, serving_from_args
from talkloop.rtc.call import CallConfig

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="talkloop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    r = sub.add_parser("render", help="render an audio file to an mp4 of the avatar speaking")
    r.add_argument("--audio", required=True, help="driving audio (wav, flac, mp3, ogg, m4a, video)")
    r.add_argument("--out", required=True, help="output .mp4")
    r.add_argument("--reference", help="avatar image (PNG/JPEG); default: the bundled avatar")
    r.add_argument("--prompt", default="", help='style text, e.g. "calm, friendly, nods a lot"')
    add_video_args(r)
    r.add_argument("--preview", action="store_true", help="fast draft: 2 steps, fastest encoder")
    r.add_argument(
        "--quiet", action="store_true", help="no progress bar (there is none off a terminal)"
    )
    r.add_argument(
        "-v", "--verbose", action="store_true", help="show library logs and warnings, INFO logs"
    )
    add_model_args(r)

    add_kvs_args(r)

    sv = sub.add_parser("serve", help="serve live avatar calls in the browser (WebRTC)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8080)
    sv.add_argument("--reference", help="avatar image; default: the bundled avatar")
    sv.add_argument("--prompt", default="", help="initial style prompt of each session")
    sv.add_argument(
        "--max-calls",
        "--max-sessions",  # its first name, documented and in scripts: kept as an alias
        dest="max_calls",
        type=int,
        default=1,
        metavar="N",
        help="concurrent calls at most (--max-sessions N: the same)",
    )
    sv.add_argument(
        "--cluster",
        default=None,
        help="run each call on a Ray cluster's worker node: auto (this machine's cluster, else a "
        "local one with --max-calls slots), ray://HOST:PORT or HOST:PORT (docs/scaling.md)",
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

    add_serve_kvs_args(sv)

    add_serving_args(sv)

    b = sub.add_parser("bench", help="measure ttff, rtf, fps and memory against a naive baseline")

    add_bench_args(b)
    add_live_args(b)
    add_video_args(b)
    add_model_args(b)

    add_synth_parser(sub)

    add_train_parser(sub)
    add_eval_parser(sub)

    add_cluster_parsers(sub)
    return parser


def cmd_render(args: argparse.Namespace) -> int:

    config = config_from_args(args)
    check_output_path(args.out)

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

    if is_publisher():  # under torchrun every rank renders; only rank 0 wrote the file
        print(f"wrote {what} in {result.wall_seconds:.1f} s (rtf {result.rtf:.2f})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:

    logging.basicConfig(format=LOG_FORMAT)  # the levels: console.quiet (main)
    if args.max_calls < 1:
        raise ConfigError(f"--max-calls must be at least 1, got {args.max_calls}")
    serving = serving_from_args(args)  # TLS, token, origins: refused now, before loading
    args.untrained, notice = resolve_weights(args.untrained, args.weights, args.family)
    base = config_from_args(args).model_dump(mode="json")
    base.pop("schedule")
    config = build_config(**live_config_dict(base, sampler_given=args.steps is not None))
    check_max_calls(config, args.max_calls)
    reference = load_avatar(args.reference, config)
    flags = {"playout_delay_ms": args.playout_delay_ms, "max_lag_ms": args.max_lag_ms}
    try:
        call_config = CallConfig(**{k: v for k, v in flags.items() if v is not None})
    except ValueError as err:  # pydantic's ValidationError: say which flag and value are wrong
        bad = err.errors()[0]
        flag = "--" + str(bad["loc"][0]).replace("_", "-")
        raise ConfigError(f"{flag}: {bad['msg']}, got {bad['input']}") from None
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server installs its own handlers

    # Bad --kvs-* flags, or one stream for several sessions, fail now, before the server starts.
    check_kvs_args(args, args.max_calls)

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
            args.max_calls,
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``talkloop`` with ``argv`` (default: the process's arguments)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    words = list(sys.argv[1:] if argv is None else argv)
    with quiet_for(words):
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
            return cmd_bench(args, config_from_args(args))
        if args.command == "synth":
            return cmd_synth(args)
        if args.command in ("render-batch", "worker"):
            return cmd_cluster(args)
        if args.command in ("train", "eval"):
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
