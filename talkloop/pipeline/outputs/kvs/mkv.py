"""The mirror's own encoder: display frames in, KVS fragments (one Matroska Cluster each) out.

KVS maps each Matroska Cluster to one fragment and wants every fragment to start on a video
keyframe. FFmpeg's Matroska muxer decides where clusters start by itself (by size and time; for
a small, low-bit-rate stream it puts several keyframes in one cluster), so instead of one
long-lived muxer this module keeps the encoders alive and muxes each group of pictures (GOP)
into its own short-lived live Matroska stream: that stream is the header plus exactly one
cluster, which starts with the GOP's keyframe. The header bytes of the first GOP (EBML header,
Segment, Info, Tracks with the avcC and AudioSpecificConfig codec private data) are kept for
the start of every PutMedia connection.

Timestamps come from the driving audio's sample clock, as for the mp4 sink, shifted by
``origin_s`` (Unix time of frame 0), so cluster timecodes are absolute milliseconds since the
epoch (``x-amzn-fragment-timecode-type: ABSOLUTE``): they stay monotonic across reconnects.
Keyframes are forced every ``fragment_seconds`` of *media* time, so a fragment covers that long
even when the hand-off queue dropped frames.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.core.records import StreamInfo
from talkloop.pipeline.outputs.kvs.ebml import cluster_timecode, split_live_mkv
from talkloop.pipeline.outputs.mp4 import X264_PRESETS
from talkloop.pipeline.outputs.queue import LiveFrame

__all__ = ["Fragment", "FragmentWriter"]

# A GOP must end up in one cluster: limits far above any fragment we cut (KVS caps fragments at
# 10 s and 50 MB anyway).
_CLUSTER_LIMITS = {"cluster_time_limit": "60000", "cluster_size_limit": str(1 << 30)}


@dataclass(frozen=True)
class Fragment:
    """One KVS fragment: a whole Matroska Cluster that starts on a video keyframe."""

    timecode_ms: int  # the Cluster Timestamp: ms since the Unix epoch
    data: bytes
    first_frame: int  # display index of its keyframe
    frames: int  # video frames in it
    cut_at: float  # time.monotonic() when it was cut (ack latency is measured from here)


class _Collect:
    """A write-only, non-seekable file: FFmpeg then writes a live (unknown-size) Segment."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class FragmentWriter:
    """Encodes H.264 + AAC and cuts the stream into KVS fragments.

    Args:
        info: frame size, fps and sample rate of the stream.
        origin_s: Unix time (seconds) that media time 0 maps to.
        fragment_seconds: media time between keyframes, i.e. per fragment (KVS: 1..10 s).
        preset: x264 speed preset.
        crf: x264 constant rate factor.
        audio_bitrate: AAC bit rate in bit/s.

    Not thread-safe: one thread calls ``write`` and ``flush``.
    """

    def __init__(
        self,
        info: StreamInfo,
        *,
        origin_s: float,
        fragment_seconds: float = 2.0,
        preset: str = "veryfast",
        crf: int = 23,
        audio_bitrate: int = 64000,
    ) -> None:
        self.check_settings(fragment_seconds, preset, crf)
        self.info = info
        rate = info.sample_rate
        self.origin = round(origin_s * rate)  # media sample 0, in samples since the epoch
        self.key_interval = max(1, round(fragment_seconds * rate))  # in samples
        self.header: bytes | None = None
        self.frames_encoded = 0
        tb = Fraction(1, rate)
        # The encoders live in a container that is never muxed into: its streams own the codec
        # contexts whose parameters (and extradata) every per-GOP container copies.
        self._owner = av.open(_Collect(), "w", format="matroska")
        v = self._owner.add_stream(
            "libx264",
            rate=info.fps,
            options={
                "preset": preset,
                "tune": "zerolatency",  # no lookahead: a packet per frame, right away
                "crf": str(crf),
                "bf": "0",  # no reordering: packets leave in display order
                "sc_threshold": "0",  # no scene-cut keyframes: fragments cut only where we say
                "g": "100000",  # keyframes are forced by media time (write), never by count
                "threads": "1",  # the mirror uses at most one core, leaving the rest to generation
            },
        )
        v.width, v.height, v.pix_fmt = info.width, info.height, "yuv420p"
        v.codec_context.time_base = tb
        a = self._owner.add_stream("aac", rate=rate, layout="mono")
        a.bit_rate = audio_bitrate
        a.codec_context.time_base = tb
        self._owner.start_encoding()  # opens both encoders; what it writes is dropped
        self._v, self._a = v, a
        self._tb = tb
        self._audio_frame_size = a.codec_context.frame_size or 1024
        self._pending = np.zeros(0, np.float32)  # < one AAC frame of samples
        self._audio_pts = 0  # next sample handed to the AAC encoder, media samples
        self._next_key = None  # media pts (samples) at or after which the next keyframe goes
        self._video: list[tuple[av.Packet, int]] = []  # (packet, display index)
        self._audio: list[av.Packet] = []
        self._cuts: deque[int] = deque()  # keyframe pts (samples since the epoch) to cut before
        self._audio_reached = -1  # highest AAC packet pts out of the encoder

    @staticmethod
    def check_settings(fragment_seconds: float, preset: str, crf: int) -> None:
        """Raise ConfigError for settings the encoder or KVS would refuse."""
        if not 0.04 <= fragment_seconds <= 10:
            raise ConfigError(f"KVS fragment_seconds must be in 0.04..10, got {fragment_seconds}")
        if preset not in X264_PRESETS:
            raise ConfigError(f"KVS preset {preset!r} is not one of {', '.join(X264_PRESETS)}")
        if not 0 <= crf <= 51:
            raise ConfigError(f"KVS crf must be in 0..51, got {crf}")

    def write(self, frame: LiveFrame) -> list[Fragment]:
        """Encode one display frame and its audio; return the fragments completed by it."""
        self._encode_video(frame)
        self._encode_audio(frame.audio, frame.audio_first_sample)
        return self._cut(final=False)

    def flush(self) -> list[Fragment]:
        """Drain both encoders and return the remaining fragments (the last may be short)."""
        if self._pending.size:
            self._send_audio(self._pending)  # the AAC encoder accepts a short last frame
            self._pending = np.zeros(0, np.float32)
        for packet in self._v.encode(None):
            self._take_video(packet, -1)
        for packet in self._a.encode(None):
            self._take_audio(packet)
        fragments = self._cut(final=True)
        self.close()
        return fragments

    def close(self) -> None:
        """Release the encoders (idempotent)."""
        owner, self._owner = self._owner, None
        if owner is not None:
            # Encoders with queued data may refuse a clean close; nothing in them is kept.
            with contextlib.suppress(Exception):
                owner.close()

    # -- encoding ------------------------------------------------------------------------------

    def _encode_video(self, frame: LiveFrame) -> None:
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame.rgb), format="rgb24")
        vf = vf.reformat(format="yuv420p")
        vf.pts = self.origin + frame.pts
        vf.time_base = self._tb
        if self._next_key is None or frame.pts >= self._next_key:
            vf.pict_type = av.video.frame.PictureType.I  # an IDR: a closed GOP starts here
            self._next_key = frame.pts + self.key_interval
        for packet in self._v.encode(vf):
            self._take_video(packet, frame.index)
        self.frames_encoded += 1

    def _encode_audio(self, samples: np.ndarray, first_sample: int) -> None:
        if first_sample != self._audio_pts + self._pending.size:
            # Never happens with the gapless hand-off queue; if it does, restart the clock
            # rather than let audio drift against video.
            self._pending = np.zeros(0, np.float32)
            self._audio_pts = first_sample
        data = np.concatenate([self._pending, samples]) if self._pending.size else samples
        size = self._audio_frame_size
        full = (data.shape[0] // size) * size
        for start in range(0, full, size):
            self._send_audio(data[start : start + size])
        self._pending = np.array(data[full:], dtype=np.float32)

    def _send_audio(self, block: np.ndarray) -> None:
        af = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(block, dtype=np.float32)[None, :], format="fltp", layout="mono"
        )
        af.sample_rate = self.info.sample_rate
        af.pts = self.origin + self._audio_pts
        af.time_base = self._tb
        for packet in self._a.encode(af):
            self._take_audio(packet)
        self._audio_pts += block.shape[0]

    def _take_video(self, packet: av.Packet, index: int) -> None:
        if packet.is_keyframe and self._video:
            self._cuts.append(int(packet.pts))
        if index < 0:  # from the flush: no B-frames, so packets come in frame order
            index = self._video[-1][1] + 1 if self._video else self.frames_encoded - 1
        self._video.append((packet, index))

    def _take_audio(self, packet: av.Packet) -> None:
        self._audio.append(packet)
        self._audio_reached = max(self._audio_reached, int(packet.pts))

    # -- cutting -------------------------------------------------------------------------------

    def _cut(self, final: bool) -> list[Fragment]:
        out: list[Fragment] = []
        # A GOP is complete once the next keyframe is out *and* the AAC encoder (which lags by
        # a frame or two) has passed it, so the fragment holds all of its audio.
        while self._cuts and (final or self._audio_reached >= self._cuts[0]):
            key = self._cuts.popleft()
            video = [(p, i) for p, i in self._video if p.pts < key]
            audio = [p for p in self._audio if p.pts < key]
            self._video = self._video[len(video) :]
            self._audio = self._audio[len(audio) :]
            out.append(self._mux(video, audio))
        if final and self._video:
            out.append(self._mux(self._video, self._audio))
            self._video, self._audio = [], []
        return out

    def _mux(self, video: list[tuple[av.Packet, int]], audio: list[av.Packet]) -> Fragment:
        sink = _Collect()
        container = av.open(sink, "w", format="matroska", options=_CLUSTER_LIMITS)
        cv = container.add_stream_from_template(self._v)
        ca = container.add_stream_from_template(self._a)
        for packet, _ in video:
            packet.stream = cv
            container.mux(packet)
        for packet in audio:
            packet.stream = ca
            container.mux(packet)
        container.close()
        header, clusters = split_live_mkv(sink.getvalue())
        if len(clusters) != 1:
            raise RuntimeError(f"expected one Matroska cluster per GOP, got {len(clusters)}")
        if self.header is None:
            self.header = header
        cluster = clusters[0]
        return Fragment(
            timecode_ms=cluster_timecode(cluster),
            data=cluster,
            first_frame=video[0][1],
            frames=len(video),
            cut_at=time.monotonic(),
        )
