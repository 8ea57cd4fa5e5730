"""With the trained studio model: the mouth moves while speech is sent and rests in silence.

The mouth opening of every received frame is read by the readout network that ``talkloop eval``
uses (trained on studio frames with known mouth opening), in the default avatar's mouth box.
Each received frame is paired with the driving audio of the generated frame it shows (numbered
frames and a FrameAudio mirror, tests/rtc/scenarios/common.py): by media position, so a server
that falls behind (repeated, skipped frames) is neither misjudged nor skipped. The silence-speech-
silence plan repeats until enough of both reached the client (``Sightings``): one round when the
server keeps up.
"""

from __future__ import annotations

import asyncio

import numpy as np

from talkloop.pipeline.assets import HELLO_WAV
from talkloop.pipeline.audio.io import load_audio
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.models.registry import build_pipeline
from talkloop.pipeline.models.studio.data import mouth_crop
from talkloop.pipeline.models.studio.family import (
    DEFAULT_REFERENCE_SEED,
    default_reference,
    installed_weights,
)
from talkloop.pipeline.models.studio.readout import load_readout, read_frames
from talkloop.pipeline.reference import load_reference
from talkloop.pipeline.synth.character import sample_character
from talkloop.rtc.app import live_config_dict
from talkloop.rtc.call import CallConfig
from talkloop.rtc.client import run_call
from talkloop.rtc.server import AvatarServer

from common import HOST, FrameAudio, Sightings, numbered
from support import emit

SILENCE_S, SPEECH_S = 3.0, 5.0
WANT = 50  # speech frames and silence frames that must reach the client
LONGEST_S = 240.0  # a hang bound: one round of the plan (11 s) when the server keeps up


async def main() -> None:
    # What `talkloop serve --family studio` runs (its --backend default is auto).
    config = build_config(**live_config_dict({"model": {"family": "studio", "backend": "auto"}}))
    pipeline = numbered(await asyncio.to_thread(build_pipeline, config))
    ref = load_reference(default_reference(), 256, 256)
    audio = FrameAudio()
    server = AvatarServer(pipeline, ref, "", CallConfig(), 1, "", mirror_factory=lambda n: [audio])
    port = await server.start(HOST, 0)
    speech = load_audio(HELLO_WAV, 16000)[: int(SPEECH_S * 16000)]
    one_round = np.concatenate(
        [
            np.zeros(int(SILENCE_S * 16000), np.float32),
            speech,
            np.zeros(int(SILENCE_S * 16000), np.float32),
        ]
    )
    mic = np.tile(one_round, int(np.ceil(LONGEST_S * 16000 / one_round.shape[0])))
    plan_frames = one_round.shape[0] * config.video.fps // 16000
    seen = Sightings(audio, lambda frame: frame, plan_frames, WANT)  # keeps first sightings
    r = await run_call(f"ws://{HOST}:{port}/ws", LONGEST_S, mic=mic, keep_frames=10**9, until=seen)
    stats = r.stats[-1] if r.stats else {}
    await server.stop()
    seen(r)  # the frames that came after the last look
    index = seen.index()
    readout, _ = load_readout(installed_weights())
    crop = mouth_crop(sample_character(DEFAULT_REFERENCE_SEED), 256)
    frames = np.stack([seen.first[k] for k in index]) if index else np.zeros((0, 256, 256, 3))
    opening = read_frames(readout, frames, crop)[:, 0] if index else np.zeros(0)
    emit(
        {
            **r.summary(),
            "frame_shape": seen.shape,
            "index": index,
            "opening": [float(x) for x in opening],
            "driving_rms": audio.driving_rms(),
            "repeats": seen.repeats,
            "frames_generated": stats.get("frames_generated"),
            "frames_sent": stats.get("frames_sent"),
            "late_frames": stats.get("late_frames"),
            "skipped_frames": stats.get("skipped_frames"),
            "rtf": stats.get("rtf"),
            "sessions_left": len(server.calls),
        }
    )


asyncio.run(main())
