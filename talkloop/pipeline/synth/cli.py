"""``talkloop synth``: synthetic characters and datasets from the command line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from PIL import Image

from talkloop.pipeline.core.errors import InputError
from talkloop.pipeline.synth.character import sample_character
from talkloop.pipeline.synth.dataset import write_dataset
from talkloop.pipeline.synth.renderer import Renderer


def add_synth_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``synth character`` and ``synth dataset`` under the top-level parser."""
    s = sub.add_parser("synth", help="synthetic talking faces: reference images and datasets")
    ss = s.add_subparsers(dest="synth_command", required=True)
    c = ss.add_parser("character", help="render a character's reference image (neutral pose)")
    c.add_argument("--seed", type=int, required=True, help="character seed (>= 0)")
    c.add_argument("--out", required=True, help="output PNG")
    c.add_argument("--size", type=int, default=256, help="image side in pixels")
    d = ss.add_parser("dataset", help="write clips: 16 kHz wav, frames npz, ground truth")
    d.add_argument("--out", required=True, help="output folder (clips go to OUT/SPLIT/)")
    d.add_argument("--clips", type=int, required=True, help="number of clips")
    d.add_argument("--split", choices=["train", "val", "test"], default="train")
    d.add_argument("--seed", type=int, default=0, help="dataset seed")
    d.add_argument("--size", type=int, default=256, help="frame side in pixels")
    d.add_argument("--fps", type=int, default=25)
    d.add_argument("--characters", type=int, default=None, help="use only the first N characters")
    d.add_argument("--no-augment", action="store_true", help="clean audio even for train")
    d.add_argument("--quiet", action="store_true", help="no progress line")


def cmd_synth(args: argparse.Namespace) -> int:
    """Run a ``synth`` subcommand."""
    if args.synth_command == "character":
        return _character(args)
    return _dataset(args)


def _character(args: argparse.Namespace) -> int:

    if args.seed < 0:
        raise InputError(f"--seed must be >= 0, got {args.seed}")
    if not 32 <= args.size <= 4096:
        raise InputError(f"--size must be between 32 and 4096, got {args.size}")
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise InputError(f"--out must end in .png, got {out}")
    if not out.parent.is_dir():
        raise InputError(f"output folder {out.parent} does not exist")
    image = Renderer(sample_character(args.seed), args.size).render_neutral()
    Image.fromarray(image).save(out)
    print(f"wrote character {args.seed} ({args.size}x{args.size}) to {out}")
    return 0


def _dataset(args: argparse.Namespace) -> int:

    if args.clips < 1:
        raise InputError(f"--clips must be >= 1, got {args.clips}")
    if not 32 <= args.size <= 1024 or args.size % 2:
        raise InputError(f"--size must be an even number between 32 and 1024, got {args.size}")
    t0 = time.perf_counter()

    def progress(done: int) -> None:
        if not args.quiet:
            rate = done / (time.perf_counter() - t0)
            print(f"\r{done}/{args.clips} clips ({rate:.2f} clips/s)", end="", file=sys.stderr)

    folder = write_dataset(
        args.out,
        args.split,
        args.clips,
        args.seed,
        progress=progress,
        size=args.size,
        fps=args.fps,
        characters=args.characters,
        augment=False if args.no_augment else None,
    )
    if not args.quiet:
        print(file=sys.stderr)
    print(f"wrote {args.clips} {args.split} clips to {folder} in {time.perf_counter() - t0:.1f} s")
    return 0
