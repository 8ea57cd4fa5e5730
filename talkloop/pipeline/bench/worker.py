"""One measured bench run, in its own process so that peak RSS belongs to that run alone.

``python -m talkloop.pipeline.bench.worker SPEC.json RESULT.json`` where SPEC holds the config, the mode
(``ours``, ``naive`` or ``ttff``) and the duration.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from talkloop.pipeline.assets import HELLO_WAV
from talkloop.pipeline.audio.io import load_audio
from talkloop.pipeline.backends.report import describe
from talkloop.pipeline.bench.memory import memory_trend
from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.errors import InputError
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.core.stage import Stage, StageContext
from talkloop.pipeline.models.registry import family_phases, load_modules, load_reference
from talkloop.pipeline.outputs.background import BackgroundSink
from talkloop.pipeline.outputs.mp4 import Mp4Sink

PAGE = resource.getpagesize()


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def bench_reference(config: TalkloopConfig) -> np.ndarray:
    """The family's default avatar, else a deterministic test card (the bench measures speed and
    memory, not looks)."""

    try:
        return load_reference(config, None)
    except InputError:  # no default avatar installed
        pass
    width, height = config.video.width, config.video.height
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], -1)
    r2 = (x - width / 2) ** 2 + (y - height / 2.2) ** 2
    img[r2 < (min(width, height) / 3.2) ** 2] = (224, 180, 150)
    return img.astype(np.uint8)


def looped_speech(
    sample_rate: int, seconds: float, block_seconds: float = 1.0
) -> Iterator[np.ndarray]:
    """The bundled speech clip, looped, as blocks: never the whole duration in memory."""
    clip = load_audio(HELLO_WAV, sample_rate)
    total, block, pos = int(round(seconds * sample_rate)), int(block_seconds * sample_rate), 0
    while pos < total:
        n = min(block, total - pos)
        idx = np.arange(pos, pos + n) % clip.shape[0]
        yield clip[idx]
        pos += n


class MemoryProbe:
    """A sink that records RSS against generated seconds, at most once per media second."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.fps = 25

    def open(self, info: StreamInfo) -> None:
        self.fps = info.fps
        self.samples.append((0.0, rss_mb()))

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        t = (video.first_index + len(video)) / self.fps
        if t - self.samples[-1][0] >= 1.0:
            self.samples.append((t, rss_mb()))

    def close(self) -> None:
        pass

    abort = close


class HoardingSink:
    """The naive baseline's output: every frame and sample kept until the end, then encoded."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.frames: list[np.ndarray] = []
        self.audio: list[np.ndarray] = []
        self.info: StreamInfo | None = None

    def open(self, info: StreamInfo) -> None:
        self.info = info

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        self.frames.append(video.frames.copy())
        self.audio.append(audio.samples.copy())

    def close(self) -> None:
        assert self.info is not None
        mp4 = Mp4Sink(self.path, preset="veryfast")
        mp4.open(self.info)
        first = 0
        sample = 0
        for frames, audio in zip(self.frames, self.audio, strict=True):
            mp4.write(VideoChunk(frames, first), AudioChunk(audio, sample))
            first += frames.shape[0]
            sample += audio.shape[0]
        mp4.close()

    def abort(self) -> None:
        self.frames.clear()
        self.audio.clear()


class HoardLatents(Stage):
    """The naive baseline keeps every low-res and high-res latent it ever made."""

    name = "hoard_latents"
    reads = ("segment_latents",)

    def __init__(self) -> None:
        self.kept: list = []

    def run(self, ctx: StageContext) -> None:
        self.kept.append(ctx.read("segment_latents").clone())


def run(spec: dict) -> dict:
    config = TalkloopConfig.model_validate(spec["config"])
    mode, seconds = spec["mode"], float(spec["seconds"])
    phases = family_phases(config)
    if mode == "naive":
        publish = phases["publish"]
        publish.stages = [HoardLatents(), *publish.stages]

    pipeline = Pipeline(config, load_modules(config), phases)
    # What --backend auto and --dtype auto chose here: {"backend", "dtype", "int8"}.
    runtime = describe(pipeline.modules, pipeline.compute_dtype)
    reference = bench_reference(config)
    rate = config.audio.sample_rate
    if mode == "ttff":
        return {
            "ttff_ms": [measure_ttff(pipeline, reference) for _ in range(int(spec["repeats"]) + 1)][
                1:
            ],
            "runtime": runtime,
        }
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.mp4"
        probe = MemoryProbe()
        if mode == "naive":
            sink = HoardingSink(out)
        else:
            sink = BackgroundSink(Mp4Sink(out, crf=config.output.crf, preset=config.output.preset))
        session = pipeline.open_session(reference, "", [probe, sink])
        t0 = time.perf_counter()
        session.render(looped_speech(rate, seconds))
        wall = time.perf_counter() - t0
        frames = session.stats.frames
        stage_rtf = session.stats.stage_rtf(config.video.fps)
    media = frames / config.video.fps
    return {
        "mode": mode,
        "seconds": seconds,
        "frames": frames,
        "wall_s": wall,
        "rtf": wall / media,
        "fps": frames / wall,
        "peak_rss_mb": peak_rss_mb(),
        "torch_threads": torch.get_num_threads(),
        "runtime": runtime,
        # Where the time goes: seconds of each "phase/stage" per second of video (their sum is
        # at most rtf). On CUDA a stage's figure is its launches plus any wait it causes.
        "stage_rtf": stage_rtf,
        # RSS growth in the first WARMUP_S of video, then the slope of the rest (bench/memory.py)
        **memory_trend(probe.samples),
        "samples": probe.samples,
    }


def measure_ttff(pipeline: Pipeline, reference: np.ndarray) -> float:
    """Audio pushed in 20 ms packets at real-time pace; ms from the first packet to the first frame."""
    rate = pipeline.config.audio.sample_rate
    session = pipeline.open_session(reference, "", [])
    packets = list(looped_speech(rate, 3.0, block_seconds=0.02))

    def feed() -> None:
        start = time.perf_counter()
        for i, packet in enumerate(packets):
            time.sleep(max(0.0, start + i * 0.02 - time.perf_counter()))
            session.push_audio(packet)
        session.end_audio()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    session.run_live()
    feeder.join()
    ttff = session.stats.ttff_ms
    assert ttff is not None
    return ttff


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(run(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
