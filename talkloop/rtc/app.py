"""Entry point of `talkloop serve`: load the model once, then serve calls until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
from pathlib import Path

import numpy as np

from talkloop.pipeline.cluster.connect import disconnect
from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.core.heap import freeze_loaded
from talkloop.pipeline.core.threadnames import NAME_EVERY_S, name_os_threads
from talkloop.pipeline.models.registry import (
    build_pipeline,
    installed_weights,
    load_reference,
    spec,
)
from talkloop.pipeline.models.spec import DEFAULT_FAMILY
from talkloop.rtc.call import CallConfig
from talkloop.rtc.cluster import cluster_server
from talkloop.rtc.ice import IceConfig
from talkloop.rtc.security import OFFER_TIMEOUT_S, AccessPolicy
from talkloop.rtc.server import AvatarServer, prepare_avatar
from talkloop.rtc.slots import check_max_calls

NO_WEIGHTS_NOTICE = (
    "No trained weights are installed: the avatar runs on random weights, so the video shows "
    "noise-like texture instead of a face. Lip sync, pacing and the call itself are real."
)


def live_config_dict(base: dict, sampler_given: bool = False) -> dict:
    """Apply the family's live schedule (unless the caller set one), unless ``sampler_given``
    its live sampler steps (the family spec's ``live_schedule`` and ``live_sampler``,
    ``talkloop/pipeline/models/spec.py``), and unless set a render process per core
    (``model.render_processes`` None)."""
    model = base.get("model", {})
    fam = spec(model.get("family", DEFAULT_FAMILY))
    out = {**base, "schedule": {**fam.live_schedule, **base.get("schedule", {})}}
    if model.get("render_processes") is None:  # one per core, away from the event loop
        out["model"] = {**model, "render_processes": len(os.sched_getaffinity(0))}
    if not sampler_given:
        out["sampler"] = {**base.get("sampler", {}), **fam.live_sampler}
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
    max_calls: int,
    call_config: CallConfig,
    notice: str,
    mirror_factory=None,
    access: AccessPolicy | None = None,
    ssl_context: ssl.SSLContext | None = None,
    offer_timeout_s: float = OFFER_TIMEOUT_S,
    notes: list[str] | None = None,
    ice: IceConfig | None = None,
    cluster: str | None = None,
) -> None:
    if cluster is not None:  # calls run on Ray actors across the cluster (talkloop/rtc/cluster.py)
        server, where = await asyncio.to_thread(
            cluster_server,
            cluster,
            config,
            reference,
            prompt,
            max_calls,
            call_config,
            notice,
            mirror_factory,
            access,
            offer_timeout_s,
            ice,
        )
        notes = [*(notes or []), where]
    else:
        pipeline = await asyncio.to_thread(build_pipeline, config)
        # Load the text encoder now (seconds), not when the first prompt arrives mid-call.
        text = pipeline.modules.get("text_encoder")
        if text is not None and hasattr(text.net, "load"):
            await asyncio.to_thread(text.net.load)
        await asyncio.to_thread(prepare_avatar, pipeline, reference, prompt)
        server = AvatarServer(
            pipeline,
            reference,
            prompt,
            call_config,
            max_calls,
            notice,
            mirror_factory=mirror_factory,
            access=access,
            offer_timeout_s=offer_timeout_s,
            ice=ice,
        )
    freeze_loaded()  # what the server keeps is loaded: full GC passes skip it from now on
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
    naming = loop.create_task(_name_threads())
    try:
        await stop.wait()
    finally:
        naming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await naming
        await server.stop()
        if cluster is not None:  # leave Ray now, not in its exit hook (which sets status 1)
            await asyncio.to_thread(disconnect)
        print("talkloop: stopped", flush=True)


async def _name_threads() -> None:
    """Give the OS the names of the server's threads (``top -H``, ``talkloop bench --calls``:
    ``talkloop/pipeline/core/threadnames.py``) every ``NAME_EVERY_S``, until cancelled; a
    call's threads start with the call."""
    while True:
        name_os_threads()
        await asyncio.sleep(NAME_EVERY_S)


def resolve_weights(
    untrained: bool, weights: Path | None, family: str = DEFAULT_FAMILY
) -> tuple[bool, str]:
    """The server always starts: without trained weights it runs untrained and says so."""
    if untrained or weights is not None or installed_weights(family) is not None:
        return untrained, NO_WEIGHTS_NOTICE if untrained else ""
    logging.getLogger("talkloop").warning("no trained weights installed: running untrained")
    return True, NO_WEIGHTS_NOTICE


__all__ = [
    "check_max_calls",
    "live_config_dict",
    "load_avatar",
    "resolve_weights",
    "serve_forever",
]
