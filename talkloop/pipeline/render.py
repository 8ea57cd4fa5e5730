"""Offline render: an audio file (and a reference image) in, an mp4 out."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from talkloop.pipeline.audio.io import check_audio_file, load_audio
from talkloop.pipeline.audio.reader import AudioReader
from talkloop.pipeline.console import progress_bar
from talkloop.pipeline.core.clock import frames_for_samples
from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.errors import InputError
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.models.registry import build_pipeline, load_reference
from talkloop.pipeline.offload.distributed import is_publisher
from talkloop.pipeline.outputs.background import BackgroundSink
from talkloop.pipeline.outputs.fullband import FullBandSink
from talkloop.pipeline.outputs.mp4 import Mp4Sink
from talkloop.pipeline.outputs.sink import Sink

AUDIO_BLOCK_SECONDS = 1.0
FULL_BAND_RATE = (
    48000  # the mp4's audio: what live calls send too (talkloop/agent/session.py OUTPUT_RATE)
)


@dataclass
class RenderResult:
    path: Path
    frames: int
    media_seconds: float
    wall_seconds: float
    interrupted: bool = False

    @property
    def rtf(self) -> float:
        return self.wall_seconds / max(self.media_seconds, 1e-9)


def check_output_path(out: str | os.PathLike[str]) -> Path:
    """Fail early (before any model loads) on an output path that cannot be written."""
    p = Path(out)
    if p.suffix.lower() != ".mp4":
        raise InputError(f"output must be an .mp4 file, got {p}")
    if p.is_dir():
        raise InputError(f"output path is a directory: {p}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"output directory does not exist: {parent}")
    if not os.access(parent, os.W_OK):
        raise InputError(f"output directory is not writable: {parent}")
    return p


def audio_blocks(samples: np.ndarray, sample_rate: int) -> Iterator[np.ndarray]:
    block = int(sample_rate * AUDIO_BLOCK_SECONDS)
    for i in range(0, samples.shape[0], block):
        yield samples[i : i + block]


class ProgressSink:
    """Shows a progress bar with generation fps and real-time factor (on a terminal only)."""

    def __init__(self, total_frames: int, enabled: bool = True) -> None:
        self.total = total_frames
        self.enabled = enabled
        self.bar: tqdm | None = None
        self.t0 = 0.0
        self.fps = 25

    def open(self, info: StreamInfo) -> None:
        self.fps = info.fps
        self.t0 = time.perf_counter()
        self.bar = progress_bar(
            total=self.total, unit="frame", enabled=self.enabled, dynamic_ncols=True
        )

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        assert self.bar is not None
        self.bar.update(len(video))
        elapsed = time.perf_counter() - self.t0
        media = (video.first_index + len(video)) / self.fps
        self.bar.set_postfix(
            fps=f"{self.bar.n / max(elapsed, 1e-9):.1f}", rtf=f"{elapsed / media:.2f}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    abort = close


def full_band(sink: Sink, audio_path: str | os.PathLike[str]) -> FullBandSink:
    """``sink`` fed with ``audio_path``'s audio at ``FULL_BAND_RATE`` (48 kHz)."""
    reader = AudioReader(audio_path, FULL_BAND_RATE)
    return FullBandSink(sink, FULL_BAND_RATE, reader.read, release=reader.close)


def render_file(
    config: TalkloopConfig,
    audio_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    reference: str | os.PathLike[str] | np.ndarray | None = None,
    prompt: str = "",
    progress: bool = False,
    pipeline: Pipeline | None = None,
    extra_sinks: Sequence[Sink] = (),
) -> RenderResult:
    """Render ``audio_path`` to ``out_path``. Inputs are checked before any model is loaded:
    the output path, the prompt, the audio file (opened and its first packets decoded), then the
    reference (a photo's face needs the small face models), then the whole audio.

    On Ctrl-C or SIGTERM (raised as KeyboardInterrupt) the mp4 of what was produced so far is
    finalised and the result says ``interrupted``; on any other error no file is left at
    ``out_path``. ``extra_sinks`` (a KVS mirror) get the same stream after the mp4.
    """
    out = check_output_path(out_path)
    if not isinstance(prompt, str):
        raise InputError(f"prompt must be text, got {type(prompt).__name__}")
    check_audio_file(audio_path)  # cheap, before the reference's face models or any network
    v = config.video
    image = load_reference(config, reference)  # None: the family's default avatar
    samples = load_audio(audio_path, config.audio.sample_rate)
    if pipeline is None:
        pipeline = build_pipeline(config)
    total = frames_for_samples(samples.shape[0], v.fps, config.audio.sample_rate)
    sinks: list = []
    if is_publisher():  # torchrun: every rank computes its shards, only rank 0 publishes
        mp4 = Mp4Sink(out, crf=config.output.crf, preset=config.output.preset)
        # The mp4 and mirrors get the file's audio at full band, not the model's 16 kHz; each
        # reads the file as it goes. Encoding runs on its own thread, overlapping the next
        # chunk's generation (the mp4's full-band decode too).
        sinks = [
            BackgroundSink(full_band(mp4, audio_path)),
            ProgressSink(total, progress),
            *(full_band(s, audio_path) for s in extra_sinks),
        ]
    session = pipeline.open_session(image, prompt, sinks)
    t0 = time.perf_counter()
    interrupted = False
    try:
        session.render(audio_blocks(samples, config.audio.sample_rate))
    except KeyboardInterrupt:
        interrupted = True
    frames = session.stats.frames
    return RenderResult(out, frames, frames / v.fps, time.perf_counter() - t0, interrupted)
