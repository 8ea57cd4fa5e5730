"""Narrow a trained studio decoder: ``python -m talkloop.pipeline.models.studio.refit_decoder``.

The decoder is the largest part of a live call's generation time on a CPU. This makes a narrower one from a
trained weights folder without touching anything else: the encoder, so the latents the A2V, SR
and mouth networks learned on, stay bit for bit the same.

1. Prune: the narrower decoder starts as the trained one with its least used channels removed
   (per layer, mean absolute activation on training frames times the weight that reads it).
2. Distil: it learns to reproduce the trained decoder's frames (region-weighted L1 plus image
   gradients, the VAE phase's reconstruction loss, with the mouth box weighted highest) from the frozen
   encoder's latents of rendered training clips, as a causal stream (some windows start one).
3. Report: PSNR against the trained decoder and against the rendered truth, over the frame and in
   the mouth box, on held-out test clips, before and after.

The output folder is the input folder with ``vae.safetensors``/``vae.json`` replaced, plus
``refit_decoder.json`` (the recipe and the figures).
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import Tensor

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.models.registry import module_config
from talkloop.pipeline.models.studio.data import clip_paths, ensure_dataset, to_images
from talkloop.pipeline.models.studio.recipe import PhaseConfig
from talkloop.pipeline.models.studio.train import reconstruction_terms
from talkloop.pipeline.models.studio.vae import Decoder, StudioVAE, VAEConfig
from talkloop.pipeline.synth.dataset import load_clip, region_weights
from talkloop.pipeline.train.schedule import warmup_cosine


@dataclass
class DistilData:
    """Decoder inputs with what the decoder should make of them."""

    x: Tensor  # (N, C*(K+1), h, w) float32 decoder inputs
    teacher: Tensor  # (N, 3, H, W) float16 frames of the trained decoder
    truth: Tensor  # (N, H, W, 3) uint8 rendered frames
    weights: Tensor  # (N, H, W) uint8 region weights (1 outside, 2 face, 8 mouth)
    mouth_box: Tensor  # (N, 4) float32 (x0, y0, x1, y1) in pixels


@torch.no_grad()  # not inference_mode: the tensors feed training
def distil_data(
    vae: StudioVAE,
    clips: list[Path],
    windows_per_clip: int,
    length: int,
    seed: int,
    p_start: float = 0.0,
) -> DistilData:
    """Windows of ``length`` consecutive frames per clip, encoded by ``vae`` and decoded by its
    decoder as a stream: the first ``cache_frames`` frames of a window are history only, and with
    probability ``p_start`` a window starts a stream (history = its first frame repeated)."""
    k = vae.cfg.cache_frames
    if length <= k:
        raise ConfigError(f"windows of {length} frames leave no frame after {k} of history")
    rng = np.random.default_rng(seed)
    parts: dict[str, list[Tensor]] = {f: [] for f in DistilData.__dataclass_fields__}
    for path in clips:
        clip = load_clip(path)
        if clip.frames is None or clip.num_frames < length:
            raise ConfigError(f"{path}: needs at least {length} rendered frames")
        weights = region_weights(clip).astype(np.uint8)
        for s in np.sort(rng.integers(0, clip.num_frames - length + 1, size=windows_per_clip)):
            frames = clip.frames[s : s + length]
            z = vae.encode(to_images(torch.from_numpy(frames)))  # (length, C, h, w)
            start = rng.random() < p_start
            x, _ = vae.decoder_inputs(z[k:], None if start else z[:k])
            parts["x"].append(x.contiguous())
            parts["teacher"].append(vae.decoder(x).half())
            parts["truth"].append(torch.from_numpy(frames[k:].copy()))
            parts["weights"].append(torch.from_numpy(weights[s + k : s + length].copy()))
            parts["mouth_box"].append(torch.from_numpy(clip.mouth_box[s + k : s + length].copy()))
    return DistilData(**{f: torch.cat(v) for f, v in parts.items()})


@torch.no_grad()
def prune_decoder(teacher: Decoder, cfg: VAEConfig, x: Tensor) -> Decoder:
    """A decoder of ``cfg``'s widths holding ``teacher``'s most used channels.

    Args:
        teacher: the trained decoder (its widths >= ``cfg``'s, same block counts).
        cfg: the narrower decoder's config.
        x: sample decoder inputs (B, C*(K+1), h, w) for the activation statistics.
    Returns:
        The pruned decoder (float32, channels-last). At ``teacher``'s own widths it is an exact
        copy.
    """
    t = teacher.float()
    c1, c2 = cfg.dec_latent_channels, cfg.dec_channels
    if len(t.blocks1) != cfg.dec_latent_blocks or len(t.blocks2) != cfg.dec_blocks:
        raise ConfigError("pruning keeps the decoder's block counts")
    if c1 > t.stem.out_channels or c2 > t.out.in_channels:
        raise ConfigError(
            f"pruning narrows a decoder: {c1}/{c2} channels asked, the trained one has "
            f"{t.stem.out_channels}/{t.out.in_channels}"
        )

    def use(a: Tensor) -> Tensor:  # mean |activation| per channel of (B, C, H, W)
        return a.abs().mean((0, 2, 3))

    def reads(conv: torch.nn.Conv2d) -> Tensor:  # weight norm per input channel
        return conv.weight.square().sum((0, 2, 3)).sqrt()

    def through(blocks: torch.nn.Sequential, s: Tensor) -> tuple[Tensor, Tensor, list[Tensor]]:
        """``s`` after ``blocks``, its channels' use summed over the blocks, each block's inner
        channels' scores."""
        stream, mids = use(s), []
        for b in blocks:
            m = F.relu(b.conv1(s))
            mids.append(use(m) * reads(b.conv2))
            s = s + b.conv2(m)
            stream = stream + use(s)
        return s, stream, mids

    # Each residual stream is scored by its use at every block times what reads it next.
    s, stream1, mids1 = through(t.blocks1, F.relu(t.stem(x)))
    stream1 = stream1 * reads(t.up)
    _, stream2, mids2 = through(t.blocks2, F.relu(F.pixel_shuffle(t.up(s), 2)))
    stream2 = stream2 * reads(t.out)

    def top(score: Tensor, n: int) -> Tensor:
        return torch.sort(torch.topk(score, n).indices).values

    k1, k2 = top(stream1, c1), top(stream2, c2)
    # pixel_shuffle(., 2) makes output channel c from input channels 4c .. 4c + 3.
    up_rows = (k2[:, None] * 4 + torch.arange(4)[None]).reshape(-1)
    student = Decoder(cfg)
    pairs = [(student.stem, t.stem, k1, slice(None))]
    for bs, bt, score in zip(student.blocks1, t.blocks1, mids1, strict=True):
        km = top(score, c1)
        pairs += [(bs.conv1, bt.conv1, km, k1), (bs.conv2, bt.conv2, k1, km)]
    pairs.append((student.up, t.up, up_rows, k1))
    for bs, bt, score in zip(student.blocks2, t.blocks2, mids2, strict=True):
        km = top(score, c2)
        pairs += [(bs.conv1, bt.conv1, km, k2), (bs.conv2, bt.conv2, k2, km)]
    pairs.append((student.out, t.out, slice(None), k2))
    for new, old, rows, cols in pairs:
        new.weight.copy_(old.weight[rows][:, cols])
        new.bias.copy_(old.bias[rows])
    return student.to(memory_format=torch.channels_last)


def psnr(a: Tensor, b: Tensor, boxes: Tensor | None = None) -> float:
    """Mean per-frame PSNR (dB) of (T, 3, H, W) frames in [-1, 1], over the frame or inside
    per-frame ``boxes`` (T, 4)."""
    if boxes is None:
        mse = (a - b).square().mean((1, 2, 3))
    else:
        rows = []
        for i, box in enumerate(boxes.round().long().tolist()):
            x0, y0, x1, y1 = box
            rows.append((a[i, :, y0:y1, x0:x1] - b[i, :, y0:y1, x0:x1]).square().mean())
        mse = torch.stack(rows)
    return float((10 * torch.log10(4.0 / mse.clamp_min(1e-12))).mean())


@torch.inference_mode()
def score(decoder: Decoder, data: DistilData, batch: int = 6) -> dict[str, float]:
    """PSNR of ``decoder``'s frames against the trained decoder's and against the truth."""
    was_training = decoder.training
    decoder.eval()
    out = torch.cat(
        [
            decoder(data.x[i : i + batch].contiguous(memory_format=torch.channels_last))
            for i in range(0, data.x.shape[0], batch)
        ]
    )
    decoder.train(was_training)
    teacher, truth = data.teacher.float(), to_images(data.truth)
    return {
        "psnr_vs_trained_db": psnr(out, teacher),
        "psnr_vs_trained_mouth_db": psnr(out, teacher, data.mouth_box),
        "psnr_vs_truth_db": psnr(out, truth),
        "psnr_vs_truth_mouth_db": psnr(out, truth, data.mouth_box),
    }


def distil(
    student: Decoder,
    data: DistilData,
    phase: PhaseConfig,
    seed: int,
    grad_weight: float = 0.5,
    on_step: Callable[[int, float], None] | None = None,
) -> None:
    """Train ``student`` to reproduce ``data.teacher`` for ``phase.steps`` steps of
    ``phase.batch`` frames (AdamW, the trainer's schedule: ``warmup_cosine``)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(student.parameters(), lr=phase.lr, weight_decay=phase.weight_decay)
    student.train()
    for step in range(phase.steps):
        for group in opt.param_groups:
            group["lr"] = warmup_cosine(step, phase.steps, phase.lr, phase.warmup, phase.final_frac)
        i = torch.randint(data.x.shape[0], (phase.batch,), generator=g)
        rec = student(data.x[i].contiguous(memory_format=torch.channels_last))
        target, w = data.teacher[i].float(), data.weights[i][:, None].float()
        l1, gradients = reconstruction_terms(rec, target, w)
        loss = l1 + grad_weight * gradients
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), phase.clip_grad)
        opt.step()
        if on_step is not None:
            on_step(step + 1, float(loss.detach()))
    student.eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--weights", type=Path, required=True, help="trained studio weights folder")
    p.add_argument("--out", type=Path, required=True, help="new weights folder (must not exist)")
    p.add_argument("--channels", type=int, nargs=2, metavar=("LATENT", "UP"), default=(96, 48))
    p.add_argument("--data", type=Path, required=True, help="clips folder (made if missing)")
    p.add_argument("--clips", type=int, default=200, help="training clips to generate")
    p.add_argument("--characters", type=int, default=50, help="characters they draw from")
    p.add_argument("--size", type=int, default=256, help="frame side of the clips")
    p.add_argument("--test-clips", type=int, default=8)
    p.add_argument("--windows", type=int, default=3, help="windows per clip")
    p.add_argument("--window", type=int, default=10, help="frames per window (history included)")
    p.add_argument("--steps", type=int, help="distillation steps (default: fill --minutes)")
    p.add_argument("--minutes", type=float, default=25.0, help="budget when --steps is not given")
    p.add_argument("--batch", type=int, default=6, help="frames per step")
    p.add_argument("--lr", type=float, default=4e-4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.out.exists():
        raise ConfigError(f"--out {args.out} exists; give a new folder")
    for flag in ("clips", "characters", "test_clips", "windows", "batch", "steps"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.minutes <= 0:
        raise ConfigError(f"--minutes must be > 0, got {args.minutes}")

    vcfg = VAEConfig.model_validate(module_config(args.weights, "vae"))
    widths = dict(zip(("dec_latent_channels", "dec_channels"), args.channels, strict=True))
    try:
        ncfg = VAEConfig.model_validate(vcfg.model_dump() | widths)
    except ValidationError as err:
        raise ConfigError(f"--channels {args.channels[0]} {args.channels[1]}: {err}") from None
    try:
        phase = PhaseConfig(steps=args.steps or 20, batch=args.batch, lr=args.lr)
    except ValidationError as err:
        bad = err.errors()[0]
        raise ConfigError(f"--{bad['loc'][0]}: {bad['msg']}, got {bad['input']}") from None
    vae = StudioVAE(vcfg)
    Module("vae", vcfg, vae).load(args.weights)
    vae = vae.float().eval().to(memory_format=torch.channels_last)
    train_dir = ensure_dataset(
        args.data / "train", args.clips, args.size, args.seed, characters=args.characters
    )
    test_dir = ensure_dataset(
        args.data / "test", args.test_clips, args.size, args.seed, split="test"
    )
    t0 = time.perf_counter()
    train = distil_data(vae, clip_paths(train_dir), args.windows, args.window, args.seed, 0.15)
    test = distil_data(vae, clip_paths(test_dir), args.windows, args.window, args.seed + 1)
    print(
        f"{len(train.x)} training / {len(test.x)} test frames ({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )

    g = torch.Generator().manual_seed(args.seed)
    sample = train.x[torch.randperm(len(train.x), generator=g)[:64]]
    student = prune_decoder(vae.decoder, ncfg, sample.contiguous(memory_format=torch.channels_last))
    trained_channels = [vcfg.dec_latent_channels, vcfg.dec_channels]
    report: dict[str, object] = {
        "recipe": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        # Against its own frames the trained decoder only measures their float16 storage.
        "trained": {k: v for k, v in score(vae.decoder, test).items() if "truth" in k}
        | {"channels": trained_channels},
        "pruned": score(student, test),
    }
    print("trained", report["trained"], "\npruned", report["pruned"], flush=True)

    if args.steps is None:  # time 20 steps on a copy after 5 of kernel set-up, fill the budget
        probe = copy.deepcopy(student)
        distil(probe, train, phase.model_copy(update={"steps": 5}), args.seed)
        t1 = time.perf_counter()
        distil(probe, train, phase, args.seed)
        per_step = (time.perf_counter() - t1) / phase.steps
        phase = phase.model_copy(update={"steps": max(20, int(args.minutes * 60 / per_step))})
    steps = phase.steps
    t2 = time.perf_counter()

    def progress(step: int, loss: float) -> None:
        if step % 250 == 0 or step == steps:
            mins = (time.perf_counter() - t2) / 60
            print(f"step {step}/{steps} loss {loss:.4f} ({mins:.1f} min)", flush=True)

    distil(student, train, phase, args.seed, on_step=progress)
    # Scored as shipped: float16 weights, read back as float32.
    student.load_state_dict({k: v.half().float() for k, v in student.state_dict().items()})
    report["refit"] = score(student, test) | {"channels": list(args.channels), "steps": steps}
    report["minutes"] = (time.perf_counter() - t2) / 60
    print("refit", report["refit"], flush=True)

    tmp = args.out.with_name(args.out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(args.weights, tmp)
        vae.decoder = student
        vae.cfg = ncfg
        Module("vae", ncfg, vae).save(tmp, dtype=torch.float16)
        (tmp / "refit_decoder.json").write_text(json.dumps(report, indent=2) + "\n")
        tmp.rename(args.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written is left
        raise
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    import sys

    from talkloop.pipeline.core.errors import TalkloopError

    try:
        raise SystemExit(main())
    except TalkloopError as err:
        print(f"refit_decoder: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
