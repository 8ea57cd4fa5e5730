"""The command-line arguments every ``talkloop`` subcommand shares (video, model) and the config
they make; each subcommand's own arguments are next to its command."""

from __future__ import annotations

import argparse
from pathlib import Path

from talkloop.pipeline.core.config import TalkloopConfig, build_config
from talkloop.pipeline.models.spec import DEFAULT_FAMILY, family_names, get_spec, specs


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
        help="what runs the family's hot networks: torch, or graphs exported from the same "
        "weights (cached in ~/.cache/talkloop) on ONNX Runtime or OpenVINO; auto: the fastest "
        "here, timed once and cached"
        + "".join(
            f". {n} runs torch and ignores it" for n, f in specs().items() if len(f.backends) == 1
        ),
    )
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where networks run")
    g.add_argument(
        "--render-processes",
        type=int,
        default=None,
        metavar="N",
        help="worker processes that render the frames of every session of this process (a "
        "family whose renderer takes them); 0: each session's own thread. Default: one per "
        "core for live calls (serve), 0 for a render",
    )
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


def config_from_args(args: argparse.Namespace) -> TalkloopConfig:
    """The root config of the shared video and model arguments (and ``--preview``)."""
    family = getattr(args, "family", DEFAULT_FAMILY)
    width, height = getattr(args, "size", None) or get_spec(family).native_sizes[0]
    sampler: dict[str, object] = dict(get_spec(family).sampler)
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
            "render_processes": getattr(args, "render_processes", None),
            "placement": getattr(args, "placement", {}),
        },
        seed=getattr(args, "seed", 0),
    )


def serve_flags(args: argparse.Namespace) -> list[str]:
    """The ``talkloop serve`` flags that give its calls the video and model arguments in
    ``args`` (and its ``playout_delay_ms``, where it has one): the family and the frame size
    always (the family's default size where ``args`` names none), any other flag only where it
    differs from its default. ``args`` may lack any of them (``talkloop worker`` has only
    ``--family`` and ``--size``); a missing one counts as its default.

    ``talkloop bench --calls`` starts its servers with these, and keys the calls per node it
    measured by them (``talkloop worker --slots auto`` looks the figure up the same way).
    """
    defaults = argparse.ArgumentParser()
    add_video_args(defaults)
    add_model_args(defaults)
    default = vars(defaults.parse_args([]))
    value = {dest: getattr(args, dest, default[dest]) for dest in default}
    family = value["family"]
    width, height = value["size"] or get_spec(family).native_sizes[0]
    flags = ["--family", family, "--size", f"{width}x{height}"]
    for dest in ("fps", "steps", "seed", "preset", "dtype", "backend", "device"):
        if value[dest] != default[dest]:
            flags += [f"--{dest}", str(value[dest])]
    if value["weights"] is not None:
        flags += ["--weights", str(Path(value["weights"]).resolve())]
    if value["untrained"]:
        flags.append("--untrained")
    if value["render_processes"] is not None:
        flags += ["--render-processes", str(value["render_processes"])]
    if value["placement"]:
        flags += ["--placement", ",".join(f"{k}={v}" for k, v in value["placement"].items())]
    playout = getattr(args, "playout_delay_ms", None)
    if playout is not None:
        flags += ["--playout-delay-ms", str(playout)]
    return flags
