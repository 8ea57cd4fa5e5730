"""`talkloop serve` in one process: one port for the page (HTTP) and for signaling and control.

Each page's websocket to ``/ws`` opens one call (a ``Call``, ``talkloop/rtc/call.py``; up to
``max_calls``) and gets its token. A voice agent joins that call with
``/ws?token=<token>&role=agent`` (the agent protocol, ``talkloop/agent/protocol.py``): its speech
drives the avatar the viewer sees. A bad message is answered with an error and the call goes on;
a broken call ends alone (a generation failure is told to its page and agent as
``generation_failed``); the server keeps serving everyone else.

``AvatarServer`` composes four parts, each its own module:

- ``talkloop/rtc/admission.py``: the port, HTTP, and who may open a websocket (access token,
  Origin allow-list, per-address cap: ``talkloop/rtc/security.py``; TLS: ``talkloop/rtc/tls.py``);
  it routes each admitted websocket to one of the two endpoints below.
- ``talkloop/rtc/signaling.py``: the page's websocket (offer, answer, candidates, prompt, say,
  the page's own photo).
- ``talkloop/rtc/agent_endpoint.py``: the agent's websocket.
- ``talkloop/rtc/slots.py``: the slot pool (at most ``max_calls`` calls; a call whose page sends
  no offer within ``offer_timeout_s`` while no agent is connected gets ``offer_timeout`` and is
  closed, so an idle tab cannot hold a slot).

This module adds what only a process that runs its calls itself has: the pipeline, the avatar
and prompt of every call, its mirrors, and its control pool. Speech synthesis, call set-up and
the blocking parts of closing run on that small thread pool: aiortc encodes every call's audio
and video on the loop's default executor, and must never wait behind them. A cluster's front
(``talkloop/rtc/cluster.py``) composes the same admission with calls placed on other machines,
where each call runs this server's signaling and agent endpoint (``talkloop/rtc/call_host.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from talkloop.agent.session import MAX_QUEUED_SAYS
from talkloop.pipeline.core.clock import frame_start_sample
from talkloop.pipeline.core.heap import release_free_memory
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.outputs.sink import Sink
from talkloop.rtc.admission import WEB_DIR, Admission
from talkloop.rtc.agent_endpoint import AgentEndpoint
from talkloop.rtc.call import Call, CallConfig
from talkloop.rtc.ice import IceConfig
from talkloop.rtc.security import OFFER_TIMEOUT_S, AccessPolicy
from talkloop.rtc.signaling import PageSignaling
from talkloop.rtc.slots import CallSlot, SlotPool, call_token, check_max_calls

# The wire's name for a call's token (tests/agent and agents' scripts import it from here).
session_token = call_token

__all__ = [
    "MAX_QUEUED_SAYS",
    "OFFER_TIMEOUT_S",
    "WEB_DIR",
    "AvatarServer",
    "CallSlot",
    "call_token",
    "check_max_calls",
    "prepare_avatar",
    "session_token",
]


def prepare_avatar(pipeline: Pipeline, reference: np.ndarray, prompt: str) -> None:
    """Make one chunk of silence in a session on the server's avatar, so that its first calls
    start from what the family prepared for it at a session's start (for a photo: its face
    models, renderer and the render workers' copies, about 0.2 s of a core) and from networks
    that have run once, instead of paying for both while their first chunks are due. A
    process's first chunk costs several times a later one (its audio features 17 against 2 ms
    alone, 14-75 in a server's first call, whose first frames it made late in a quarter of the
    runs: docs/benchmarks.md, the Zen 3 entry of 2026-12-07 02:45-04:37). The silence is the
    first chunk's audio and look-ahead, then its end: the step makes that chunk whatever the
    schedule."""
    info = pipeline.info
    first = frame_start_sample(pipeline.config.schedule.first_len, info.fps, info.sample_rate)
    session = pipeline.open_session(reference, prompt, [])
    try:
        session.push_audio(np.zeros(first + pipeline.lookahead_samples, np.float32))
        session.end_audio()
        if session.step() == 0:
            raise RuntimeError("prepare_avatar: the first chunk of silence made no frame")
    finally:
        session.close()


# While calls run, how often the allocator's free pages go back to the system. A stall (a busy
# host) lets published frames and buffers pile up, and glibc keeps what they used once freed: a
# call's memory rose in steps of 2-5 MB at such moments. A trim every 30 s costs about 1 ms of
# CPU and halved that rise in a test of forced stalls (+10 MB in 5 minutes against +20; what
# stays is Python's object arenas and pages shared with live blocks): docs/benchmarks.md,
# "Figures behind code choices". A call's close also trims (``talkloop/rtc/slots.py``).
RELEASE_EVERY_S = 30.0


class AvatarServer:
    """Serves ``talkloop/web/`` and the websockets that open, drive and join calls.

    Args:
        pipeline: loaded pipeline (modules are shared by all calls).
        reference: (H, W, 3) uint8 avatar image.
        prompt: the initial style prompt of each call.
        call_config: the settings of every call.
        max_calls: concurrent calls at most; more get a "busy" error.
        notice: a line shown on the page (e.g. that no trained weights are installed).
        mirror_factory: makes the mirror sinks of a new call (e.g. a KVS copy) from the
            call's slot number (1..max_calls, unique among open calls, reused after a call
            ends), or None.
        access: who may connect (token, origins, per-address cap); default: no token, the
            server's own origin, ``DEFAULT_MAX_CONNECTIONS_PER_IP``.
        offer_timeout_s: a call whose page sends no offer this long (while no agent is
            connected) is closed with ``offer_timeout``.
        ice: the STUN/TURN servers of every call, for our peer and (in the hello) the page.
        max_sessions: the former name of ``max_calls`` (the CLI flag keeps it as an alias;
            tests/support.py's ``with_server`` still passes it).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        reference: np.ndarray,
        prompt: str = "",
        call_config: CallConfig | None = None,
        max_calls: int = 1,
        notice: str = "",
        web_dir: Path = WEB_DIR,
        mirror_factory: Callable[[int], list[Sink]] | None = None,
        access: AccessPolicy | None = None,
        offer_timeout_s: float = OFFER_TIMEOUT_S,
        ice: IceConfig | None = None,
        *,
        max_sessions: int | None = None,
    ) -> None:
        if max_sessions is not None:
            if max_calls not in (1, max_sessions):
                raise TypeError(f"max_calls={max_calls} and max_sessions={max_sessions}: give one")
            max_calls = max_sessions
        check_max_calls(pipeline.config, max_calls)
        self.pipeline = pipeline
        self.reference = reference
        self.prompt = prompt
        self.call_config = call_config or CallConfig()
        self.max_calls = max_calls
        self.notice = notice
        self.mirror_factory = mirror_factory
        self.ice = ice or IceConfig()
        self.on_call: Callable[[Call], None] | None = None  # observers (tests, agents)
        # One speaking line and a call set-up per call at a time, plus room for closing.
        self.executor = ThreadPoolExecutor(
            max_workers=max_calls + 2, thread_name_prefix="talkloop-control"
        )
        self.pool = SlotPool(
            max_calls,
            self.executor,
            offer_timeout_s,
            drains=lambda: self.mirror_factory is not None,
        )
        self.signaling = PageSignaling(
            self.pool,
            pipeline,
            self._open_call,
            prompt=prompt,
            notice=notice,
            ice=self.ice,
            executor=self.executor,
            on_open=self._opened,
        )
        self.agents = AgentEndpoint(self.pool, pipeline)
        self.admission = Admission(self.signaling.serve, self.agents.serve, access, web_dir)
        self._releasing: asyncio.Task | None = None

    @property
    def calls(self) -> dict[str, CallSlot]:
        """The open calls, by token."""
        return self.pool.calls

    @property
    def access(self) -> AccessPolicy:
        return self.admission.access

    async def _open_call(self, reference: np.ndarray | None, number: int) -> Call:
        """The Call of slot ``number``, on ``reference`` (None: the server's avatar), set up on
        the control pool."""
        token = call_token()
        mirrors = self.mirror_factory(number) if self.mirror_factory else []
        make = functools.partial(
            Call,
            self.pipeline,
            self.reference if reference is None else reference,
            self.prompt,
            self.call_config,
            token,
            mirrors,
            executor=self.executor,
        )
        return await asyncio.get_running_loop().run_in_executor(self.executor, make)

    def _opened(self, call: Call) -> None:
        if self.on_call is not None:
            self.on_call(call)

    # -- running -------------------------------------------------------------------------------

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Start listening (https/wss with ``ssl_context``); returns the port (for port 0)."""
        port = await self.admission.listen(host, port, ssl_context)
        self._releasing = asyncio.get_running_loop().create_task(self._release_memory())
        return port

    async def _release_memory(self) -> None:
        """Every ``RELEASE_EVERY_S`` while a call is open, give the allocator's free pages back
        (on the control pool: the loop never waits for it)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(RELEASE_EVERY_S)
            if self.pool.calls:
                await loop.run_in_executor(self.executor, release_free_memory)

    async def stop(self) -> None:
        if self._releasing is not None:
            self._releasing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._releasing
        await self.pool.close_all()
        await self.admission.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
