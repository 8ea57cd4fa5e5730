"""Full-band audio through a real call: a 10 kHz tone goes in at 48 kHz as the microphone (Opus)
or at 24 kHz as agent speech, and the aiortc client decodes what comes back. A 16 kHz output
carries nothing above 8 kHz; a full-band one keeps the tone."""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from talkloop.agent.frames import AudioFrame
from talkloop.rtc.client import run_call

from common import emit, start_server, tiny_live_pipeline

TONE_HZ = 10000  # above 8 kHz (gone at 16 kHz), below Opus's super-wideband edge (12 kHz)


def tone(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)


def band_share(audio: np.ndarray, rate: int, lo: float, hi: float) -> float:
    """Share of the signal's power (DC aside) that lies in ``[lo, hi]`` Hz."""
    spec = np.abs(np.fft.rfft(audio * np.hanning(audio.shape[0]))) ** 2
    freqs = np.fft.rfftfreq(audio.shape[0], 1 / rate)
    band = (freqs >= lo) & (freqs <= hi)
    return float(spec[band].sum() / max(spec[1:].sum(), 1e-20))


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
        avatar.push_audio(AudioFrame.from_float(tone(2.5, source_rate), source_rate), source="t")
        avatar.end_of_segment("t")

    if args.source == "mic":
        mic = np.concatenate([np.zeros(source_rate // 2, np.float32), tone(3.0, source_rate)])
        r = await run_call(url, args.seconds, mic=mic, mic_rate=source_rate, keep_audio=True)
    else:
        speaker = asyncio.ensure_future(speak())
        r = await run_call(url, args.seconds, keep_audio=True)
        speaker.cancel()
    await server.stop()
    audio = np.concatenate(r.audio) if r.audio else np.zeros(0, np.float32)
    rate = r.audio_rate
    # The loudest whole second: where the tone played.
    second, step = rate, rate // 10
    starts = range(0, audio.shape[0] - second + 1, step)
    energy = [float(np.sum(audio[i : i + second] ** 2)) for i in starts]
    start = starts[int(np.argmax(energy))] if energy else 0
    window = audio[start : start + second]
    emit(
        {
            **r.summary(),
            "audio_rate": rate,
            "rms": float(np.sqrt(np.mean(window**2))) if window.size else 0.0,
            "tone_share": band_share(window, rate, TONE_HZ - 300, TONE_HZ + 300)
            if window.size == second
            else 0.0,
            "calls_left": len(server.calls),
        }
    )


asyncio.run(main())
