"""Test helpers shared by the test modules and the scenario scripts (import: `from support import`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class CollectSink:
    """Keeps everything it is given (tests only: the real sinks never accumulate)."""

    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []
        self.first_indices: list[int] = []
        self.audio: list[np.ndarray] = []
        self.first_samples: list[int] = []
        self.info = None
        self.closed = self.aborted = False

    def open(self, info) -> None:
        self.info = info

    def write(self, video, audio) -> None:
        self.frames.append(video.frames.copy())
        self.first_indices.append(video.first_index)
        self.audio.append(audio.samples.copy())
        self.first_samples.append(audio.first_sample)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def all_frames(self) -> np.ndarray:
        return np.concatenate(self.frames) if self.frames else np.zeros((0,), np.uint8)

    def all_audio(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)


class RecordingMirror:
    """A mirror (a Sink) that records what was done to it: "open", "close", "abort"."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def open(self, info) -> None:
        self.events.append("open")

    def write(self, video, audio) -> None:
        pass

    def close(self) -> None:
        self.events.append("close")

    def abort(self) -> None:
        self.events.append("abort")


# -- test signals ---------------------------------------------------------------------------------


def tone(n: int, rate: int, hz: float = 440.0, amp: float = 0.5, dtype=np.float32) -> np.ndarray:
    """``n`` samples at ``rate`` of a sine at ``hz`` with peak ``amp``, starting at phase 0."""
    t = np.arange(n) / rate
    return (amp * np.sin(2 * np.pi * hz * t)).astype(dtype)


def tone_pcm16(n: int, rate: int, hz: float = 440.0, amp: float = 0.5) -> np.ndarray:
    """``tone`` as little-endian 16-bit PCM (``.tobytes()`` for the wire)."""
    return (tone(n, rate, hz, amp, np.float64) * 32767).astype("<i2")


def band_share(x: np.ndarray, rate: int, lo: float, hi: float) -> float:
    """Share of the power (DC aside) of ``x`` that lies in ``[lo, hi]`` Hz."""
    spec = np.abs(np.fft.rfft(x * np.hanning(x.shape[0]))) ** 2
    freqs = np.fft.rfftfreq(x.shape[0], 1 / rate)
    return float(spec[(freqs >= lo) & (freqs <= hi)].sum() / max(spec[1:].sum(), 1e-20))


def loudest_second(x: np.ndarray, rate: int) -> np.ndarray:
    """The loudest whole second of ``x`` (on a 100 ms grid); all of ``x`` if it is shorter."""
    step = rate // 10
    energy = [float(np.sum(x[i : i + rate] ** 2)) for i in range(0, x.shape[0] - rate + 1, step)]
    start = int(np.argmax(energy)) * step if energy else 0
    return x[start : start + rate]


def psnr(a, b, peak: float = 255.0) -> float:
    """PSNR (dB) of ``a`` against ``b`` from the mean squared error over all their elements (one
    figure for a whole clip, not a mean of per-frame figures); ``peak``: the signal's range."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float(10 * np.log10(peak**2 / max(mse, 1e-12)))


# -- test images, configs and modules -------------------------------------------------------------


def portraits() -> dict[str, Path]:
    """The test photos of people, by name: the portrait family's own default photo (astronaut)
    and those in tests/data/portraits."""
    from talkloop.pipeline.models.portrait.family import DEFAULT_REFERENCE

    folder = Path(__file__).resolve().parent / "data" / "portraits"
    return {
        "astronaut": DEFAULT_REFERENCE,
        "grace_hopper": folder / "grace_hopper.jpg",
        "luispedro": folder / "luispedro.jpg",
    }


def load_rgb(path) -> np.ndarray:
    """An image file as an (H, W, 3) uint8 RGB array."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).copy()


def two_faces() -> np.ndarray:
    """A 1000x600 photo of two people: the astronaut at 3/4 size on the left, Grace Hopper (the
    larger face) on the right."""
    import cv2

    photos = portraits()
    big = load_rgb(photos["grace_hopper"])
    small = cv2.resize(
        load_rgb(photos["astronaut"]), None, fx=0.75, fy=0.75, interpolation=cv2.INTER_AREA
    )
    canvas = np.full((600, 1000, 3), 90, np.uint8)
    canvas[: small.shape[0], : small.shape[1]] = small[:600]
    canvas[:, 1000 - big.shape[1] :] = big
    return canvas


def make_reference(width: int = 64, height: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack([x * 255 // width, y * 255 // height, np.full_like(x, 128)], -1)
    img = img + rng.integers(0, 30, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def tiny_config(**overrides):
    from talkloop.pipeline.core.config import build_config

    base = {
        "video": {"width": 64, "height": 64, "fps": 25},
        "schedule": {"first_len": 2, "n_len": 6, "i_len": 2, "ctx_len": 2},
        "sampler": {"steps": 2},
        "model": {"family": "studio", "preset": "tiny", "untrained": True, "dtype": "float32"},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return build_config(**base)


def live_config(config):
    """``config`` with its family's live chunk schedule (as `talkloop serve` runs it)."""
    from talkloop.pipeline.core.config import build_config
    from talkloop.rtc.app import live_config_dict

    base = config.model_dump(mode="json")
    base.pop("schedule")
    return build_config(**live_config_dict(base))


def liven(modules, seed: int = 1) -> None:
    """Give zero-initialised layers (adaLN-Zero, output heads) small random values, so that
    conditioning inputs visibly change untrained outputs."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in modules.values():
            for p in m.net.parameters():
                if p.numel() and torch.count_nonzero(p) == 0:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)


# -- offline and streaming renders of a pipeline (tests/core, tests/models) ----------------------


def blocks(samples: np.ndarray, size: int):
    """``samples`` in consecutive pieces of ``size`` (the last one shorter)."""
    for i in range(0, samples.shape[0], size):
        yield samples[i : i + size]


def feed_live(session, audio: np.ndarray, packet: int = 320) -> None:
    """Run ``session`` live with ``audio`` pushed in packets (320: 20 ms at 16 kHz) from another
    thread while ``run_live`` generates, as a call feeds it."""

    def feed() -> None:
        for p in blocks(audio, packet):
            session.push_audio(p)
        session.end_audio()

    feeder = threading.Thread(target=feed)
    feeder.start()
    session.run_live()
    feeder.join()


def render_batch(pipeline, audio: np.ndarray, reference=None, **kw) -> CollectSink:
    """All of ``audio`` at once through a session on ``reference`` (default: make_reference())."""
    sink = CollectSink()
    ref = make_reference() if reference is None else reference
    pipeline.open_session(ref, sinks=[sink], **kw).render([audio])
    return sink


def render_streaming(pipeline, audio: np.ndarray, reference=None, packet: int = 320):
    """``audio`` through a live session (feed_live) on ``reference`` (default: make_reference())."""
    sink = CollectSink()
    ref = make_reference() if reference is None else reference
    feed_live(pipeline.open_session(ref, sinks=[sink]), audio, packet)
    return sink


def memory_reports(pipeline, reference, speech: np.ndarray, at: tuple[int, ...]):
    """The session's ``state.memory_report()`` as chunk k of each k in ``at`` is published,
    rendering tiled ``speech`` for enough frames (first chunk, then N chunks of n_len at 25 fps,
    16 kHz); returns the reports by chunk and how many chunks the session ran."""
    from talkloop.pipeline.core.clock import frame_start_sample

    reports: dict[int, dict] = {}

    class Probe(CollectSink):
        def write(self, video, audio) -> None:
            chunk = session.stats.chunks + 1
            if chunk in at:
                reports[chunk] = session.state.memory_report()

    schedule = pipeline.config.schedule
    frames = schedule.first_len + max(at) * schedule.n_len
    session = pipeline.open_session(reference, sinks=[Probe()])
    session.render(blocks(np.resize(speech, frame_start_sample(frames, 25, 16000)), 640))
    return reports, session.stats.chunks


# -- in-process servers and their clients (tests/rtc, tests/agent) -------------------------------


def run(coro, timeout: float = 60.0):
    """Run ``coro`` on a fresh event loop, bounded by ``timeout`` seconds (against a hang)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def with_server(pipeline, body, max_sessions: int = 1, ssl_context=None, **kw):
    """``await body(server, ws_url, port)`` against an AvatarServer of ``pipeline`` (the test
    reference, no prompt; ``kw``: its other arguments) on a free port of 127.0.0.1, wss with
    ``ssl_context``; the server is stopped after, whatever happened. Returns what body returned."""
    from talkloop.rtc.server import AvatarServer

    server = AvatarServer(pipeline, make_reference(), max_sessions=max_sessions, **kw)
    port = await server.start("127.0.0.1", 0, ssl_context=ssl_context)
    scheme = "wss" if ssl_context else "ws"
    try:
        return await body(server, f"{scheme}://127.0.0.1:{port}/ws", port)
    finally:
        await server.stop()


def http_get(url: str, context=None) -> tuple[int, str, bytes]:
    """GET ``url`` (``context``: an ssl.SSLContext for https): its status, Content-Type and body;
    an HTTP error status is returned, not raised."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, context=context, timeout=10) as reply:
            return reply.status, reply.headers.get("Content-Type", ""), reply.read()
    except urllib.error.HTTPError as err:
        return err.code, "", b""


async def until(ws, kind: str, timeout: float = 20) -> dict:
    """The next message of type ``kind`` on websocket ``ws`` (the others are skipped)."""

    async def wait() -> dict:
        while True:
            msg = json.loads(await ws.recv())
            if msg["type"] == kind:
                return msg

    return await asyncio.wait_for(wait(), timeout)


async def drain(avatar, into: list | None = None, clock=None) -> None:
    """Take everything an avatar session emits, as a viewer's tracks would (playback is what the
    outputs emit); kept in ``into`` when given, as ``(clock.now(), item)`` with a ``clock``."""
    async for item in avatar:
        if into is not None:
            into.append(item if clock is None else (clock.now(), item))


def pcm_frame(x: np.ndarray, rate: int, channels: int = 1):
    """Float samples as an agent's PCM16 AudioFrame (clipped, rounded); ``channels`` 2: the same
    samples on both."""
    from talkloop.agent.frames import AudioFrame
    from talkloop.pipeline.audio.pcm import float_to_pcm16

    data = float_to_pcm16(x).astype("<i2")
    if channels == 2:
        data = np.repeat(data, 2)
    return AudioFrame(data.tobytes(), rate, channels)


async def offer_without_candidates() -> str:
    """An offer as a browser makes it (audio and video to receive), without candidates: a server
    answers and starts generating, but has no address to check, so no packet is sent."""
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="recvonly")
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return "".join(
        line + "\r\n"
        for line in sdp.splitlines()
        if line and not line.startswith(("a=candidate", "a=end-of-candidates"))
    )


# -- a scripted page and agent over a real call (the scenario scripts) ----------------------------


async def page_call(url: str, hangup: asyncio.Event, mic: np.ndarray, log: dict) -> None:
    """A scripted page (aiortc, microphone ``mic`` at 16 kHz): offer, receive video and audio,
    record frames and messages with arrival times in ``log``, hang up when ``hangup`` is set.
    Unlike rtc.client.run_call it keeps what it saw when the server ends the call first."""
    import websockets
    from aiortc import RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import MediaStreamError

    from talkloop.rtc.client import WavMicrophone

    log.update(video=[], audio=[], audio_pts=[], audio_rms=[], video_pts=[], msgs=[], session={})
    pc = RTCPeerConnection()
    pc.addTrack(WavMicrophone(mic, 16000))
    pc.addTransceiver("video", direction="recvonly")
    tasks = []

    async def read(track) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            now = time.monotonic()
            if track.kind == "video":
                log["video"].append(now)
                log["video_pts"].append(int(frame.pts))
            else:
                log["audio"].append(now)
                log["audio_pts"].append(int(frame.pts))
                log["audio_rate"] = frame.sample_rate
                pcm = frame.to_ndarray().astype(np.float32) / 32768.0
                log["audio_rms"].append(float(np.sqrt(np.mean(pcm**2))))

    pc.on("track", lambda track: tasks.append(asyncio.ensure_future(read(track))))
    try:
        async with websockets.connect(url, max_size=2**20) as ws:
            log["connect_at"] = time.monotonic()
            first = json.loads(await ws.recv())
            log["msgs"].append([time.monotonic(), first])
            if first.get("type") != "session":
                return
            log["session"] = first
            await pc.setLocalDescription(await pc.createOffer())
            log["offer_at"] = time.monotonic()
            await ws.send(json.dumps({"type": "offer", "sdp": pc.localDescription.sdp}))

            async def receive() -> None:
                async for raw in ws:
                    msg = json.loads(raw)
                    log["msgs"].append([time.monotonic(), msg])
                    if msg["type"] == "answer":
                        await pc.setRemoteDescription(RTCSessionDescription(msg["sdp"], "answer"))

            receiver = asyncio.ensure_future(receive())
            stop = asyncio.ensure_future(hangup.wait())
            await asyncio.wait([receiver, stop], return_when=asyncio.FIRST_COMPLETED)
            log["ended_by"] = "page" if stop.done() else "server"
            stop.cancel()
            receiver.cancel()
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.send(json.dumps({"type": "bye"}))
    finally:
        await pc.close()
        for t in tasks:
            t.cancel()


async def send_speech(ws, speech: np.ndarray, rate: int, log: dict) -> None:
    """``speech`` (float, at ``rate``) on an agent's websocket as PCM16 in 20 ms blocks at 4x
    real time, ahead of playback as a TTS agent sends (examples/agent.py), then segment_end;
    when it began and ended sending in ``log`` (speech_at, speech_sent_at)."""
    await ws.send(json.dumps({"type": "audio_format", "sample_rate": rate, "channels": 1}))
    log["speech_at"] = time.monotonic()
    block = rate // 50
    for i in range(0, len(speech), block):
        pcm = np.clip(speech[i : i + block], -1, 1) * 32767
        await ws.send(pcm.astype("<i2").tobytes())
        await asyncio.sleep(0.02 / 4)
    await ws.send(json.dumps({"type": "segment_end"}))
    log["speech_sent_at"] = time.monotonic()


def emit(result: dict) -> None:
    """A scenario script's result: one line ``RESULT <json>`` (tests/rtc/netns.py reads it)."""
    print("RESULT " + json.dumps(result), flush=True)


def note(text: str) -> None:
    """A scenario script's progress line, on stderr with the time of day."""
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


# -- the real command ------------------------------------------------------------------------------

# `talkloop`, from this interpreter: its entry point (talkloop/__main__.py), which quiets the
# libraries before they load, as the installed program does.
TALKLOOP = [sys.executable, "-m", "talkloop"]


def tiny_args(size: int = 64) -> list[str]:
    """The command line's flags for the tiny untrained studio model at ``size`` x ``size``."""
    return ["--family", "studio", "--untrained", "--preset", "tiny", "--size", str(size)]


@dataclass
class Serving:
    """A running `talkloop serve` (see ``serving``)."""

    proc: subprocess.Popen
    line: str  # its "serving on" line
    url: str  # the page's URL from that line: scheme://host:port/
    before: list[str] = field(default_factory=list)  # what it printed before that line

    def stop(self, sig: int | None = signal.SIGTERM, timeout: float = 60) -> tuple[str, str]:
        """Send ``sig`` (None: it was sent already) and wait for the exit, killed after
        ``timeout`` seconds (against a hang): the rest of its stdout and its stderr."""
        if sig is not None:
            self.proc.send_signal(sig)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        return out, err or ""


@contextmanager
def serving(
    args: list[str],
    command: list[str] = TALKLOOP,
    timeout: float = 180,
    stderr: int = subprocess.PIPE,
    **popen,
) -> Iterator[Serving]:
    """`talkloop serve ARGS` as a process of its own (stdout and ``stderr`` pipes of text;
    ``popen``: cwd, env), once it has printed its "serving on" line (``timeout``: seconds against
    a hang, checked between lines); it is killed on the way out if it still runs."""
    proc = subprocess.Popen(
        [*command, "serve", *args], stdout=subprocess.PIPE, stderr=stderr, text=True, **popen
    )
    try:
        before, deadline = [], time.monotonic() + timeout
        while "serving on" not in (line := proc.stdout.readline()):
            if (not line and proc.poll() is not None) or time.monotonic() > deadline:
                proc.kill()
                _, err = proc.communicate()
                raise AssertionError(
                    f"talkloop serve did not start: {''.join([*before, line])!r} {(err or '')[-2000:]}"
                )
            before.append(line)
        yield Serving(proc, line.strip(), re.search(r"https?://\S+/", line).group(0), before)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# -- manual-clock pacing of avatar sessions (tests/agent) ---------------------------------------


async def settle(avatar, timeout: float = 20.0) -> None:
    """Let the loop run, then wait until generation has made and published every chunk it has
    audio for (a chunk is made, then its frames published: ``ready`` speaks of the making)."""
    for _ in range(5):
        await asyncio.sleep(0)
    deadline = time.monotonic() + timeout
    while avatar.session.ready() or avatar.session.busy:
        if time.monotonic() > deadline:
            raise AssertionError("generation did not catch up")
        await asyncio.sleep(0.002)
    for _ in range(5):
        await asyncio.sleep(0)


async def advance(avatar, clock, seconds: float, step: float = 0.01) -> None:
    """Move the manual clock in small steps, letting generation catch up after each."""
    for _ in range(int(round(seconds / step))):
        clock.advance(step)
        await settle(avatar)


# -- what a receiver can check without a clock ---------------------------------------------------
#
# A call's timing on a shared machine is nobody's business in a test (`talkloop bench --live`
# measures it). What is exact whatever the speed: the media timestamps a peer receives, the order
# of events, and which generated frame a received picture shows (tests/rtc/scenarios/common.py).


def on_frame_grid(video_pts: list[int], fps: int = 25, clock: int = 90000, jumps: int = 0) -> bool:
    """Received RTP video timestamps: each frame a later frame slot than the one before. A paced
    sender sends each frame at its own media time; one that falls behind skips slots, and never
    sends a slot twice or off the frame grid. A reply that starts early (at most ``jumps`` of
    them) jumps the clock by whole 20 ms blocks: the frame on show then is shown shorter by
    whole blocks, and the grid goes on from there."""
    d = np.diff(np.asarray(video_pts, dtype=np.int64))
    whole = d % (clock // fps) == 0
    blocks = d % (clock // 50) == 0
    return (
        len(video_pts) > 0
        and bool(np.all((d > 0) & blocks))
        and int(np.count_nonzero(~whole)) <= jumps
    )


def contiguous_audio(audio_pts: list[int], block: int = 960) -> bool:
    """Received audio timestamps: every 20 ms block (960 samples at 48 kHz) from the first to the
    last, none missing, none repeated (the avatar's audio never skips, however late video is)."""
    d = np.diff(np.asarray(audio_pts, dtype=np.int64))
    return len(audio_pts) > 0 and bool(np.all(d == block))


def speech_and_pauses(
    index: list[int],
    driving_rms: list[float | None],
    loud: float = 0.02,
    quiet: float = 0.002,
    margin: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
    """Masks over ``index`` (generated frame numbers): speech, the frame's own driving audio is
    loud; pause, it and every generated frame within ``margin`` frames of it are quiet (away from
    where speech starts and ends, which a mouth anticipates and follows). ``driving_rms[k]`` is
    frame k's (None: never generated, a chunk skipped to catch up: its audio is not known and
    not held against its neighbours)."""
    rms = np.array([np.nan if v is None else v for v in driving_rms], dtype=np.float64)
    idx = np.asarray(index, dtype=np.int64)
    speech = rms[idx] > loud
    pause = np.array(
        [np.all(np.nan_to_num(rms[max(0, k - margin) : k + margin + 1]) < quiet) for k in idx],
        dtype=bool,
    )
    return speech, pause


# -- names in the docs ------------------------------------------------------------------------------

OPTIONAL = {"livekit", "pipecat", "ray"}  # the optional extras' top-level packages


def resolve(name: str) -> object:
    """The object a dotted ``talkloop.`` name stands for: the longest importable module, then
    attributes; a name whose module needs an optional extra not installed here is skipped."""
    import importlib

    import pytest

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as err:
            missing = err.name or ""
            if missing.split(".")[0] in OPTIONAL:
                pytest.skip(f"{name} needs {missing}, an optional extra not installed here")
            if module == missing or module.startswith(missing + "."):
                continue  # not a module of ours: a shorter prefix may be, the rest attributes
            raise
        for attr in parts[cut:]:
            assert hasattr(obj, attr), f"{'.'.join(parts[:cut])} has no {attr!r} (for {name})"
            obj = getattr(obj, attr)
        return obj
    raise AssertionError(f"no prefix of {name} imports")
