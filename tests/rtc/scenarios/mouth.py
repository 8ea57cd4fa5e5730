"""With the trained default model: the mouth moves while speech is sent and rests in silence.

The mouth opening of every received frame is read by the readout network that ``talkloop eval``
uses (trained on studio frames with known mouth opening), in the default avatar's mouth box.
"""

from __future__ import annotations

import asyncio

import numpy as np

from talkloop.pipeline.assets import HELLO_WAV
from talkloop.pipeline.audio.io import load_audio
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.models.studio.family import (
    DEFAULT_REFERENCE_SEED,
    default_reference,
    installed_weights,
)
from talkloop.pipeline.reference import load_reference
from talkloop.pipeline.studio.character import sample_character
from talkloop.pipeline.train.data import mouth_crop
from talkloop.pipeline.train.readout import load_readout, read_frames
from talkloop.rtc.app import live_config_dict
from talkloop.rtc.call import CallConfig
from talkloop.rtc.client import run_call
from talkloop.rtc.server import AvatarServer

from common import HOST, emit

SILENCE_S, SPEECH_S = 3.0, 5.0


async def main() -> None:
    # What `talkloop serve --family studio` runs (its --backend default is auto).
    config = build_config(**live_config_dict({"model": {"family": "studio", "backend": "auto"}}))
    pipeline = await asyncio.to_thread(Pipeline.from_config, config)
    ref = load_reference(default_reference(), 256, 256)
    server = AvatarServer(pipeline, ref, "", CallConfig(), 1, "")
    port = await server.start(HOST, 0)
    speech = load_audio(HELLO_WAV, 16000)[: int(SPEECH_S * 16000)]
    mic = np.concatenate(
        [
            np.zeros(int(SILENCE_S * 16000), np.float32),
            speech,
            np.zeros(int(SILENCE_S * 16000), np.float32),
        ]
    )
    r = await run_call(
        f"ws://{HOST}:{port}/ws", SILENCE_S * 2 + SPEECH_S + 1.5, mic=mic, keep_frames=10_000
    )
    await server.stop()
    frames = np.stack(r.frames)
    readout, _ = load_readout(installed_weights())
    crop = mouth_crop(sample_character(DEFAULT_REFERENCE_SEED), 256)
    opening = read_frames(readout, frames, crop)[:, 0]
    # Which frames show speech is read from the audio that came back with them (the driving
    # audio, sent on the same clock), by arrival time: no assumption about call set-up delays.
    arrived = np.array(r.video_times[: len(frames)])
    loud = np.interp(arrived, np.array(r.audio_times), np.array(r.audio_rms))
    speech_frames = loud > 0.02
    silence_frames = (loud < 0.002) & (arrived > arrived[0] + 1.0)  # past the first second
    stats = r.stats[-1] if r.stats else {}
    emit(
        {
            "speech_frames": int(speech_frames.sum()),
            "silence_frames": int(silence_frames.sum()),
            "speech_open_mean": float(opening[speech_frames].mean()),
            "speech_open_std": float(opening[speech_frames].std()),
            "silence_open_mean": float(opening[silence_frames].mean()),
            "silence_open_median": float(np.median(opening[silence_frames])),
            "frames_generated": stats.get("frames_generated"),
            "frames_sent": stats.get("frames_sent"),
            "late_frames": stats.get("late_frames"),
            "rtf": stats.get("rtf"),
        }
    )


asyncio.run(main())
