"""A scripted call: an aiortc peer that talks to `talkloop serve` like the page does.

It sends a WAV (or silence) as its microphone, receives the avatar's video and audio, and
records what arrived when. Used by the tests and by `talkloop bench --live` (glass_to_glass_ms).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import av
import numpy as np
import websockets
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from talkloop.pipeline.audio.pcm import float_to_pcm16, pcm16_to_float
from talkloop.pipeline.bench.worker import looped_speech
from talkloop.pipeline.core.heap import freeze_loaded
from talkloop.rtc.jitter import prompt_track
from talkloop.rtc.tracks import read_stamp

if TYPE_CHECKING:
    import subprocess


class WavMicrophone(MediaStreamTrack):
    """Plays ``samples`` (float32 mono at ``rate``) in real time, 20 ms a frame, then silence."""

    kind = "audio"

    def __init__(self, samples: np.ndarray, rate: int, loop: bool = False) -> None:
        super().__init__()
        self.samples, self.rate, self.loop = samples, rate, loop
        self.block = rate // 50
        self.sent = 0
        self.t0: float | None = None
        self.send_times: list[float] = []  # when each block left, for latency mapping

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.t0 is None:
            self.t0 = time.monotonic()
        due = self.t0 + self.sent / self.rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        start = self.sent
        if self.loop and self.samples.size:
            idx = np.arange(start, start + self.block) % self.samples.shape[0]
            chunk = self.samples[idx]
        else:
            chunk = np.zeros(self.block, np.float32)
            part = self.samples[start : start + self.block]
            chunk[: part.shape[0]] = part
        frame = av.AudioFrame.from_ndarray(
            float_to_pcm16(chunk).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = self.rate
        frame.pts = start
        frame.time_base = Fraction(1, self.rate)
        self.sent += self.block
        return frame


@dataclass
class CallResult:
    session: dict = field(default_factory=dict)
    errors: list[dict] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)
    video_times: list[float] = field(default_factory=list)  # arrival (monotonic) per frame
    video_pts: list[int] = field(default_factory=list)  # 90 kHz
    stamps_latency_ms: list[float] = field(default_factory=list)
    stamps_unreadable: int = 0  # frames sent without a stamp (e.g. the idle frame) or blurred
    audio_times: list[float] = field(default_factory=list)  # arrival per audio frame
    audio_pts: list[int] = field(default_factory=list)
    audio_rms: list[float] = field(default_factory=list)
    # per audio frame, the level of MARKER_HZ (a tone no 16 kHz voice carries: the bench's agent
    # marks its replies with it, so their arrival is told apart from the echoed microphone)
    audio_marker: list[float] = field(default_factory=list)
    audio_rate: int = 48000
    codec: str = ""
    frames: list[np.ndarray] = field(default_factory=list)  # a few sample frames
    audio: list[np.ndarray] = field(default_factory=list)  # decoded mono float (keep_audio)

    def summary(self) -> dict:
        n = len(self.video_times)
        span = (self.video_times[-1] - self.video_times[0]) if n > 1 else 0.0
        return {
            "video_frames": n,
            "fps": (n - 1) / span if span > 0 else 0.0,
            "audio_frames": len(self.audio_times),
            "codec": self.codec,
            "errors": self.errors,
        }


async def run_call(
    url: str,
    seconds: float,
    mic: np.ndarray | None = None,
    mic_rate: int = 16000,
    say: str | None = None,
    keep_frames: int = 0,
    read_stamps: bool = False,
    configuration: RTCConfiguration | None = None,
    keep_audio: bool = False,
    until: Callable[[CallResult], bool] | None = None,
) -> CallResult:
    """Open a session at ``url`` (ws://host:port/ws), call for ``seconds``, hang up.

    ``configuration``: this peer's ICE servers and transport policy (None: aiortc's default).
    ``keep_audio``: keep the decoded audio (``CallResult.audio``, mono float at ``audio_rate``).
    ``until``: looked at every 0.1 s with what has arrived so far; the call hangs up as soon as
    it returns True (``seconds`` is then the longest the call lasts). Tests use it to call until
    enough has arrived, however slow the machine is.
    """
    result = CallResult()
    pc = RTCPeerConnection(configuration)
    microphone = WavMicrophone(mic if mic is not None else np.zeros(0, np.float32), mic_rate)
    pc.addTrack(microphone)
    pc.addTransceiver("video", direction="recvonly")
    tasks: list[asyncio.Task] = []

    async def read_video(track) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            now = time.monotonic()
            result.video_times.append(now)
            result.video_pts.append(int(frame.pts))
            if read_stamps:  # from the decoded luma: no conversion to RGB per frame
                sent_ms = read_stamp(luma(frame))
                if sent_ms is None:
                    result.stamps_unreadable += 1
                else:
                    now_ms = int(time.time() * 1000) & 0xFFFFFFFF
                    result.stamps_latency_ms.append(float((now_ms - sent_ms) & 0xFFFFFFFF))
            if len(result.frames) < keep_frames:
                result.frames.append(frame.to_ndarray(format="rgb24"))

    async def read_audio(track) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            result.audio_times.append(time.monotonic())
            result.audio_pts.append(int(frame.pts))
            result.audio_rate = frame.sample_rate
            pcm = pcm16_to_float(frame.to_ndarray())
            result.audio_rms.append(float(np.sqrt(np.mean(pcm**2))))
            channels = len(frame.layout.channels)
            result.audio_marker.append(
                marker_level(pcm.reshape(-1, channels)[:, 0], frame.sample_rate)
            )
            if keep_audio:  # s16 packed: (1, samples * channels), channels interleaved
                result.audio.append(pcm.reshape(-1, channels).mean(axis=1, dtype=np.float32))

    @pc.on("track")
    def on_track(track) -> None:
        # Frames leave the jitter buffer when complete, as in a browser (talkloop/rtc/jitter.py).
        prompt_track(pc, track)
        tasks.append(
            asyncio.ensure_future(read_video(track) if track.kind == "video" else read_audio(track))
        )

    async with websockets.connect(url, max_size=2**20) as ws:
        session = json.loads(await ws.recv())
        if session.get("type") != "session":
            result.errors.append(session)
            await pc.close()
            return result
        result.session = session
        await pc.setLocalDescription(await pc.createOffer())
        await ws.send(json.dumps({"type": "offer", "sdp": pc.localDescription.sdp}))

        async def receive() -> None:
            async for raw in ws:
                msg = json.loads(raw)
                if msg["type"] == "answer":
                    await pc.setRemoteDescription(RTCSessionDescription(msg["sdp"], "answer"))
                elif msg["type"] == "stats":
                    result.stats.append(msg)
                elif msg["type"] == "error":
                    result.errors.append(msg)

        receiver = asyncio.ensure_future(receive())
        if say:
            await ws.send(json.dumps({"type": "say", "text": say}))
        if until is None:
            await asyncio.sleep(seconds)
        else:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not until(result):
                await asyncio.sleep(0.1)
        if pc.remoteDescription is not None:
            result.codec = negotiated_video_codec(pc.remoteDescription.sdp)
        await ws.send(json.dumps({"type": "bye"}))
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await receiver
    await pc.close()
    for t in tasks:
        t.cancel()
    return result


def luma(frame: av.VideoFrame) -> np.ndarray:
    """(H, W) uint8 brightness of a decoded frame: its Y plane (what decoders give, yuv420p),
    else the mean of its RGB."""
    if frame.format.name == "yuv420p":
        return frame.to_ndarray()[: frame.height]
    return frame.to_ndarray(format="rgb24").mean(axis=2)


def wait_serving(base_url: str, server: subprocess.Popen, timeout: float) -> float:
    """Wait until a ``talkloop serve`` process answers ``base_url``/healthz; the seconds it took.

    Raises:
        RuntimeError: the process exited first, or ``timeout`` passed.
    """
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"talkloop serve exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=2) as reply:
                if reply.status == 200:
                    return time.monotonic() - t0
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"talkloop serve did not answer {base_url} within {timeout:g} s")


MARKER_HZ = 10000.0


def marker_level(samples: np.ndarray, rate: int) -> float:
    """The amplitude of a ``MARKER_HZ`` sine in ``samples`` (its DFT bin, Hann window)."""
    n = samples.shape[0]
    if n == 0 or rate < 2 * MARKER_HZ:
        return 0.0
    window = np.hanning(n)
    phase = np.exp(-2j * np.pi * MARKER_HZ * np.arange(n) / rate)
    return float(2 * abs(np.sum(samples * window * phase)) / window.sum())


def negotiated_video_codec(sdp: str) -> str:
    """The codec of the first payload type of the video m-line (what the answer chose)."""
    lines = sdp.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("m=video"):
            pt = line.split()[3]
            for rest in lines[i + 1 :]:
                if rest.startswith("m="):
                    break
                if rest.startswith(f"a=rtpmap:{pt} "):
                    return rest.split()[1].split("/")[0]
    return ""


def main(argv: list[str] | None = None) -> int:
    """``python -m talkloop.rtc.client URL SECONDS OUT.json [--ready] [--stamps]``: a scripted
    call (looped speech as the microphone), its measurements written as JSON; with ``--stamps``
    the latency stamp of every frame is read (a server that stamps its frames: ``talkloop bench
    --live``; reading them took about 7 % of a client's CPU, which ``--calls`` levels, whose
    server stamps nothing, leave to the server). The bench runs the client in its own process,
    as a browser would be, so client work does not share the server's GIL. With ``--ready`` the
    client prepares everything first (its modules, its microphone's audio), then says ``ready``
    on stdout and calls when a line arrives on stdin: a bench starts several calls at one
    moment, and no call runs while another client still loads (seconds of CPU that a browser
    elsewhere would not take from the server)."""

    args = list(argv if argv is not None else sys.argv[1:])
    ready, stamps = "--ready" in args, "--stamps" in args
    url, seconds, out = [a for a in args if a not in ("--ready", "--stamps")][:3]
    mic = np.concatenate(list(looped_speech(16000, float(seconds) + 5)))
    freeze_loaded()  # no full GC pass walks what loading made, mid-call
    if ready:
        print("ready", flush=True)
        if not sys.stdin.readline():
            return 1  # the bench went away before the start
    r = asyncio.run(run_call(url, float(seconds), mic=mic, read_stamps=stamps))
    data = {k: v for k, v in r.__dict__.items() if k not in ("frames", "audio")}
    with open(out, "w") as f:
        json.dump(data, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
