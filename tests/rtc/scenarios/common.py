"""Shared setup of the scenario scripts (run inside a network namespace by tests/rtc/netns.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/ for conftest helpers

from talkloop.pipeline.core.clock import frame_start_sample  # noqa: E402
from talkloop.pipeline.core.pipeline import Pipeline  # noqa: E402
from talkloop.pipeline.core.stage import Stage, StageContext  # noqa: E402
from talkloop.pipeline.models.registry import (
    build_pipeline,
    family_phases,  # noqa: E402
)
from talkloop.rtc.call import CallConfig  # noqa: E402
from talkloop.rtc.server import AvatarServer  # noqa: E402
from talkloop.rtc.tracks import read_stamp, stamp_bits  # noqa: E402

from support import live_config, make_reference, speech_and_pauses, tiny_config  # noqa: E402

HOST = "127.0.0.2"

# The call's figures from the page's RTCPeerConnection.getStats() (an async JS function; a browser
# leaves out what it does not implement, e.g. Firefox has no freezeCount).
PAGE_STATS_JS = """async () => {
    const out = {};
    const report = await window.talkloop.stats();
    const codecs = {};
    report.forEach((r) => { if (r.type === 'codec') codecs[r.id] = r.mimeType; });
    report.forEach((r) => {
        if (r.type === 'inbound-rtp' && r.kind === 'video') {
            Object.assign(out, {framesDecoded: r.framesDecoded, framesPerSecond: r.framesPerSecond,
                freezeCount: r.freezeCount, frameWidth: r.frameWidth, codec: codecs[r.codecId]});
        }
        if (r.type === 'inbound-rtp' && r.kind === 'audio') {
            Object.assign(out, {audioSamples: r.totalSamplesReceived, audioPackets: r.packetsReceived});
        }
        if (r.type === 'outbound-rtp' && r.kind === 'audio') out.micPackets = r.packetsSent;
    });
    return out;
}"""

# The page's selected candidate pair: both candidates' types and addresses, and how the local one
# reaches its TURN server (null unless it is a relay candidate).
PAGE_PAIR_JS = """async () => {
    const report = await window.talkloop.stats();
    let pairId = null;
    report.forEach((r) => { if (r.type === 'transport' && r.selectedCandidatePairId) pairId = r.selectedCandidatePairId; });
    const pair = pairId && report.get(pairId);
    if (!pair) return null;
    const local = report.get(pair.localCandidateId), remote = report.get(pair.remoteCandidateId);
    return {localType: local.candidateType, remoteType: remote.candidateType,
            localAddress: local.address, remoteAddress: remote.address,
            relayProtocol: local.relayProtocol || null};
}"""

# -- headless Chromium (Debian's, driven by Playwright) ------------------------------------------

CHROMIUM = "/usr/bin/chromium"


async def chromium(playwright):
    """Headless Chromium whose fake microphone plays hello.wav (camera and microphone allowed
    without asking, autoplay on, loopback addresses allowed as ICE candidates)."""
    from talkloop.pipeline.assets import HELLO_WAV

    return await playwright.chromium.launch(
        executable_path=CHROMIUM,
        args=[
            "--allow-loopback-in-peer-connection",
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={HELLO_WAV}",
            "--autoplay-policy=no-user-gesture-required",
        ],
    )


async def open_page(browser, width: int, height: int, https: bool = False):
    """A new page (``https``: in a context that accepts a self-signed certificate, as a user does
    after the browser's warning) and the list its console messages are kept in."""
    viewport = {"width": width, "height": height}
    if https:
        context = await browser.new_context(ignore_https_errors=True, viewport=viewport)
        page = await context.new_page()
    else:
        page = await browser.new_page(viewport=viewport)
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    return page, console


async def wait_live(page, timeout_ms: int = 20000) -> None:
    """Until the page's status says its call is live."""
    await page.wait_for_function(
        "document.getElementById('status').textContent === 'Live'", timeout=timeout_ms
    )


async def hang_up(page, browser) -> None:
    """End the call from the page, give the server a second to see it go, close the browser."""
    await page.click("#call")
    await asyncio.sleep(1.0)
    await browser.close()


def page_url(ws_url: str) -> str:
    """The page of the server whose websocket is ``ws_url``."""
    return ws_url.replace("ws://", "http://").removesuffix("/ws") + "/"


def tiny_live_pipeline(size: int = 128) -> Pipeline:
    return build_pipeline(live_config(tiny_config(video={"width": size, "height": size})))


async def start_server(pipeline: Pipeline, **kw) -> tuple[AvatarServer, str]:
    size = pipeline.info.width
    config = kw.pop("call_config", CallConfig(stamp_frames=True))
    server = AvatarServer(pipeline, make_reference(size, size), "", config, **kw)
    port = await server.start(HOST, 0)
    return server, f"ws://{HOST}:{port}/ws"


# -- which generated frame a received frame shows ------------------------------------------------
#
# A live sender repeats the last frame when the next one is not ready (late, withheld), and skips
# frame slots it could not send in time, so neither arrival times nor RTP timestamps say which
# generated frame a received picture is. These helpers paint each generated frame's index into
# it (the latency stamp's blocks, so a call that uses them must not also stamp latencies) and
# record, per index, the driving audio it was made from: a receiver then pairs what it saw with
# what was said by media position, however late or busy the machine was.


class FrameNumberStage(Stage):
    """Publish phase, last: paints frame ``segment_start + i`` 's index into frame ``i``."""

    name = "frame_number"
    reads = ("frames", "segment_start")
    writes = ("frames",)

    def run(self, ctx: StageContext) -> None:
        frames, first = ctx.read("frames"), ctx.read("segment_start")
        ctx.write("frames", np.stack([stamp_bits(f, first + i) for i, f in enumerate(frames)]))


def numbered(pipeline: Pipeline) -> Pipeline:
    """The same pipeline (shared modules) with ``FrameNumberStage`` after its publish stages."""
    phases = family_phases(pipeline.config)
    phases["publish"].stages = [*phases["publish"].stages, FrameNumberStage()]
    return Pipeline(pipeline.config, pipeline.modules, phases)


def frame_numbers(frames: list[np.ndarray]) -> list[int | None]:
    """The generated frame index each received frame shows (None: unnumbered, e.g. the idle
    frame before the first generated one)."""
    return [read_stamp(f) for f in frames]


class Sightings:
    """Follows a call's received frames while it runs, as ``run_call``'s ``until``: which
    generated frame each shows; for the first sighting of each, ``keep(frame)`` is stored in
    ``first``. Pictures it has looked at are dropped from the CallResult, so a long call holds
    none. The call may end once the first ``plan_frames`` frames were generated (or skipped) and
    at least ``want`` speech and ``want`` pause frames (support.speech_and_pauses) have reached
    the client: a slow server makes the call longer, never the evidence thinner."""

    GONE = np.zeros((1, 1, 3), np.uint8)  # stands in for a picture already looked at

    def __init__(self, audio: FrameAudio, keep, plan_frames: int, want: int) -> None:
        self.audio, self.keep, self.plan_frames, self.want = audio, keep, plan_frames, want
        self.first: dict[int, object] = {}
        self.looked = self.unnumbered = self.repeats = 0
        self.shape: list[int] | None = None  # of the received pictures

    def __call__(self, result) -> bool:
        frames = result.frames
        while self.looked < len(frames):
            frame = frames[self.looked]
            frames[self.looked] = self.GONE
            self.looked += 1
            self.shape = self.shape or list(frame.shape)
            k = read_stamp(frame)
            if k is None:
                self.unnumbered += 1
            elif k in self.first:
                self.repeats += 1
            elif k in self.audio.rms:
                self.first[k] = self.keep(frame)
        return self.enough()

    def index(self) -> list[int]:
        return sorted(self.first)

    def enough(self) -> bool:
        rms = self.audio.rms.copy()  # written by the generation thread
        if not self.first or max(rms) < self.plan_frames:
            return False
        speech, pause = speech_and_pauses(self.index(), self.audio.driving_rms())
        return speech.sum() >= self.want and pause.sum() >= self.want


class FrameAudio:
    """A mirror (a Sink) that keeps, per generated frame index, the RMS of the driving audio the
    frame was made from (its own 1/fps of the session's full-band audio). Never blocks."""

    def __init__(self) -> None:
        self.rms: dict[int, float] = {}
        self.fps, self.rate = 25, 48000

    def open(self, info) -> None:
        self.fps, self.rate = info.fps, info.sample_rate

    def write(self, video, audio) -> None:
        for i in range(video.frames.shape[0]):
            j = video.first_index + i
            lo = frame_start_sample(j, self.fps, self.rate) - audio.first_sample
            hi = frame_start_sample(j + 1, self.fps, self.rate) - audio.first_sample
            block = audio.samples[max(0, lo) : max(0, hi)]
            self.rms[j] = float(np.sqrt(np.mean(block**2))) if block.size else 0.0

    def driving_rms(self) -> list[float | None]:
        """Per frame index from 0: its RMS (None: never generated, a chunk skipped)."""
        rms = self.rms.copy()
        return [rms.get(k) for k in range(max(rms, default=-1) + 1)]

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


# -- the mouth of a portrait, read from the pixels ---------------------------------------------


def mouth_box(frame: np.ndarray, pad: int = 6) -> tuple[slice, slice]:
    """The lips' bounding box (corners, upper and lower lip midpoints) of the face in ``frame``,
    found with the portrait family's own landmark model, plus ``pad`` pixels."""
    from talkloop.pipeline.models.portrait.face import detect_faces, face_landmarks

    faces = detect_faces(frame)
    if not faces:
        raise AssertionError("no face found in the received frame")
    lips = face_landmarks(frame, faces[0])[[61, 291, 0, 17], :2]
    (x0, y0), (x1, y1) = lips.min(0).astype(int) - pad, lips.max(0).astype(int) + pad
    return slice(max(0, y0), y1), slice(max(0, x0), x1)


def cavity_share(frame: np.ndarray, box: tuple[slice, slice], dark: float = 70.0) -> float:
    """Mouth opening as the share of dark (cavity) pixels in ``box``."""
    return float((frame[box].astype(np.float32).mean(-1) < dark).mean())
