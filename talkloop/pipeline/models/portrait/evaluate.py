"""Evaluation of the portrait motion generator in parameter space (no frames).

Held-out studio *test* clips (characters' voices, sentences and prompt phrasings never trained
on) are generated through the real chunk timeline: the pipeline's own ``AudioFeatureStage``,
``NContextStage`` / ``IContextStage`` and ``A2VStage`` run chunk by chunk in the order
``Session.step`` runs them (N0, N1, I0, N2, I1, ...; the motion context is the tail of each N
chunk), once with the offline schedule (``ScheduleConfig`` defaults) and once with the live one.
The figures, written to ``eval.json`` with a plot ``eval.png``:

- lip sync: pooled correlation of generated vs true ``mouth_open`` at lag 0 and at the best lag
  within +-1 frame (40 ms at 25 fps), also per mouth field;
- prompt adherence: the same audio under contrasting held-out phrases of one style field at a
  time (smile level, head-motion energy, brow activity, gaze wander), with the truth's contrast
  between test clips of those styles for scale;
- seams: mean parameter change across chunk seams / inside chunks, with and without I chunks;
- pauses: the generated mouth in silent stretches.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from talkloop.pipeline.core.config import SamplerConfig, ScheduleConfig
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.core.schedule import Timeline
from talkloop.pipeline.core.stage import Stage, StageContext
from talkloop.pipeline.models.portrait import family
from talkloop.pipeline.models.portrait.motion import PortraitMotionConfig, load_motion
from talkloop.pipeline.models.portrait.train import load_audio_encoder
from talkloop.pipeline.models.studio.sampling import euler_sample
from talkloop.pipeline.models.studio.text_encoder import StudioTextEncoder, TextEncoderConfig
from talkloop.pipeline.stages.a2v import A2VStage
from talkloop.pipeline.stages.context import AudioFeatureStage, IContextStage, NContextStage
from talkloop.pipeline.studio.dataset import Clip, make_clip
from talkloop.pipeline.studio.params import FRAME_FIELDS, MOUTH_FIELDS
from talkloop.pipeline.studio.style import DESCRIBED_ABOVE, DESCRIBED_BELOW, field_phrases
from talkloop.pipeline.train.data import audio_windows
from talkloop.pipeline.train.metrics import envelope, lag_correlations, lipsync, seam_ratio

# The family's live schedule and sampler, as `talkloop serve` applies them.
LIVE_SCHEDULE = ScheduleConfig(**family.LIVE_SCHEDULE)
LIVE_SAMPLER = SamplerConfig(**family.LIVE_SAMPLER)
OFFLINE_SCHEDULE = ScheduleConfig()
OFFLINE_SAMPLER = SamplerConfig()
FIELD = {name: i for i, name in enumerate(FRAME_FIELDS)}
# Style field -> (what is measured, generated series -> one number per generation).
STYLE_MEASURES = {
    "smile": "mean smile",
    "energy": "head motion energy: std of yaw and pitch velocity (rad/frame)",
    "brows": "brow activity: mean + std of brow_raise",
    "gaze": "gaze wander: mean |gaze_x, gaze_y|",
}


def style_measure(field: str, params: np.ndarray) -> float:
    """One number per generation for a style field (``STYLE_MEASURES``), from ``(T, 16)``."""
    if field == "smile":
        return float(params[:, FIELD["smile"]].mean())
    if field == "energy":
        vel = np.diff(params[:, [FIELD["yaw"], FIELD["pitch"]]], axis=0)
        return float(vel.std(axis=0).mean())
    if field == "brows":
        b = params[:, FIELD["brow_raise"]]
        return float(b.mean() + b.std())
    if field == "gaze":
        return float(np.hypot(params[:, FIELD["gaze_x"]], params[:, FIELD["gaze_y"]]).mean())
    raise ValueError(f"unknown style field {field!r}; known: {sorted(STYLE_MEASURES)}")


@dataclass
class Generated:
    """Parameters of one generation in display order and where its display segments start."""

    params: np.ndarray  # (T, 16) float32 raw units, clipped to the valid ranges
    seams: list[int]  # display frames where a new segment (another chunk) starts


class MotionRunner:
    """Runs the pipeline's N/I chunk stages over the motion module, one clip at a time.

    Args:
        modules: ``audio_encoder`` and ``a2v`` (the portrait motion module).
        seed: noise seed (the session seed of the pipeline).
    """

    def __init__(self, modules: Mapping[str, Module], seed: int = 0) -> None:
        self.modules = modules
        self.seed = seed
        self.cfg: PortraitMotionConfig = modules["a2v"].config

    def _run(self, stages: list[Stage], work: dict) -> None:
        for stage in stages:
            stage.run(StageContext(stage, work, None, self.modules, frozenset()))

    @torch.no_grad()
    def generate(
        self,
        audio: np.ndarray,
        frames: int,
        text: torch.Tensor | None,
        schedule: ScheduleConfig,
        sampler: SamplerConfig,
        fps: int = 25,
        rest: np.ndarray | None = None,
    ) -> Generated:
        """Generate ``frames`` frames of parameters for ``audio`` (16 kHz mono float32).

        Args:
            text: ``(1, 384)`` prompt embedding or None (no prompt).
            rest: ``(16,)`` raw rest parameters of the reference (None: neutral).
        """
        enc = self.modules["audio_encoder"].net.cfg
        windows = audio_windows(
            audio, frames, fps, enc.sample_rate, enc.window_samples, enc.lookahead_samples
        ).numpy()
        timeline = Timeline(schedule)
        ref = self.cfg.rest_latent(rest)  # (1, 16, 1, 1)
        a2v = A2VStage(sampler)
        session = {"seed": self.seed, "ref_latent_lr": ref, "text_embedding": text}
        norm, ctx_lat, ctx_aud = None, None, None
        out = np.zeros((frames, len(FRAME_FIELDS)), np.float32)
        seams: list[int] = []
        for n in timeline.n_chunks(frames):
            work = {
                **session,
                "job": n,
                "audio_windows": windows[n.start : n.stop],
                "audio_norm": norm,
                "context_latents": ctx_lat,
                "context_audio": ctx_aud,
            }
            self._run([AudioFeatureStage(), NContextStage(), a2v], work)
            norm, latents, chunk_audio = work["audio_norm"], work["latents"], work["chunk_audio"]
            segments = timeline.segments_after(n)
            if len(segments) == 2:  # an I chunk redoes the first frames of n
                i_job = segments[0].source
                i_work = {
                    **session,
                    "job": i_job,
                    "next_latents": latents,
                    "next_audio": chunk_audio,
                    "context_latents": ctx_lat,
                    "context_audio": ctx_aud,
                }
                self._run([IContextStage(), a2v], i_work)
                display = torch.cat([i_work["latents"], latents[i_job.length :]])
            else:
                display = latents
            seams.extend(s.start for s in segments if s.start > 0)
            k = min(schedule.ctx_len, latents.shape[0])
            ctx_lat, ctx_aud = latents[-k:].clone(), chunk_audio[-k:].clone()
            out[n.start : n.stop] = self.cfg.denormalise(display)
        return Generated(out, seams)


@torch.no_grad()
def time_chunks(module: Module, repeats: int = 40) -> dict[str, dict[str, float]]:
    """Median wall time of the motion net's sampling for one chunk: live (a chunk of the live
    schedule after its context frames, the live steps) and offline (24 new after 2, 3 steps); ms
    per chunk and per generated frame, on whatever threads torch has."""
    net, cfg = module.net, module.config
    live = (LIVE_SCHEDULE.ctx_len, LIVE_SCHEDULE.n_len, LIVE_SAMPLER.steps)
    plans = {f"live_{live[1]}_after_{live[0]}": live, "offline_24_after_2": (2, 24, 3)}
    out = {}
    for name, (ctx, n, steps) in plans.items():
        f = ctx + n
        g = torch.Generator().manual_seed(0)
        mask = torch.zeros(1, f, dtype=torch.bool)
        mask[0, :ctx] = True
        pos = torch.arange(-ctx, n, dtype=torch.float32)[None]
        args = (
            torch.randn(1, f, 16, 1, 1, generator=g),
            mask,
            pos,
            cfg.rest_latent(),
            torch.randn(1, f, cfg.audio_dim, generator=g),
            torch.randn(1, cfg.text_dim, generator=g),
            torch.randn(1, f, 16, 1, 1, generator=g),
        )
        times = []
        for k in range(repeats + 5):
            t = time.perf_counter()
            euler_sample(net, *args, steps=steps, shift=3.0)
            if k >= 5:  # warm-up calls excluded
                times.append(time.perf_counter() - t)
        ms = 1000.0 * float(np.median(times))
        out[name] = {"steps": steps, "ms_per_chunk": ms, "ms_per_frame": ms / n}
    return out


def load_runner(weights: Path, seed: int = 0) -> MotionRunner:
    """A runner over a portrait weights folder (``a2v.*`` and ``audio_encoder.*``)."""
    return MotionRunner({"a2v": load_motion(weights), "audio_encoder": _encoder(weights)}, seed)


def _encoder(folder: Path) -> Module:
    net = load_audio_encoder(folder)
    return Module("audio_encoder", net.cfg, net)


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 1e-12 else 0.0


def pause_frames(clip: Clip, min_frames: int = 5, margin: int = 2) -> np.ndarray:
    """(T,) bool: frames inside silent stretches of at least ``min_frames`` frames, ``margin``
    frames in from either end (co-articulation and the features' look-ahead reach that far)."""
    env = envelope(clip.audio, clip.num_frames, clip.fps, clip.sample_rate)
    quiet = env < 1e-3 * max(float(env.max()), 1e-6)
    out = np.zeros_like(quiet)
    j = 0
    while j < len(quiet):
        if not quiet[j]:
            j += 1
            continue
        k = j
        while k < len(quiet) and quiet[k]:
            k += 1
        if k - j >= min_frames:
            out[j + margin : k - margin] = True
        j = k
    return out


def _seam_figures(runs: list[Generated], truth: list[np.ndarray], std: np.ndarray) -> dict:
    """Seam ratios of all fields (normalised change) and of mouth_open alone; the truth's
    ratio at the same frames shows what the content alone gives (about 1)."""

    def change(p: np.ndarray) -> np.ndarray:
        return np.abs(np.diff(p / std, axis=0)).mean(axis=1)

    seams = [r.seams for r in runs]
    mo = FIELD["mouth_open"]
    return {
        "all_fields": seam_ratio([change(r.params) for r in runs], seams),
        "mouth_open": seam_ratio([np.abs(np.diff(r.params[:, mo])) for r in runs], seams),
        "truth_all_fields": seam_ratio([change(t) for t in truth], seams),
    }


def evaluate_motion(
    weights: Path,
    out: Path,
    clips: int = 24,
    prompt_clips: int = 6,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Score a portrait weights folder; writes ``out/eval.json`` and ``out/eval.png``.

    Args:
        weights: folder with ``a2v.*`` and ``audio_encoder.*`` (the portrait weights).
        out: output folder.
        clips: test clips for lip sync, seams and pauses (each run offline and live).
        prompt_clips: test clips whose audio every contrasting prompt is run on.
        seed: noise seed of the generations.
    Returns:
        The figures written to ``eval.json``.
    """
    if clips < 1 or prompt_clips < 1:
        raise ConfigError(f"clips and prompt_clips must be >= 1, got {clips} and {prompt_clips}")
    weights, out = Path(weights), Path(out)
    t0 = time.perf_counter()
    runner = load_runner(weights, seed)
    text_enc = StudioTextEncoder(TextEncoderConfig())
    std = np.asarray(runner.cfg.std, np.float32)
    say = print if progress else (lambda *a, **k: None)

    test = [make_clip("test", i, 0, render=False) for i in range(max(clips, prompt_clips))]
    prompts = [c.prompt for c in test[:clips]]
    embs = text_enc.encode([p if p.strip() else "-" for p in prompts])
    truth = [c.params.values for c in test[:clips]]
    runs: dict[str, list[Generated]] = {
        "offline": [],
        "live": [],
        "offline_no_i": [],
        "live_no_i": [],
    }
    plans = {
        "offline": (OFFLINE_SCHEDULE, OFFLINE_SAMPLER),
        "live": (LIVE_SCHEDULE, LIVE_SAMPLER),
        "offline_no_i": (OFFLINE_SCHEDULE.model_copy(update={"i_len": 0}), OFFLINE_SAMPLER),
        "live_no_i": (LIVE_SCHEDULE.model_copy(update={"i_len": 0}), LIVE_SAMPLER),
    }
    gen_seconds, gen_frames = 0.0, 0
    for k, clip in enumerate(test[:clips]):
        text = embs[k : k + 1] if prompts[k].strip() else None
        for name, (schedule, sampler) in plans.items():
            t = time.perf_counter()
            runs[name].append(
                runner.generate(clip.audio, clip.num_frames, text, schedule, sampler, clip.fps)
            )
            gen_seconds += time.perf_counter() - t
            gen_frames += clip.num_frames
        say(f"clip {k + 1}/{clips} done")

    result: dict = {"weights": str(weights), "clips": clips, "fps": test[0].fps}
    # (a) lip sync, per schedule; every mouth field's lag-0 correlation too.
    for name in ("offline", "live"):
        mo = FIELD["mouth_open"]
        ls = lipsync(
            [r.params[:, mo] for r in runs[name]], [t[:, mo] for t in truth], 25, max_lag_ms=40.0
        )
        result[f"lipsync_{name}"] = ls
        result[f"mouth_fields_corr_{name}"] = {
            f: _pearson(
                np.concatenate(
                    [r.params[:, FIELD[f]] - r.params[:, FIELD[f]].mean() for r in runs[name]]
                ),
                np.concatenate([t[:, FIELD[f]] - t[:, FIELD[f]].mean() for t in truth]),
            )
            for f in MOUTH_FIELDS
        }
    # (c) seams with and without I chunks.
    result["seams"] = {name: _seam_figures(runs[name], truth, std) for name in plans}
    # (d) mouth in pauses.
    pauses = [pause_frames(c) for c in test[:clips]]
    mo = FIELD["mouth_open"]
    gen_p = np.concatenate([r.params[p, mo] for r, p in zip(runs["offline"], pauses, strict=True)])
    live_p = np.concatenate([r.params[p, mo] for r, p in zip(runs["live"], pauses, strict=True)])
    true_p = np.concatenate([t[p, mo] for t, p in zip(truth, pauses, strict=True)])
    speech = np.concatenate(
        [r.params[~p, mo] for r, p in zip(runs["offline"], pauses, strict=True)]
    )
    result["pauses"] = {
        "frames": int(gen_p.size),
        "mouth_open_mean_offline": float(gen_p.mean()) if gen_p.size else None,
        "mouth_open_mean_live": float(live_p.mean()) if live_p.size else None,
        "closed_fraction_offline": float((gen_p < 0.1).mean()) if gen_p.size else None,
        "mouth_open_mean_truth": float(true_p.mean()) if true_p.size else None,
        "mouth_open_mean_elsewhere_offline": float(speech.mean()),
    }
    # (b) prompt adherence: same audio, contrasting held-out phrases of one field at a time.
    prompt_rows: dict = {}
    for field in STYLE_MEASURES:
        low_p, high_p = field_phrases(field, False, True), field_phrases(field, True, True)
        emb = text_enc.encode(list(low_p) + list(high_p))
        values = {"low": [], "high": []}
        for clip in test[:prompt_clips]:
            for j in range(len(low_p) + len(high_p)):
                g = runner.generate(
                    clip.audio,
                    clip.num_frames,
                    emb[j : j + 1],
                    OFFLINE_SCHEDULE,
                    OFFLINE_SAMPLER,
                    clip.fps,
                )
                values["low" if j < len(low_p) else "high"].append(style_measure(field, g.params))
        no_prompt = [
            style_measure(field, r.params)
            for r, p in zip(runs["offline"], prompts, strict=True)
            if not p.strip()
        ]
        style_vals = np.array([getattr(c.style, field) for c in test[:clips]])
        true_vals = np.array([style_measure(field, t) for t in truth])
        lo_t, hi_t = (
            true_vals[style_vals < DESCRIBED_BELOW],
            true_vals[style_vals > DESCRIBED_ABOVE],
        )
        lo, hi = float(np.mean(values["low"])), float(np.mean(values["high"]))
        prompt_rows[field] = {
            "measure": STYLE_MEASURES[field],
            "low_phrases": list(low_p),
            "high_phrases": list(high_p),
            "low": lo,
            "high": hi,
            "delta": hi - lo,
            "ratio": hi / lo if abs(lo) > 1e-9 else None,
            "no_prompt_mean": float(np.mean(no_prompt)) if no_prompt else None,
            "truth_low": float(lo_t.mean()) if lo_t.size else None,
            "truth_high": float(hi_t.mean()) if hi_t.size else None,
            "truth_clips_low_high": [int(lo_t.size), int(hi_t.size)],
        }
        say(f"prompt field {field}: low {lo:.4f} high {hi:.4f}")
    result["prompt"] = prompt_rows
    result["generation_ms_per_frame"] = 1000.0 * gen_seconds / max(1, gen_frames)
    result["chunk_timing"] = time_chunks(runner.modules["a2v"])
    result["torch_threads"] = torch.get_num_threads()
    result["seconds"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, runs, truth, test[:clips], out / "eval.png")
    return result


def plot(
    result: dict,
    runs: dict[str, list[Generated]],
    truth: list[np.ndarray],
    clips: list[Clip],
    path: Path,
) -> None:
    """mouth_open over time (truth, offline, live) for three clips, the lag curve, prompt
    contrasts and seam ratios, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mo = FIELD["mouth_open"]
    fig = plt.figure(figsize=(14, 11))
    shown = min(3, len(clips))
    for k in range(shown):
        ax = fig.add_subplot(shown + 1, 1, k + 1)
        t = np.arange(clips[k].num_frames) / clips[k].fps
        env = envelope(clips[k].audio, clips[k].num_frames, clips[k].fps, clips[k].sample_rate)
        ax.fill_between(t, 0, env / max(float(env.max()), 1e-6), color="0.88", label="audio RMS")
        ax.plot(t, truth[k][:, mo], "k", lw=2, label="truth")
        ax.plot(
            t,
            runs["offline"][k].params[:, mo],
            "C0",
            label=f"offline ({OFFLINE_SCHEDULE.n_len}/{OFFLINE_SAMPLER.steps})",
        )
        ax.plot(
            t,
            runs["live"][k].params[:, mo],
            "C1",
            label=f"live ({LIVE_SCHEDULE.n_len}/{LIVE_SAMPLER.steps})",
        )
        for s in runs["live"][k].seams:
            ax.axvline(s / clips[k].fps, color="C1", alpha=0.15, lw=0.8)
        ax.set_ylabel("mouth_open")
        ax.set_title(f"{clips[k].clip_id}: {clips[k].prompt or '(no prompt)'}", fontsize=9)
        if k == 0:
            ax.legend(loc="upper right", fontsize=8, ncol=4)
    ax = fig.add_subplot(shown + 1, 3, 3 * shown + 1)
    for name, color in (("offline", "C0"), ("live", "C1")):
        lags, corrs = lag_correlations(
            [r.params[:, mo] for r in runs[name]], [t[:, mo] for t in truth], 5
        )
        ax.plot(lags * 40, corrs, "o-", color=color, label=name)
    ax.axhline(0.8, color="0.5", ls="--", lw=0.8)
    ax.set_xlabel("lag (ms, + = late)")
    ax.set_ylabel("mouth_open r")
    ax.legend(fontsize=8)
    ax = fig.add_subplot(shown + 1, 3, 3 * shown + 2)
    fields = list(result["prompt"])
    x = np.arange(len(fields))
    rows = [result["prompt"][f] for f in fields]
    truth_delta = [
        (r["truth_high"] - r["truth_low"])
        if None not in (r["truth_high"], r["truth_low"])
        else None
        for r in rows
    ]
    scale = [abs(t) if t else 1.0 for t in truth_delta]
    ax.bar(
        x - 0.2,
        [r["delta"] / s for r, s in zip(rows, scale, strict=True)],
        0.4,
        label="generated: high - low prompt",
    )
    ax.bar(
        x + 0.2,
        [(t or 0.0) / s for t, s in zip(truth_delta, scale, strict=True)],
        0.4,
        label="truth: high - low style clips",
    )
    ax.axhline(0.0, color="0.3", lw=0.8)
    ax.set_xticks(x, fields)
    ax.set_title("prompt contrast, in units of the truth's contrast", fontsize=9)
    ax.legend(fontsize=7)
    ax = fig.add_subplot(shown + 1, 3, 3 * shown + 3)
    names = list(result["seams"])
    x = np.arange(len(names))
    ax.bar(x - 0.2, [result["seams"][n]["all_fields"] for n in names], 0.4, label="all fields")
    ax.bar(x + 0.2, [result["seams"][n]["mouth_open"] for n in names], 0.4, label="mouth_open")
    ax.axhline(1.0, color="0.5", ls="--", lw=0.8)
    ax.set_xticks(x, names, fontsize=7)
    ax.set_title("change across seams / inside chunks", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """``python -m talkloop.pipeline.models.portrait.evaluate --weights W --out O [--clips N]``."""
    import argparse

    parser = argparse.ArgumentParser(description="score portrait motion weights (JSON + PNG)")
    parser.add_argument("--weights", type=Path, required=True, help="portrait weights folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for eval.json, eval.png")
    parser.add_argument("--clips", type=int, default=24, help="test clips (lip sync, seams)")
    parser.add_argument("--prompt-clips", type=int, default=6, help="test clips per prompt")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    r = evaluate_motion(args.weights, args.out, args.clips, args.prompt_clips)
    for name in ("offline", "live"):
        ls = r[f"lipsync_{name}"]
        print(
            f"{name}: mouth_open r {ls['lipsync_corr']:.3f} at {ls['lipsync_lag_ms']:+.0f} ms, "
            f"{ls['lipsync_corr_at_0']:.3f} at 0 ms"
        )
    for field, row in r["prompt"].items():
        print(f"prompt {field}: low {row['low']:.4f} high {row['high']:.4f}")
    print(f"wrote {args.out / 'eval.json'} and {args.out / 'eval.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["Generated", "MotionRunner", "evaluate_motion", "load_runner", "pause_frames"]
