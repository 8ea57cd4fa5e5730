"""With the trained default model: the mouth moves while speech is sent and rests in silence."""

from __future__ import annotations

import asyncio

import numpy as np

from pipeline.assets import HELLO_WAV
from pipeline.audio.io import load_audio
from pipeline.core.config import build_config
from pipeline.core.pipeline import Pipeline
from pipeline.models.registry import default_reference
from pipeline.reference import load_reference
from rtc.app import LIVE_SCHEDULE
from rtc.client import run_call
from rtc.live import LiveConfig
from rtc.server import AvatarServer

from common import HOST, emit

SILENCE_S, SPEECH_S = 3.0, 5.0


async def main() -> None:
    config = build_config(schedule=LIVE_SCHEDULE)
    pipeline = await asyncio.to_thread(Pipeline.from_config, config)
    ref = load_reference(default_reference(), 256, 256)
    server = AvatarServer(pipeline, ref, "", LiveConfig(), 1, "")
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
    frames = np.stack(r.frames).astype(np.float32)
    # The default avatar's mouth sits at about (128, 140) of 256 px; the jaw opens downwards.
    mouth = frames[:, int(0.48 * 256) : int(0.68 * 256), int(0.38 * 256) : int(0.62 * 256)]
    motion = np.abs(np.diff(mouth, axis=0)).mean(axis=(1, 2, 3))  # frame i -> i + 1
    # Which frames show speech is read from the audio that came back with them (the driving
    # audio, sent on the same clock), by arrival time: no assumption about call set-up delays.
    arrived = np.array(r.video_times[: len(frames)])[1:]
    loud = np.interp(arrived, np.array(r.audio_times), np.array(r.audio_rms))
    settled = arrived > arrived[0] + 1.0  # past the first second of the call
    emit(
        {
            "speech_pairs": int((loud > 0.02).sum()),
            "silence_pairs": int(((loud < 0.002) & settled).sum()),
            "speech_motion": float(motion[loud > 0.02].mean()),
            "silence_motion": float(motion[(loud < 0.002) & settled].mean()),
        }
    )


asyncio.run(main())
