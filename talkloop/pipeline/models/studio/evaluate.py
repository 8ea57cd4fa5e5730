"""``talkloop eval``: generate held-out studio clips with the real pipeline and score them.

Writes ``eval.json`` (the section-13 figures plus what they were measured on) and ``eval.png``
(a contact sheet: frames over time with the audio envelope and the mouth readout).
Test clips come from the test split: characters, sentences and voices never trained on, and
prompt adherence uses paraphrases held out of training (``talkloop/pipeline/synth/style.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.models.registry import build_pipeline
from talkloop.pipeline.models.studio.data import mouth_crop, neutral_boxes
from talkloop.pipeline.models.studio.family import installed_weights
from talkloop.pipeline.models.studio.readout import load_readout, read_frames
from talkloop.pipeline.synth.dataset import Clip, make_clip
from talkloop.pipeline.synth.style import field_phrases
from talkloop.pipeline.train.metrics import (
    drift_per_minute,
    envelope,
    face_distance,
    frame_changes,
    lipsync,
    seam_ratio,
)

FIELDS = (
    "lipsync_corr",
    "lipsync_lag_ms",
    "lipsync_corr_at_0",
    "lipsync_corr_clip_mean",
    "readout_corr_gt",
    "seam_ratio",
    "seam_ratio_no_i",
    "identity_drift",
    "identity_distance_start",
    "identity_distance_end",
    "prompt_smile_delta",
)
PROMPT_SECONDS = 4.0  # audio used per prompt-adherence generation


class _Frames:
    """Sink that keeps every frame (short clips only)."""

    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def open(self, info: StreamInfo) -> None:
        pass

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        self.frames.append(video.frames.copy())

    def close(self) -> None:
        pass

    abort = close

    def all(self) -> np.ndarray:
        return np.concatenate(self.frames)


class _Drift:
    """Sink for the long generation: face distance per frame and a few frames, nothing else."""

    def __init__(self, reference: np.ndarray, box: np.ndarray, keep_every: int) -> None:
        self.reference, self.box, self.keep_every = reference, box, keep_every
        self.distance: list[float] = []
        self.kept: list[tuple[int, np.ndarray]] = []

    def open(self, info: StreamInfo) -> None:
        pass

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        d = face_distance(video.frames, self.reference, self.box)
        for i, frame in enumerate(video.frames):
            j = video.first_index + i
            if j % self.keep_every == 0:
                self.kept.append((j, frame.copy()))
        self.distance.extend(float(x) for x in d)

    def close(self) -> None:
        pass

    abort = close


def _blocks(audio: np.ndarray, sample_rate: int) -> Iterator[np.ndarray]:
    step = sample_rate  # 1 s blocks: far below the session's 30 s backpressure bound
    for s in range(0, len(audio), step):
        yield audio[s : s + step]


def _generate(
    pipeline: Pipeline, reference: np.ndarray, audio: np.ndarray, prompt: str
) -> np.ndarray:
    sink = _Frames()
    session = pipeline.open_session(reference, prompt, [sink])
    session.render(_blocks(audio, pipeline.config.audio.sample_rate))
    return sink.all()


def _seams(pipeline: Pipeline, frames: int) -> list[int]:
    return [s.start for s in pipeline.timeline.display_order(frames) if s.start > 0]


def _held_out_prompts(count: int) -> tuple[list[str], list[str]]:
    """Smiling and serious paraphrases never used in training prompts."""
    smiling = field_phrases("smile", high=True, held_out=True)
    serious = field_phrases("smile", high=False, held_out=True)
    return list(smiling[:count]), list(serious[:count])


def evaluate(
    config: TalkloopConfig,
    out: Path,
    clips: int = 4,
    minutes: float = 1.0,
    progress: bool = True,
) -> dict[str, object]:
    """Score the model of ``config`` on ``clips`` test clips and a ``minutes``-long generation.

    Returns:
        The dict written to ``out/eval.json``: every name in ``FIELDS`` plus run details.
    """
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    v = config.video
    size = (v.width, v.height)
    pipeline = build_pipeline(config)
    no_i = config.model_copy(update={"schedule": config.schedule.model_copy(update={"i_len": 0})})
    pipeline_no_i = build_pipeline(no_i, pipeline.modules)
    weights = None if config.model.untrained else (config.model.weights or installed_weights())
    readout, readout_trained = load_readout(weights)

    def say(msg: str) -> None:
        if progress:
            print(f"[eval {time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    test = [make_clip("test", i, 0, size=size, fps=v.fps) for i in range(clips)]
    mouth_gen, mouth_true, mouth_gt_read = [], [], []
    changes, seams, changes_no_i, seams_no_i = [], [], [], []
    shown: list[tuple[Clip, np.ndarray, np.ndarray]] = []
    for k, clip in enumerate(test):
        say(f"clip {k + 1}/{clips} ({clip.num_frames} frames)")
        crop = mouth_crop(clip.character, v.width)
        frames = _generate(pipeline, clip.reference, clip.audio, clip.prompt)
        n = min(len(frames), clip.num_frames)
        read = read_frames(readout, frames[:n], crop)
        mouth_gen.append(read[:, 0])
        mouth_true.append(clip.params["mouth_open"][:n])
        mouth_gt_read.append(read_frames(readout, clip.frames[:n], crop)[:, 0])
        changes.append(frame_changes(frames))
        seams.append(_seams(pipeline, len(frames)))
        frames_no_i = _generate(pipeline_no_i, clip.reference, clip.audio, clip.prompt)
        changes_no_i.append(frame_changes(frames_no_i))
        seams_no_i.append(_seams(pipeline_no_i, len(frames_no_i)))
        shown.append((clip, frames[:n], read[:, 0]))
    result: dict[str, object] = {}
    result.update(lipsync(mouth_gen, mouth_true, v.fps))
    gt = lipsync(mouth_gt_read, mouth_true, v.fps, max_lag_ms=0.0)
    result["readout_corr_gt"] = gt["lipsync_corr"]
    result["seam_ratio"] = seam_ratio(changes, seams)
    result["seam_ratio_no_i"] = seam_ratio(changes_no_i, seams_no_i)

    # Prompt adherence: same audio and face, held-out smiling vs serious paraphrases.
    say("prompt adherence")
    clip0 = test[0]
    audio0 = clip0.audio[: int(PROMPT_SECONDS * clip0.sample_rate)]
    smiling, serious = _held_out_prompts(min(2, clips))
    crop0 = mouth_crop(clip0.character, v.width)

    def smile_of(prompt: str) -> float:
        return float(
            read_frames(readout, _generate(pipeline, clip0.reference, audio0, prompt), crop0)[
                :, 1
            ].mean()
        )

    smile_hi = [smile_of(p) for p in smiling]
    smile_lo = [smile_of(p) for p in serious]
    result["prompt_smile_delta"] = float(np.mean(smile_hi) - np.mean(smile_lo))

    # Identity drift over a long generation: test audio looped to the requested length.
    say(f"identity drift over {minutes:g} min")
    drift = _drift(pipeline, test, minutes)
    result.update(drift.pop("figures"))
    result.update(
        {
            "clips": clips,
            "minutes": minutes,
            "fps": v.fps,
            "size": list(size),
            "weights": None if weights is None else str(weights),
            "untrained": config.model.untrained,
            "readout_trained": readout_trained,
            "prompts": {"smiling": smiling, "serious": serious},
            "prompt_smile": {"smiling": smile_hi, "serious": smile_lo},
            "seconds": time.perf_counter() - t0,
        }
    )
    (out / "eval.json").write_text(json.dumps(_finite(result), indent=2) + "\n")
    contact_sheet(out / "eval.png", shown, drift, v.fps)
    say(f"wrote {out / 'eval.json'}")
    return result


def _drift(pipeline: Pipeline, test: list[Clip], minutes: float) -> dict:
    clip0, fps = test[0], pipeline.config.video.fps
    sr = clip0.sample_rate
    need = int(minutes * 60 * sr)
    parts, total = [], 0
    while total < need:
        for c in test:
            parts.append(c.audio)
            total += len(c.audio)
            if total >= need:
                break
    audio = np.concatenate(parts)[:need]
    face, _ = neutral_boxes(clip0.character, pipeline.config.video.width)
    n_frames = max(1, need * fps // sr)
    sink = _Drift(clip0.reference, face, keep_every=max(1, n_frames // 8))
    session = pipeline.open_session(clip0.reference, "", [sink])
    session.render(_blocks(audio, sr))
    dist = np.asarray(sink.distance)
    secs = np.arange(len(dist)) / fps
    edge = max(1, min(len(dist) // 4, 10 * fps))  # first / last 10 s (or quarter)
    return {
        "figures": {
            "identity_drift": drift_per_minute(secs, dist),
            "identity_distance_start": float(dist[:edge].mean()) if len(dist) else 0.0,
            "identity_distance_end": float(dist[-edge:].mean()) if len(dist) else 0.0,
        },
        "distance": dist,
        "kept": sink.kept,
        "reference": clip0.reference,
    }


def _finite(obj: object) -> object:
    """JSON has no NaN: undefined figures become null."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def contact_sheet(
    path: Path,
    shown: list[tuple[Clip, np.ndarray, np.ndarray]],
    drift: dict,
    fps: int,
    columns: int = 8,
) -> None:
    """Frames over time per clip, each above its audio envelope and mouth curves, then drift."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = shown[:3]
    fig = plt.figure(figsize=(columns * 1.4, 2.9 * len(rows) + 2.6))
    grid = fig.add_gridspec(2 * len(rows) + 2, columns, height_ratios=[1.4, 1.0] * (len(rows) + 1))
    for r, (clip, frames, read) in enumerate(rows):
        idx = np.linspace(0, len(frames) - 1, columns).astype(int)
        for c, j in enumerate(idx):
            ax = fig.add_subplot(grid[2 * r, c])
            ax.imshow(frames[j])
            ax.set_axis_off()
            ax.set_title(f"{j / fps:.1f}s", fontsize=7)
        ax = fig.add_subplot(grid[2 * r + 1, :])
        t = np.arange(len(frames)) / fps
        env = envelope(clip.audio, len(frames), fps, clip.sample_rate)
        ax.fill_between(t, 0, env / max(float(env.max()), 1e-6), color="0.85", label="audio")
        ax.plot(t, clip.params["mouth_open"][: len(frames)], "k-", lw=1, label="mouth truth")
        ax.plot(t, read, "r-", lw=1, label="mouth readout")
        ax.set_xlim(0, t[-1] if len(t) > 1 else 1)
        ax.set_title(f"{clip.clip_id}  prompt: {clip.prompt!r}", fontsize=8)
        ax.tick_params(labelsize=7)
        if r == 0:
            ax.legend(fontsize=6, loc="upper right", ncol=3)
    kept = drift["kept"][:columns]
    r = len(rows)
    for c, (j, frame) in enumerate(kept):
        ax = fig.add_subplot(grid[2 * r, c])
        ax.imshow(frame)
        ax.set_axis_off()
        ax.set_title(f"{j / fps / 60:.2f} min", fontsize=7)
    ax = fig.add_subplot(grid[2 * r + 1, :])
    dist = drift["distance"]
    ax.plot(np.arange(len(dist)) / fps / 60, dist, "b-", lw=0.8)
    ax.set_title("face distance to the reference (identity drift) over minutes", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


__all__ = ["FIELDS", "contact_sheet", "evaluate"]
