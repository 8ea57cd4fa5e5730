"""Lip sync of the default family in a real call: what `talkloop serve` runs (the portrait family,
its trained weights, the bundled photo, 512x512, the live schedule), called by an aiortc peer
whose microphone sends speech with pauses.

The mouth is read from the received frames: the share of dark (cavity) pixels in the lips' box,
located once with the portrait family's landmark model on the call's photo (the idle frame the
call starts with; every frame is warped from it). Which generated frame a received picture shows
is painted into it before sending (``numbered``), and a mirror keeps the driving audio of every
generated frame (``FrameAudio``), so each mouth reading is paired with the audio of its own media
position: a late or busy server repeats or skips frames, and those repeats are recognised, not
misread as a mouth that lags. The speech-and-pause plan repeats until enough of both reached the
client (``Sightings``): one round when the server keeps up, more when it skips.

Prints RESULT with, per generated frame that reached the client (first sighting): its index and
the mouth opening read; the RMS of the driving audio of every generated frame; the call's own
figures (late and skipped frames: reported, never judged).
"""

from __future__ import annotations

import asyncio

import numpy as np

from talkloop.pipeline.assets import HELLO_WAV
from talkloop.pipeline.audio.io import load_audio
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.models.portrait.family import NATIVE_SIZES
from talkloop.pipeline.models.registry import build_pipeline, load_reference
from talkloop.rtc.call import CallConfig
from talkloop.rtc.client import run_call

from common import FrameAudio, Sightings, cavity_share, mouth_box, numbered, start_server
from support import emit, live_config

RATE = 16000
# 1.5 s of silence, then 3 s of speech, a 1.6 s pause, 3 s more speech and a closing pause.
PLAN = [("pause", 1.5), ("speech", 3.0), ("pause", 1.6), ("speech", 3.0), ("pause", 1.6)]
WANT = 25  # speech frames and pause frames that must reach the client
LONGEST_S = 240.0  # a hang bound: one round of the plan (10.7 s) when the server keeps up


def plan_audio() -> np.ndarray:
    speech, at, parts = load_audio(HELLO_WAV, RATE), 0, []
    for kind, seconds in PLAN:
        n = int(seconds * RATE)
        if kind == "pause":
            parts.append(np.zeros(n, np.float32))
        else:
            parts.append(speech[at : at + n])
            at += n
    return np.concatenate(parts)


async def main() -> None:
    width, height = NATIVE_SIZES[0]  # `talkloop serve`'s defaults: portrait, 512x512, auto
    config = live_config(
        build_config(
            video={"width": width, "height": height},
            model={"family": "portrait", "backend": "auto"},
        )
    )
    pipeline = numbered(await asyncio.to_thread(build_pipeline, config))
    audio = FrameAudio()
    # No latency stamps: the frame numbers use those blocks.
    server, url = await start_server(
        pipeline, call_config=CallConfig(), mirror_factory=lambda number: [audio]
    )
    photo = load_reference(config, None)  # the bundled photo, framed
    server.reference = photo
    box = mouth_box(photo)
    one_round = plan_audio()
    mic = np.tile(one_round, int(np.ceil(LONGEST_S * RATE / one_round.shape[0])))
    plan_frames = one_round.shape[0] * config.video.fps // RATE
    seen = Sightings(audio, lambda frame: cavity_share(frame, box), plan_frames, WANT)
    r = await run_call(url, LONGEST_S, mic=mic, keep_frames=10**9, until=seen)
    stats = r.stats[-1] if r.stats else {}
    await server.stop()
    seen(r)  # the frames that came after the last look
    index = seen.index()
    emit(
        {
            **r.summary(),
            "frame_shape": seen.shape,
            "family": config.model.family,
            "index": index,
            "opening": [seen.first[k] for k in index],
            # the driving audio of every generated frame (None: a chunk skipped to catch up)
            "driving_rms": audio.driving_rms(),
            "plan_frames": plan_frames,
            "unnumbered": seen.unnumbered,
            "repeats": seen.repeats,
            "box": [int(v) for v in (box[0].start, box[0].stop, box[1].start, box[1].stop)],
            "late_frames": stats.get("late_frames"),
            "skipped_frames": stats.get("skipped_frames"),
            "rtf": stats.get("rtf"),
            "sessions_left": len(server.calls),
        }
    )


asyncio.run(main())
