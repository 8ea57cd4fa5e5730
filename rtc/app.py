"""Entry point of `talkloop serve`: load the model once, then serve calls until Ctrl-C."""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from pathlib import Path

import numpy as np

from pipeline.core.config import TalkloopConfig
from pipeline.core.errors import ConfigError
from pipeline.core.pipeline import Pipeline
from pipeline.models.registry import installed_weights, load_reference
from rtc.ice import IceConfig
from rtc.live import LiveConfig
from rtc.security import AccessPolicy
from rtc.server import OFFER_TIMEOUT_S, AvatarServer, check_sessions

# Live calls trade throughput for latency: short N chunks (a chunk's audio must be heard before
# it is generated, and the playout delay is two chunks plus the look-ahead plus 40 ms, see
# agent.session.default_playout_s), the same I-chunk smoothing. `talkloop bench --live`, 30 s calls
# with the trained model at 2/1 steps on the 2-core CPU, back to back: 6-frame chunks at 500 ms:
# glass-to-glass p50 565 / p95 606 ms, 8% late frames (in-server rtf 0.83); 5-frame chunks at
# 480 ms: p50 543 / p95 572 ms, 9% late (rtf 0.92). 4-frame chunks (400 ms) reach p95 ~520 ms but
# their in-server rtf (0.85-1.15 as this VM's speed drifts) leaves 5-40% of frames late.
LIVE_SCHEDULE = {"first_len": 2, "n_len": 5, "i_len": 2, "ctx_len": 2}

NO_WEIGHTS_NOTICE = (
    "No trained weights are installed: the avatar runs on random weights, so the video shows "
    "noise-like texture instead of a face. Lip sync, pacing and the call itself are real."
)


# Fewer Euler steps live: with short chunks the per-call cost dominates, and 4/2 steps do not
# keep up with real time on a 2-core CPU next to the WebRTC encoder (measured with `talkloop
# bench --live`: rtf 1.06 at 4/2 steps, generation alone 0.74; at 2/1 steps 0.53).
LIVE_SAMPLER = {"steps": 2, "i_steps": 1}


def live_config_dict(base: dict, sampler_given: bool = False) -> dict:
    """Apply the live schedule (unless the caller set one) and, unless ``sampler_given``, the
    live sampler steps (studio only: the portrait family's motion net costs well under a
    millisecond a frame, so it keeps its offline steps)."""
    out = {**base, "schedule": {**LIVE_SCHEDULE, **base.get("schedule", {})}}
    if not sampler_given and base.get("model", {}).get("family", "studio") == "studio":
        out["sampler"] = {**base.get("sampler", {}), **LIVE_SAMPLER}
    return out


def load_avatar(path: str | Path | None, config: TalkloopConfig) -> np.ndarray:
    """The avatar image of every call: ``path``, or the family's default avatar."""
    return load_reference(config, path)


async def serve_forever(
    config: TalkloopConfig,
    reference: np.ndarray,
    prompt: str,
    host: str,
    port: int,
    max_sessions: int,
    live: LiveConfig,
    notice: str,
    mirror_factory=None,
    access: AccessPolicy | None = None,
    ssl_context: ssl.SSLContext | None = None,
    offer_timeout_s: float = OFFER_TIMEOUT_S,
    notes: list[str] | None = None,
    ice: IceConfig | None = None,
) -> None:
    pipeline = await asyncio.to_thread(Pipeline.from_config, config)
    # Load the text encoder now (seconds), not when the first prompt arrives mid-call.
    text = pipeline.modules.get("text_encoder")
    if text is not None and hasattr(text.net, "load"):
        await asyncio.to_thread(text.net.load)
    server = AvatarServer(
        pipeline,
        reference,
        prompt,
        live,
        max_sessions,
        notice,
        mirror_factory=mirror_factory,
        access=access,
        offer_timeout_s=offer_timeout_s,
        ice=ice,
    )
    try:
        bound = await server.start(host, port, ssl_context=ssl_context)
    except OSError as err:  # port in use, address not on this machine, no permission
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    scheme = "https" if ssl_context is not None else "http"
    print(
        f"talkloop: serving on {scheme}://{shown}:{bound}/  (open it in a browser; Ctrl-C stops)",
        flush=True,
    )
    for line in notes or []:
        print(f"talkloop: {line}", flush=True)
    if notice:
        print(f"talkloop: note: {notice}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()
        print("talkloop: stopped", flush=True)


def resolve_weights(
    untrained: bool, weights: Path | None, family: str = "studio"
) -> tuple[bool, str]:
    """The server always starts: without trained weights it runs untrained and says so."""
    if untrained or weights is not None or installed_weights(family) is not None:
        return untrained, NO_WEIGHTS_NOTICE if untrained else ""
    logging.getLogger("talkloop").warning("no trained weights installed: running untrained")
    return True, NO_WEIGHTS_NOTICE


__all__ = [
    "check_sessions",
    "LIVE_SAMPLER",
    "LIVE_SCHEDULE",
    "live_config_dict",
    "load_avatar",
    "resolve_weights",
    "serve_forever",
]
