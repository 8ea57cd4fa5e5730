"""Shared setup of the scenario scripts (run inside a network namespace by tests/rtc/netns.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/ for conftest helpers

from talkloop.pipeline.core.config import build_config  # noqa: E402
from talkloop.pipeline.core.pipeline import Pipeline  # noqa: E402
from talkloop.rtc.app import live_config_dict  # noqa: E402
from talkloop.rtc.call import CallConfig  # noqa: E402
from talkloop.rtc.server import AvatarServer  # noqa: E402

from support import make_reference, tiny_config  # noqa: E402

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


def tiny_live_pipeline(size: int = 128) -> Pipeline:
    base = tiny_config(video={"width": size, "height": size}).model_dump(mode="json")
    base.pop("schedule")
    return Pipeline.from_config(build_config(**live_config_dict(base)))


async def start_server(pipeline: Pipeline, **kw) -> tuple[AvatarServer, str]:
    size = pipeline.info.width
    config = kw.pop("call_config", CallConfig(stamp_frames=True))
    server = AvatarServer(pipeline, make_reference(size, size), "", config, **kw)
    port = await server.start(HOST, 0)
    return server, f"ws://{HOST}:{port}/ws"


def emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)
