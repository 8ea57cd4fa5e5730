"""A page call (silent microphone) and an agent on its token that sends ~3 s of speech ahead of
playback (4x real time, as a TTS agent does): where in the media the speech starts and how long
it is heard, from the audio the page receives, by media timestamp.

The server runs in this process: when the agent's first audio is pushed, the driving audio's
production front is noted (``front_out``, as an output sample): the speech must start there
or before it (a reply ahead of real time starts early, in idle audio not yet played), not queued
behind anything (a suspected defect started such speech 2-4.7 s late). The page's
audio track starts at media sample 0, so a received block's place is its pts offset.

Prints RESULT with: ``start_media_delay_s`` (first loud block at the page minus the front, media
seconds), ``audible_media_s`` (first to last loud block, media seconds), the agent's messages,
and, measured for a look only (no test judges timings): ``start_delay_s`` (segment sent ->
playback_started at the agent, wall clock), ``stats_av_offset_ms`` (the page's `stats`
messages) and receiver-side A/V offsets (``rx_av_offset_ms_*``, as call.py computes them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

import numpy as np
import websockets

from talkloop.pipeline.assets import HELLO_WAV
from talkloop.pipeline.audio.io import load_audio

from common import start_server, tiny_live_pipeline
from support import emit, page_call, send_speech

LOUD_RMS = 0.01


async def agent(url: str, token: str, speech: np.ndarray, rate: int, log: dict) -> None:
    """Sends ``speech`` (at ``rate``, support.send_speech); waits for the segment to finish."""
    log.update(msgs=[])
    async with websockets.connect(f"{url}?token={token}&role=agent", max_size=2**20) as ws:

        async def receive() -> None:
            async for raw in ws:
                msg = json.loads(raw)
                log["msgs"].append([time.monotonic(), msg])
                if msg.get("type") == "playback_finished":
                    return

        receiver = asyncio.ensure_future(receive())
        await send_speech(ws, speech, rate, log)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(receiver, 30)
        receiver.cancel()


def loud_runs(times: np.ndarray, gap: float = 0.3) -> list[list[float]]:
    """[first, last] of each run of loud blocks (media seconds), runs closer than ``gap`` merged."""
    runs: list[list[float]] = []
    for t in times.tolist():
        if runs and t - runs[-1][1] < gap:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return runs


def rx_offsets_ms(page: dict, t0: float, t1: float) -> list[float]:
    """Receiver-side A/V offset per video frame arriving in [t0, t1] (tests/rtc/scenarios/call.py):
    both tracks leave at start + pts; each track's arrival minus media time, video minus audio."""
    if not page["audio"] or not page["video"]:
        return []
    at, ap = np.array(page["audio"]), np.array(page["audio_pts"], dtype=np.float64)
    vt, vp = np.array(page["video"]), np.array(page["video_pts"], dtype=np.float64)
    a_off = at - (ap - ap[0]) / page["audio_rate"]
    v_off = vt - (vp - vp[0]) / 90000
    a_win = a_off[(at >= t0) & (at <= t1)]
    v_win = v_off[(vt >= t0) & (vt <= t1)]
    if not a_win.size or not v_win.size:
        return []
    return ((v_win - np.median(a_win)) * 1000).tolist()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=16000, help="the agent's speech rate")
    ap.add_argument("--speech-s", type=float, default=3.0)
    ap.add_argument("--warm-s", type=float, default=3.0, help="call time before the agent speaks")
    ap.add_argument(
        "--mic-turns",
        action="store_true",
        help="the page speaks too: 1.5 s of speech at the start, silence while the agent speaks, "
        "2 s more after it",
    )
    args = ap.parse_args()
    pipeline = tiny_live_pipeline(128)
    server, url = await start_server(pipeline)
    speech = load_audio(HELLO_WAV, args.rate)
    speech = np.tile(speech, int(np.ceil(args.speech_s * args.rate / len(speech))))
    speech = speech[: int(args.speech_s * args.rate)]
    fronts: list[int] = []

    def watch(call) -> None:  # the production front when the agent's first audio is pushed
        avatar, push = call.avatar, call.avatar.push_audio

        def push_audio(*a, **kw):
            if not fronts:
                fronts.append(avatar.driver.out_index(avatar.driver.samples))
            return push(*a, **kw)

        avatar.push_audio = push_audio

    server.on_call = watch
    page: dict = {}
    ag: dict = {}
    hangup = asyncio.Event()
    mic = np.zeros(16000 * 60, np.float32)  # the page's microphone
    if args.mic_turns:  # the page's turns: before the agent's, and after it
        voice = load_audio(HELLO_WAV, 16000)
        again = int(16000 * (args.warm_s + args.speech_s + 2.5))
        mic[: 16000 * 3 // 2] = voice[: 16000 * 3 // 2]
        mic[again : again + 32000] = voice[16000 * 2 : 16000 * 4]
    t_page = asyncio.ensure_future(page_call(url, hangup, mic, page))
    deadline = time.monotonic() + 60
    while not page.get("video"):
        if time.monotonic() > deadline or t_page.done():
            raise RuntimeError(f"call did not start: {page.get('msgs')}")
        await asyncio.sleep(0.05)
    await asyncio.sleep(args.warm_s)
    await agent(url, page["session"]["token"], speech, args.rate, ag)
    await asyncio.sleep(4.5 if args.mic_turns else 1.5)
    hangup.set()
    await asyncio.wait_for(t_page, 30)
    await server.stop()

    sent = ag["speech_at"]
    started = next((t for t, m in ag["msgs"] if m["type"] == "playback_started"), None)
    finished = next((t for t, m in ag["msgs"] if m["type"] == "playback_finished"), None)
    loud = [t for t, r in zip(page["audio"], page["audio_rms"], strict=True) if r > LOUD_RMS]
    stats = [
        [round(t - sent, 2), m.get("av_offset_ms"), m.get("late_frames"), m.get("rtf")]
        for t, m in page["msgs"]
        if m["type"] == "stats" and t >= sent - 1.0
    ]
    first_loud = loud[0] if loud else None
    last_loud = loud[-1] if loud else None
    rx = rx_offsets_ms(page, first_loud, last_loud) if loud else []
    at = np.array(page["audio_pts"]) - page["audio_pts"][0]
    loud_at = at[np.array(page["audio_rms"]) > LOUD_RMS]
    # The agent's first loud block: the first at most half a second before the front (an early
    # start), after the page's own first turn (--mic-turns) ended long before.
    rate = page["audio_rate"]
    agent_at = loud_at[loud_at >= fronts[0] - rate // 2] if fronts else loud_at
    emit(
        {
            "front_out": fronts[0] if fronts else None,
            "start_media_delay_s": (
                float(agent_at[0] - fronts[0]) / rate if fronts and agent_at.size else None
            ),
            "audible_media_s": (
                float(loud_at[-1] + rate // 50 - loud_at[0]) / rate if loud_at.size else None
            ),
            "audio_pts": page["audio_pts"],
            "start_delay_s": None if started is None else started - sent,
            "finish_delay_s": None if finished is None else finished - sent,
            "audible_delay_s": None if first_loud is None else first_loud - sent,
            "audible_s": None if not loud else last_loud - first_loud,
            "stats": stats,
            "stats_av_offset_ms": [s[1] for s in stats],
            "rx_av_offset_ms_median": float(np.median(rx)) if rx else None,
            "rx_av_offset_ms_p90_abs": float(np.percentile(np.abs(rx), 90)) if rx else None,
            "agent_msgs": [[round(t - sent, 3), m] for t, m in ag["msgs"]],
            "frames": [len(page["video"]), len(page["audio"])],
            # stretches of loud output, media seconds from the front (gaps under 0.3 s merged)
            "loud_runs": loud_runs((loud_at - fronts[0]) / rate) if fronts else [],
        }
    )


asyncio.run(main())
