"""Shared helpers for the mp4 sink tests: render a clip and read back what a player would see."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.outputs.mp4 import Mp4Sink

from support import tone


def make_frame(j: int, height: int, width: int) -> np.ndarray:
    """A frame that changes every index (a moving bar on a shifting background)."""
    frame = np.empty((height, width, 3), np.uint8)
    frame[...] = (j * 7) % 256, (j * 3) % 256, 128
    x = (j * 4) % max(1, width - 16)
    frame[:, x : x + 16] = 255
    return frame


def make_audio(num_samples: int, sample_rate: int, seed: int = 0) -> np.ndarray:
    """Band-limited noise plus a tone: something AAC keeps and correlation can align."""
    rng = np.random.default_rng(seed)
    noise = np.convolve(rng.standard_normal(num_samples), np.ones(8) / 8, mode="same")
    sine = tone(num_samples, sample_rate, hz=220, amp=0.3, dtype=np.float64)
    return (0.4 * noise + sine).astype(np.float32)


def render(
    sink: Mp4Sink,
    info: StreamInfo,
    num_frames: int,
    audio: np.ndarray,
    chunk: int = 7,
) -> None:
    """Open the sink and write ``num_frames`` frames in segments of ``chunk`` with their audio.

    The last segment also carries whatever audio is left after the last frame's start.
    """
    sink.open(info)
    for k in range(0, num_frames, chunk):
        m = min(chunk, num_frames - k)
        frames = np.stack([make_frame(k + i, info.height, info.width) for i in range(m)])
        a0 = info.frame_pts(k)
        a1 = info.frame_pts(k + m) if k + m < num_frames else audio.shape[0]
        sink.write(VideoChunk(frames, k), AudioChunk(audio[a0:a1], a0))


@dataclass
class Probe:
    codecs: dict[str, str]
    start_times: dict[str, int | None]
    first_pts: dict[str, int]
    end_pts: dict[str, int]  # last packet pts + duration, in the stream time base
    time_bases: dict[str, object]
    video_frames: int
    audio_first_frame_pts: int
    audio: np.ndarray


def probe(path: Path) -> Probe:
    """Demux and decode ``path`` with PyAV."""
    with av.open(str(path)) as c:
        codecs = {s.type: s.codec_context.name for s in c.streams}
        assert len(c.streams.video) == 1 and len(c.streams.audio) == 1
        start_times = {s.type: s.start_time for s in c.streams}
        time_bases = {s.type: s.time_base for s in c.streams}
        first: dict[str, int] = {}
        end: dict[str, int] = {}
        for p in c.demux():
            if p.pts is None:
                continue  # the flush packet each stream ends with
            first.setdefault(p.stream.type, p.pts)
            end[p.stream.type] = p.pts + p.duration
    with av.open(str(path)) as c:
        video_frames = sum(1 for _ in c.decode(video=0))
    with av.open(str(path)) as c:
        frames = list(c.decode(audio=0))
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
    return Probe(codecs, start_times, first, end, time_bases, video_frames, frames[0].pts, samples)
