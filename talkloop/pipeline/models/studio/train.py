"""Trainer: the phases of ``talkloop train``, checkpoints, logs and the final export.

Order: VAE (pixels) -> latent scale + encode every clip -> audio encoder + A2V (flow matching on
latents, all three mask patterns) -> SR (one step) -> readout (for ``talkloop eval``) ->
expression (the prompt's expression on the reference latent, from rendered pairs).
Every random draw of a phase comes from one ``torch.Generator`` whose state is checkpointed with
the networks and the optimiser, so ``--resume`` continues the same run.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from talkloop.pipeline.console import progress_bar
from talkloop.pipeline.core.config import native_bf16
from talkloop.pipeline.core.errors import CheckpointError, ConfigError
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.models.shared.a2v import lowres
from talkloop.pipeline.models.shared.sampling import flow_matching_loss
from talkloop.pipeline.models.studio.data import (
    ClipArrays,
    PixelBank,
    clip_paths,
    encode_clips,
    ensure_dataset,
    expression_pairs,
    latent_cache_state,
    load_all,
    mouth_pairs,
    readout_renders,
    restore_latents,
    to_images,
)
from talkloop.pipeline.models.studio.family import STUDIO_MODULES, StudioConfig, build_networks
from talkloop.pipeline.models.studio.readout import (
    Readout,
    ReadoutConfig,
    crop_mouths,
    readout_loss,
    save_readout,
)
from talkloop.pipeline.models.studio.recipe import PHASES, PhaseConfig, TrainConfig
from talkloop.pipeline.synth.style import describe
from talkloop.pipeline.train.schedule import warmup_cosine

CHECKPOINT = "checkpoint.pt"
LATENT_CACHE = "latents.safetensors"
# Share of a --minutes budget per phase (A2V carries the content, so it gets the most).
BUDGET_SHARE = {
    "vae": 0.22,
    "decoder": 0.06,
    "a2v": 0.46,
    "sr": 0.12,
    "readout": 0.06,
    "expression": 0.03,
    "mouth": 0.05,
}
TRAINED = ("vae", "audio_encoder", "a2v", "sr", "expression", "mouth")
PROMPT_VARIANTS = 8  # prompts per clip the A2V phase draws from (see _text_embeddings)


def reconstruction_terms(rec: Tensor, target: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """The VAE's reconstruction loss terms: region-weighted L1 of (B, 3, H, W) images and of
    their horizontal and vertical differences; ``w`` (B, 1, H, W) weighs each pixel."""

    def l1(a: Tensor, b: Tensor, weight: Tensor) -> Tensor:
        return ((a - b).abs() * weight).sum() / (weight.sum() * a.shape[1])

    dx = (rec[..., 1:] - rec[..., :-1], target[..., 1:] - target[..., :-1], w[..., 1:])
    dy = (
        rec[..., 1:, :] - rec[..., :-1, :],
        target[..., 1:, :] - target[..., :-1, :],
        w[..., 1:, :],
    )
    return l1(rec, target, w), l1(*dx) + l1(*dy)


class Trainer:
    """One training run into ``out`` (see module docstring).

    Args:
        cfg: the recipe.
        out: output folder: weights (``<module>.safetensors/json``), ``checkpoint/``,
            ``train_log.jsonl`` and ``train_summary.json``.
        data: folder of studio clips (``index.jsonl``); None: generate ``cfg.clips`` into
            ``out/data``.
        resume: continue from ``out/checkpoint/checkpoint.pt``.
        progress: show progress bars.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        out: Path,
        data: Path | None = None,
        resume: bool = False,
        progress: bool = True,
    ) -> None:
        self.cfg = cfg
        self.out = Path(out)
        self.data = data
        self.progress = progress
        self.ckpt_dir = self.out / "checkpoint"
        ckpt = self.ckpt_dir / CHECKPOINT
        if ckpt.is_file() and not resume:
            raise ConfigError(
                f"{self.out} already holds a training checkpoint; pass --resume to continue it "
                "or choose an empty --out folder"
            )
        self.family = StudioConfig.tiny() if cfg.preset == "tiny" else StudioConfig.default()
        torch.manual_seed(cfg.seed)  # network init is part of the seeded run
        self.nets = build_networks(self.family)
        self.readout = Readout(ReadoutConfig())
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)
        # Training's auto follows the hardware (bf16 autocast where the CPU computes it).
        self.bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and native_bf16("cpu"))
        self.done: list[str] = []
        self.latent_scale: float | None = None
        self.resume_state: dict | None = None
        self.step_seconds: dict[str, float] = {}
        self.final_loss: dict[str, float] = {}
        self.t_start = time.perf_counter()
        # Called with (phase, step) after every optimiser step (tests stop a run with it).
        self.on_step: Callable[[str, int], None] | None = None
        self.paths: list[Path] = []
        self.arrays: list[ClipArrays] = []
        self.bank: PixelBank | None = None
        if resume and ckpt.is_file():
            self._load_checkpoint(ckpt)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path = self.out / "train_log.jsonl"

    def _autocast(self) -> torch.autocast:
        """bf16 autocast where the CPU computes bf16 natively (``TrainConfig.dtype``)."""
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16)

    # -- checkpoints ------------------------------------------------------------------------------

    def _all_nets(self) -> dict[str, nn.Module]:
        return {**{k: self.nets[k] for k in TRAINED}, "readout": self.readout}

    def _save_checkpoint(
        self, phase: str | None, step: int, total: int, opt: torch.optim.Optimizer | None
    ) -> None:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "done": list(self.done),
            "phase": phase,
            "step": step,
            "total": total,
            "nets": {k: v.state_dict() for k, v in self._all_nets().items()},
            "opt": None if opt is None else opt.state_dict(),
            "gen": self.gen.get_state(),
            "latent_scale": self.latent_scale,
            "step_seconds": self.step_seconds,
            "final_loss": self.final_loss,
        }
        tmp = self.ckpt_dir / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.ckpt_dir / CHECKPOINT)  # never a half-written checkpoint

    def _load_checkpoint(self, path: Path) -> None:
        state = torch.load(path, weights_only=False)
        self.done = list(state["done"])
        for name, net in self._all_nets().items():
            if name in state["nets"]:
                net.load_state_dict(state["nets"][name])
            elif name in self.done:
                raise CheckpointError(f"{path}: phase {name!r} is done but its weights are missing")
            # Otherwise a network added since the checkpoint: its phase has still to run.
        self.gen.set_state(state["gen"])
        self.latent_scale = state["latent_scale"]
        self.step_seconds = dict(state.get("step_seconds", {}))
        self.final_loss = dict(state.get("final_loss", {}))
        if self.latent_scale is not None:
            self._set_latent_scale(self.latent_scale)
        if state["phase"] is not None:
            self.resume_state = state

    # -- the phase loop ---------------------------------------------------------------------------

    def _budget_seconds(self, name: str) -> float | None:
        if self.cfg.minutes is None:
            return None
        return self.cfg.minutes * 60.0 * BUDGET_SHARE[name]

    def _log(self, row: dict[str, object]) -> None:
        with open(self.log_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def run_phase(
        self,
        name: str,
        params: list[nn.Parameter],
        step_fn: Callable[[], tuple[Tensor, dict[str, float]]],
    ) -> None:
        """Optimise ``params`` with ``step_fn`` (returns the loss and scalars to log)."""
        pc: PhaseConfig = getattr(self.cfg, name)
        opt = torch.optim.AdamW(params, lr=pc.lr, weight_decay=pc.weight_decay)
        start, total = 0, pc.steps
        rs = self.resume_state
        if rs is not None and rs["phase"] == name:
            opt.load_state_dict(rs["opt"])
            start, total = rs["step"], rs["total"]
            self.resume_state = None
        budget = self._budget_seconds(name)
        bar = progress_bar(
            total=total, initial=start, desc=name, enabled=self.progress, dynamic_ncols=True
        )
        t_phase = time.perf_counter()
        timed_steps, timed_seconds = 0, 0.0
        step = start
        ema: float | None = None
        while step < total:
            for group in opt.param_groups:
                group["lr"] = warmup_cosine(step, total, pc.lr, pc.warmup, pc.final_frac)
            t0 = time.perf_counter()
            loss, extra = step_fn()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = float(torch.nn.utils.clip_grad_norm_(params, pc.clip_grad))
            opt.step()
            dt = time.perf_counter() - t0
            step += 1
            if step - start > 2:  # the first steps pay for allocations and kernel selection
                timed_steps += 1
                timed_seconds += dt
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"{name}: loss became {value} at step {step}")
            ema = value if ema is None else 0.95 * ema + 0.05 * value
            if budget is not None and timed_steps == 5:
                # A wall-clock budget fixes the step count once (so the LR schedule stays sane).
                left = budget - (time.perf_counter() - t_phase)
                total = max(step + 1, min(total, step + int(left / (timed_seconds / 5))))
                bar.total = total
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.4f}")
            if step % self.cfg.log_every == 0 or step == total:
                self._log(
                    {
                        "phase": name,
                        "step": step,
                        "loss": value,
                        "loss_ema": ema,
                        "lr": opt.param_groups[0]["lr"],
                        "grad_norm": gnorm,
                        "sec_per_step": dt,
                        **extra,
                    }
                )
            if step % self.cfg.checkpoint_every == 0 and step < total:
                self._save_checkpoint(name, step, total, opt)
            if self.on_step is not None:
                self.on_step(name, step)
        bar.close()
        if timed_steps:
            self.step_seconds[name] = timed_seconds / timed_steps
        if ema is not None:
            self.final_loss[name] = ema
        self.done.append(name)
        self._save_checkpoint(None, 0, 0, None)

    # -- phases -----------------------------------------------------------------------------------

    def _vae_crops(self, bank: PixelBank, idx: Tensor) -> tuple[Tensor, Tensor]:
        """Windows cut to ``vae_crop`` px around the lower face (the nets are fully conv)."""
        frames, weights = bank.frames[idx], bank.weights[idx]  # (B, W, H, Wd, 3), (B, W, H, Wd)
        size = frames.shape[2]
        crop = min(self.cfg.vae_crop, size)
        if crop == size:
            return frames, weights
        jit = (torch.rand(len(idx), 2, generator=self.gen) - 0.5) * (crop / 2)
        box = bank.crop[idx]  # mouth centre and face-wide side
        cx, cy = box[:, 0] + jit[:, 0], box[:, 1] - 0.3 * box[:, 2] + jit[:, 1]
        # Corners on the 8-px latent grid, so a crop encodes exactly like that part of a frame.
        x0 = ((cx - crop / 2) / 8).round().clamp(0, (size - crop) / 8).long() * 8
        y0 = ((cy - crop / 2) / 8).round().clamp(0, (size - crop) / 8).long() * 8
        corners = list(zip(x0.tolist(), y0.tolist(), strict=True))
        f = [frames[i, :, y : y + crop, x : x + crop] for i, (x, y) in enumerate(corners)]
        w = [weights[i, :, y : y + crop, x : x + crop] for i, (x, y) in enumerate(corners)]
        return torch.stack(f), torch.stack(w)

    def _vae_step(self, bank: PixelBank, phase: str = "vae") -> tuple[Tensor, dict[str, float]]:
        """One step of the ``vae`` phase, or of the ``decoder`` phase, which trains the decoder
        alone (no gradient through the encoder, so the latents stay fixed); each its own batch."""
        cfg, vae, g = self.cfg, self.nets["vae"], self.gen
        k = vae.cfg.cache_frames
        b = getattr(cfg, phase).batch
        train_encoder = phase == "vae"
        idx = torch.randint(bank.frames.shape[0], (b,), generator=g)
        win, wts = self._vae_crops(bank, idx)  # (B, W, H, Wd, 3), (B, W, H, Wd)
        nw = win.shape[1]
        n = nw - k
        x = to_images(win).reshape(b, nw, 3, *win.shape[2:4])  # (B, W, 3, H, Wd)
        target = x[:, k:].reshape(b * n, *x.shape[2:])  # (B*n, 3, H, Wd)
        with self._autocast():
            # History frames only feed the decoder's cache: no encoder gradient through them
            # (halves the cost; the encoder still learns from every decoded frame).
            with torch.no_grad():
                hist = vae.encode_dist(x[:, :k].reshape(b * k, *x.shape[2:]))[0]
            with torch.set_grad_enabled(train_encoder):
                mean, logvar = vae.encode_dist(target)  # (B*n, C, h, w) float32
        z = mean + torch.exp(0.5 * logvar) * torch.randn(mean.shape, generator=g)
        z = torch.cat([hist.reshape(b, k, *hist.shape[1:]), z.reshape(b, n, *z.shape[1:])], 1)
        # Some windows start a stream: the decoder's history is the first frame repeated.
        start = torch.rand(b, generator=g) < 0.15
        z = torch.where(start[:, None, None, None, None], z[:, k : k + 1].expand_as(z), z)
        inp = torch.cat([z[:, j : j + n] for j in range(k + 1)], dim=2)  # (B, n, C(k+1), h, w)
        inp = inp.reshape(b * n, *inp.shape[2:]).contiguous(memory_format=torch.channels_last)
        with self._autocast():
            rec = vae.decoder(inp).float()  # (B*n, 3, H, Wd)
        w = wts[:, k:].reshape(b * n, 1, *rec.shape[2:]).float()
        l1, gl = reconstruction_terms(rec, target, w)
        kl = 0.5 * (mean.square() + logvar.exp() - 1.0 - logvar).mean()
        loss = l1 + cfg.grad_weight * gl + cfg.kl_weight * kl
        return loss, {"l1": l1.item(), "grad": gl.item(), "kl": kl.item()}

    def _set_latent_scale(self, scale: float) -> None:
        self.latent_scale = scale
        vcfg = self.family.vae.model_copy(update={"latent_scale": scale})
        self.family = self.family.model_copy(update={"vae": vcfg})
        self.nets["vae"].cfg = vcfg

    @torch.no_grad()
    def _measure_latent_scale(self, bank: PixelBank, frames: int = 256) -> float:
        """1 / std of the posterior means over bank frames: A2V then sees ~unit-variance latents."""
        vae = self.nets["vae"].eval()
        flat = bank.frames.reshape(-1, *bank.frames.shape[2:])
        step = max(1, flat.shape[0] // frames)
        means = []
        with self._autocast():
            for s in range(0, flat.shape[0], step * 32):
                means.append(vae.encode_dist(to_images(flat[s : s + step * 32 : step]))[0])
        return 1.0 / float(torch.cat(means).float().std().clamp_min(1e-6))

    def _a2v_step(
        self, arrays: list[ClipArrays], text: Tensor, has_text: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        cfg, g = self.cfg, self.gen
        a2v, enc = self.nets["a2v"], self.nets["audio_encoder"]
        u = float(torch.rand(1, generator=g))
        if u < cfg.p_first:  # N0: no given frames
            pattern, c = 0, 0
            f = int(torch.randint(2, cfg.max_gen + 1, (1,), generator=g))
            n_given_front = 0
        elif u < cfg.p_first + cfg.p_interp:  # I chunk: anchors at -1 and m
            pattern = 2
            m = int(torch.randint(1, cfg.max_interior + 1, (1,), generator=g))
            f, n_given_front = m + 2, 1
        else:  # continuation: c motion-context frames at -c..-1
            pattern = 1
            c = int(torch.randint(1, cfg.max_ctx + 1, (1,), generator=g))
            n = int(torch.randint(2, cfg.max_gen + 1, (1,), generator=g))
            f, n_given_front = c + n, c
        b = max(1, cfg.a2v.batch // f)
        mask = torch.zeros(b, f, dtype=torch.bool)
        mask[:, :n_given_front] = True
        if pattern == 2:
            mask[:, -1] = True
        pos = torch.arange(f, dtype=torch.float32)[None].expand(b, f) - n_given_front
        clips = torch.randint(len(arrays), (b,), generator=g).tolist()
        variant = torch.randint(text.shape[1], (b,), generator=g)
        x0, mel, ref, wmap = [], [], [], []
        for ci in clips:
            a = arrays[ci]
            s = int(torch.randint(0, max(1, a.num_frames - f + 1), (1,), generator=g))
            assert a.latents is not None and a.ref_latent is not None
            x0.append(lowres(a.latents[s : s + f].float()))
            mel.append(a.mel[s : s + f])
            ref.append(lowres(a.ref_latent))
            wmap.append(lowres(a.weights_lr[s : s + f].float()))
        x0_t = torch.stack(x0)  # (B, F, C, h, w)
        with self._autocast():
            audio = enc(torch.cat(mel)).reshape(b, f, -1)  # (B, F, D)
            loss = flow_matching_loss(
                a2v,
                x0_t,
                mask,
                pos.contiguous(),
                torch.stack(ref),
                audio,
                text[clips, variant],
                g,
                given_noise_max=cfg.given_noise_max,
                audio_drop_prob=cfg.audio_drop,
                text_drop_prob=cfg.text_drop,
                text_present=has_text[clips, variant],
                weight=torch.stack(wmap),
            )
        return loss, {"pattern": pattern, "frames": f, "batch": b}

    def _sr_step(self, arrays: list[ClipArrays]) -> tuple[Tensor, dict[str, float]]:
        cfg, g, sr = self.cfg, self.gen, self.nets["sr"]
        b = cfg.sr.batch
        clips = torch.randint(len(arrays), (b,), generator=g).tolist()
        z, ref, w = [], [], []
        for ci in clips:
            a = arrays[ci]
            j = int(torch.randint(a.num_frames, (1,), generator=g))
            assert a.latents is not None and a.ref_latent is not None
            z.append(a.latents[j].float())
            ref.append(a.ref_latent)
            w.append(a.weights_lr[j].float())
        z_hr, ref_hr, wmap = torch.stack(z), torch.stack(ref), torch.stack(w)
        z_lr = F.avg_pool2d(z_hr, 2)
        sigma = torch.rand(b, 1, 1, 1, generator=g) * cfg.sr_input_noise
        z_lr = z_lr + sigma * torch.randn(z_lr.shape, generator=g)
        with self._autocast():
            pred = sr(z_lr, ref_hr)
        err = (pred.float() - z_hr).square()
        wmap = wmap.expand_as(err)
        loss = (err * wmap).sum() / wmap.sum()
        # Bilinear-only error at the same input: how much SR adds over no SR.
        base = F.interpolate(z_lr, scale_factor=2.0, mode="bilinear", align_corners=False)
        base_loss = ((base - z_hr).square() * wmap).sum() / wmap.sum()
        return loss, {"bilinear": float(base_loss)}

    @torch.no_grad()
    def _readout_data(self) -> tuple[Tensor, Tensor]:
        """Mouth crops of readout renders (``readout_renders``), real and VAE-reconstructed,
        with jittered boxes."""
        cfg = self.cfg
        vae, g = self.nets["vae"].eval(), torch.Generator().manual_seed(cfg.seed + 7)
        size = self.readout.cfg.crop
        crops, targets = [], []
        side = cfg.size if self.bank is None else int(self.bank.frames.shape[2])  # as trained
        renders = readout_renders(cfg.readout_clips, cfg.readout_frames_per_clip, side, cfg.seed)
        for frames, target, crop in renders:
            x = to_images(torch.from_numpy(frames))  # (F, 3, H, W)
            rec, _ = vae.decode(vae.encode(x))  # fp32: bf16 convs are slower (docs/benchmarks.md)
            for im in (x, rec.float()):
                box = torch.from_numpy(crop)[None].expand(im.shape[0], -1).clone()
                jit = (torch.rand(im.shape[0], 3, generator=g) - 0.5) * 0.1
                box[:, :2] += jit[:, :2] * box[:, 2:]
                box[:, 2] *= 1 + jit[:, 2]
                crops.append(crop_mouths(im, box, size).half())
                targets.append(torch.from_numpy(target))
        return torch.cat(crops), torch.cat(targets)

    def _readout_step(self, crops: Tensor, targets: Tensor) -> tuple[Tensor, dict[str, float]]:
        idx = torch.randint(crops.shape[0], (self.cfg.readout.batch,), generator=self.gen)
        x = crops[idx].float()
        if float(torch.rand(1, generator=self.gen)) < 0.5:  # flips keep the readout symmetric
            x = x.flip(-1)
        return readout_loss(self.readout, x, targets[idx]), {}

    @torch.no_grad()
    def _expression_data(self) -> tuple[Tensor, Tensor, Tensor]:
        """Latents of ``expression_pairs`` (reference per pair, target) and prompt embeddings."""
        cfg = self.cfg
        vae = self.nets["vae"].eval()
        side = cfg.size if self.bank is None else int(self.bank.frames.shape[2])  # as trained
        refs, targets, prompts = [], [], []
        pairs = expression_pairs(cfg.expression_characters, cfg.expression_styles, side, cfg.seed)
        for ref, target, texts in pairs:
            x = to_images(torch.from_numpy(np.concatenate([ref[None], target])))
            z = vae.encode(x).float()  # fp32: bf16 convs are slower (docs/benchmarks.md)
            refs.append(z[:1].expand(len(texts), -1, -1, -1))
            targets.append(z[1:])
            prompts.extend(texts)
        emb = self.nets["text_encoder"].encode([p if p.strip() else "-" for p in prompts])
        return torch.cat(refs), torch.cat(targets), emb

    def _expression_step(
        self, refs: Tensor, targets: Tensor, emb: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        idx = torch.randint(refs.shape[0], (self.cfg.expression.batch,), generator=self.gen)
        with self._autocast():
            out = self.nets["expression"](refs[idx], emb[idx])
        loss = (out.float() - targets[idx]).square().mean()
        # The same error if the reference were left untouched: what the edit has to win.
        keep = (refs[idx] - targets[idx]).square().mean()
        return loss, {"unedited": float(keep)}

    @torch.no_grad()
    def _mouth_data(self) -> dict[str, Tensor]:
        """The mouth phase's two data sets.

        Head: every training clip frame's audio feature (the trained, frozen audio encoder) and
        its rendered mouth shape. Editor: ``mouth_pairs`` encoded by the VAE; the wrong frames go
        through the trained SR from their pooled, noised latents, as A2V output does at inference.
        The editor's target is that SR output plus the latent change the mouth makes,
        ``E(right) - E(wrong)``, not ``E(right)``: the SR keeps only part of a smile, and a
        target with the whole smile taught the editor to put the training clips' average smile
        back on every mouth (held-out smiling vs serious prompts: 0.13 apart instead of 0.25).
        """
        cfg, g = self.cfg, torch.Generator().manual_seed(self.cfg.seed + 11)
        enc = self.nets["audio_encoder"].eval()
        feats = torch.cat([enc(a.mel).float() for a in self.arrays])  # (N, D_audio)
        shapes = torch.cat([a.mouth for a in self.arrays])  # (N, M)
        vae, sr = self.nets["vae"].eval(), self.nets["sr"].eval()
        side = cfg.size if self.bank is None else int(self.bank.frames.shape[2])  # as trained
        factor = self.family.vae.spatial_factor
        z_in, z_out, target, weights = [], [], [], []
        for pair in mouth_pairs(cfg.mouth_characters, cfg.mouth_frames, side, cfg.seed):
            n = pair.wrong.shape[0]
            x = to_images(
                torch.from_numpy(np.concatenate([pair.reference[None], pair.wrong, pair.right]))
            )
            z = vae.encode(x).float()  # fp32: bf16 convs are slower (docs/benchmarks.md)
            ref, wrong, right = z[:1], z[1 : 1 + n], z[1 + n :]
            lr = F.avg_pool2d(wrong, 2)
            sigma = torch.rand(n, 1, 1, 1, generator=g) * cfg.sr_input_noise
            seen = sr(lr + sigma * torch.randn(lr.shape, generator=g), ref.expand(n, -1, -1, -1))
            z_in.append(seen.float())
            z_out.append(seen.float() + right - wrong)
            target.append(torch.from_numpy(pair.shape))
            w = torch.from_numpy(pair.weights)[:, None]  # (F, 1, H, W)
            weights.append(F.avg_pool2d(w, factor))
        return {
            "feats": feats,
            "shapes": shapes,
            "z_in": torch.cat(z_in),
            "z_out": torch.cat(z_out),
            "target": torch.cat(target),
            "weights": torch.cat(weights),
        }

    def _mouth_step(self, data: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        """Head loss (audio -> shape, 4 batches of frames) plus the editor's region-weighted
        latent loss, conditioned on the true shape."""
        net, b, g = self.nets["mouth"], self.cfg.mouth.batch, self.gen
        i = torch.randint(data["feats"].shape[0], (4 * b,), generator=g)
        j = torch.randint(data["z_in"].shape[0], (b,), generator=g)
        z_in, z_out = data["z_in"][j], data["z_out"][j]
        w = data["weights"][j].expand_as(z_in)
        with self._autocast():
            shape = net.shape_of(data["feats"][i])
            edited = net.edit(z_in, data["target"][j])
        head = (shape.float() - data["shapes"][i]).square().mean()
        edit = ((edited.float() - z_out).square() * w).sum() / w.sum()
        # The editor's error if it left the latents untouched: what the edit has to win.
        keep = ((z_in - z_out).square() * w).sum() / w.sum()
        return head + edit, {
            "head": float(head.detach()),
            "edit": float(edit.detach()),
            "unedited": float(keep),
        }

    # -- the run ----------------------------------------------------------------------------------

    def prepare_pixels(self) -> None:
        """Generate or find the clips and read them once (per-clip arrays + pixel bank)."""
        cfg = self.cfg
        folder = self.data
        if folder is None:
            folder = ensure_dataset(
                self.out / "data" / "train",
                cfg.clips,
                cfg.size,
                cfg.seed,
                progress=self._counter("data", cfg.clips),
                characters=cfg.characters,
            )
        self.paths = clip_paths(folder)
        self.arrays, self.bank = load_all(
            self.paths,
            self.nets["audio_encoder"],
            self.family.vae.spatial_factor,
            cfg.vae_windows_per_clip,
            self.family.vae.cache_frames + cfg.vae_decode_frames,
            cfg.seed,
            progress=self._counter("load", len(self.paths)),
        )
        size = self.bank.frames.shape[2]
        if size % 32:
            raise ConfigError(
                f"training frames are {size} px; the studio family needs a multiple of 32"
            )

    def prepare_latents(self) -> None:
        """Fix the latent scale (once) and encode every clip (or reload the cache)."""
        vae = self.nets["vae"].eval()
        if self.latent_scale is None:
            self._set_latent_scale(self._measure_latent_scale(self.bank))
            self._save_checkpoint(None, 0, 0, None)
        cache = self.ckpt_dir / LATENT_CACHE
        if not (cache.is_file() and restore_latents(self.arrays, load_file(str(cache)))):
            encode_clips(
                self.paths,
                self.arrays,
                vae,
                bf16=self.bf16,
                progress=self._counter("enc", len(self.paths)),
            )
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            save_file(latent_cache_state(self.arrays), str(cache))

    def _phase(self, name: str) -> tuple[list[nn.Parameter], Callable[[], tuple[Tensor, dict]]]:
        """Parameters and step function of a phase (data must be prepared for it)."""
        if name in ("vae", "decoder"):
            vae = self.nets["vae"].train().to(memory_format=torch.channels_last)
            params = list((vae if name == "vae" else vae.decoder).parameters())
            return params, lambda: self._vae_step(self.bank, name)
        if name == "a2v":
            text, has_text = self._text_embeddings(self.arrays)
            a2v, enc = self.nets["a2v"].train(), self.nets["audio_encoder"].train()
            params = list(a2v.parameters()) + list(enc.parameters())
            return params, lambda: self._a2v_step(self.arrays, text, has_text)
        if name == "sr":
            return list(self.nets["sr"].train().parameters()), lambda: self._sr_step(self.arrays)
        if name == "expression":
            refs, targets, emb = self._expression_data()
            params = list(self.nets["expression"].train().parameters())
            return params, lambda: self._expression_step(refs, targets, emb)
        if name == "mouth":
            data = self._mouth_data()
            return list(self.nets["mouth"].train().parameters()), lambda: self._mouth_step(data)
        crops, targets = self._readout_data()
        params = list(self.readout.train().parameters())
        return params, lambda: self._readout_step(crops, targets)

    def run(self) -> Path:
        """Run every phase not done yet and export the weights into ``out``."""
        self.prepare_pixels()
        if "vae" not in self.done:
            self.run_phase("vae", *self._phase("vae"))
        self.prepare_latents()
        for name in PHASES[1:]:  # after the VAE and the latents it makes
            if name not in self.done:
                self.run_phase(name, *self._phase(name))
        self.export(self.out)
        return self.out

    def overfit(self, name: str, steps: int, lr: float | None = None) -> list[float]:
        """Sanity check: optimise one phase on one fixed batch; returns the loss per step.

        The batch is fixed by restoring the sampling generator before every step, so the same
        clips, windows, timesteps and noise come back each time. Data must be prepared.
        """
        params, step_fn = self._phase(name)
        opt = torch.optim.AdamW(params, lr=lr or getattr(self.cfg, name).lr)
        state = self.gen.get_state()
        losses = []
        for _ in range(steps):
            self.gen.set_state(state)
            loss, _ = step_fn()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, getattr(self.cfg, name).clip_grad)
            opt.step()
            losses.append(float(loss.detach()))
        return losses

    def _text_embeddings(self, arrays: list[ClipArrays]) -> tuple[Tensor, Tensor]:
        """Embeddings of ``PROMPT_VARIANTS`` prompts per clip: ``(N, K, D)`` and ``(N, K)`` bool.

        Variant 0 is the clip's own prompt; the others describe the same style with freshly drawn
        training phrases, so the model learns what the words mean, not one sentence per clip.
        """
        prompts = []
        for k, a in enumerate(arrays):
            rng = np.random.default_rng([self.cfg.seed, k, 0x7E47])
            prompts.append(a.prompt)
            prompts.extend(describe(a.style, rng) for _ in range(PROMPT_VARIANTS - 1))
        has = torch.tensor([bool(p.strip()) for p in prompts]).view(len(arrays), -1)
        emb = self.nets["text_encoder"].encode([p if p.strip() else "-" for p in prompts])
        return emb.view(len(arrays), PROMPT_VARIANTS, -1), has

    def _counter(self, desc: str, total: int) -> Callable[[int], None] | None:
        if not self.progress:
            return None
        bar = progress_bar(total=total, desc=desc, dynamic_ncols=True)

        def update(done: int) -> None:
            bar.update(done - bar.n)
            if done >= total:
                bar.close()

        return update

    def export(self, folder: Path) -> None:
        """fp16 weights of all seven networks and the readout, as ``load_modules`` reads them."""
        for name, field in STUDIO_MODULES.items():
            net = self.nets[name]
            Module(name, getattr(self.family, field), net).save(folder, dtype=torch.float16)
        save_readout(self.readout, folder)
        summary = {
            "recipe": self.cfg.model_dump(mode="json"),
            "clips_used": len(self.paths),
            "frames_used": sum(a.num_frames for a in self.arrays),
            "latent_scale": self.latent_scale,
            "sec_per_step": self.step_seconds,
            "final_loss_ema": self.final_loss,
            "phases_done": self.done,
            "wall_seconds_this_run": time.perf_counter() - self.t_start,
        }
        (folder / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def train(
    cfg: TrainConfig,
    out: Path,
    data: Path | None = None,
    resume: bool = False,
    progress: bool = True,
) -> Path:
    """Run (or resume) a training run; returns the weights folder (``out``)."""
    return Trainer(cfg, out, data, resume, progress).run()
