"""Full-band audio through a real call: a 10 kHz tone goes in at 48 kHz as the microphone (Opus)
or at 24 kHz as agent speech, and the aiortc client decodes what comes back. A 16 kHz output
carries nothing above 8 kHz; a full-band one keeps the tone."""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from talkloop.agent.frames import AudioFrame
from talkloop.rtc.client import run_call

from common import start_server, tiny_live_pipeline
from support import band_share, emit, loudest_second, tone

TONE_HZ = 10000  # above 8 kHz (gone at 16 kHz), below Opus's super-wideband edge (12 kHz)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", choices=("mic", "agent"), required=True)
    ap.add_argument("--seconds", type=float, default=5)
    args = ap.parse_args()
    pipeline = tiny_live_pipeline(64)
    server, url = await start_server(pipeline)
    calls: list = []
    server.on_call = calls.append
    source_rate = 48000 if args.source == "mic" else 24000

    async def speak() -> None:  # agent speech, once the call is playing out
        while not (calls and calls[0].avatar.media.started):
            await asyncio.sleep(0.02)
        avatar = calls[0].avatar
        speech = tone(int(2.5 * source_rate), source_rate, hz=TONE_HZ, amp=0.3)
        avatar.push_audio(AudioFrame.from_float(speech, source_rate), source="t")
        avatar.end_of_segment("t")

    if args.source == "mic":
        burst = tone(3 * source_rate, source_rate, hz=TONE_HZ, amp=0.3)
        mic = np.concatenate([np.zeros(source_rate // 2, np.float32), burst])
        r = await run_call(url, args.seconds, mic=mic, mic_rate=source_rate, keep_audio=True)
    else:
        speaker = asyncio.ensure_future(speak())
        r = await run_call(url, args.seconds, keep_audio=True)
        speaker.cancel()
    await server.stop()
    audio = np.concatenate(r.audio) if r.audio else np.zeros(0, np.float32)
    rate = r.audio_rate
    window = loudest_second(audio, rate)  # where the tone played
    emit(
        {
            **r.summary(),
            "audio_rate": rate,
            "rms": float(np.sqrt(np.mean(window**2))) if window.size else 0.0,
            "tone_share": band_share(window, rate, TONE_HZ - 300, TONE_HZ + 300)
            if window.size == rate
            else 0.0,
            "calls_left": len(server.calls),
        }
    )


asyncio.run(main())
