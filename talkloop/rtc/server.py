"""`talkloop serve`: one port for the page (HTTP) and for signaling and control (websocket).

Each websocket connection to ``/ws`` opens one call (a ``Call``, ``talkloop/rtc/call.py``; up to
``max_sessions``) and gets a token, which the protocol calls the session token. A voice agent
joins that call with ``/ws?token=<token>&role=agent`` (the agent protocol,
``talkloop/agent/protocol.py``): its speech drives the avatar the viewer sees. A bad message is answered
with an error and the call goes on; a broken call ends alone (a generation failure is told
to its page and agent as ``generation_failed``); the server keeps serving everyone else.

Who may connect (access token, Origin allow-list, per-address cap) is ``talkloop/rtc/security.py``; TLS is
``talkloop/rtc/tls.py``. A call whose page sends no offer within ``offer_timeout_s`` (while no agent is
connected to it) gets ``offer_timeout`` and is closed, so an idle tab cannot hold a slot.

Speech synthesis, call set-up and the blocking parts of closing run on the server's own small
thread pool: aiortc encodes every call's audio and video on the loop's default executor, and
must never wait behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import mimetypes
import secrets
import ssl
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from talkloop.agent.frames import PlaybackEvent, PlaybackStarted
from talkloop.agent.protocol import AgentChannel, event_message
from talkloop.agent.session import MAX_QUEUED_SAYS
from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.errors import ConfigError, TalkloopError
from talkloop.pipeline.core.heap import release_free_memory
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.outputs.sink import Sink
from talkloop.rtc.avatar import AVATAR_WAIT_S, decode_avatar
from talkloop.rtc.call import Call, CallConfig
from talkloop.rtc.ice import IceConfig
from talkloop.rtc.peer import Peer
from talkloop.rtc.protocol import ProtocolError, error, parse_message
from talkloop.rtc.security import OFFER_TIMEOUT_S, AccessPolicy

log = logging.getLogger("talkloop.server")

WEB_DIR = Path(__file__).resolve().parents[1] / "web"
MAX_MESSAGE_BYTES = 256 * 1024
STATS_INTERVAL_S = 1.0
__all__ = [
    "MAX_QUEUED_SAYS",
    "OFFER_TIMEOUT_S",
    "AvatarServer",
    "CallSlot",
    "check_sessions",
    "session_token",
]


def error_code(err: TalkloopError) -> str:
    """The protocol code of an error that is not a ProtocolError: busy (retry later) or not."""
    return "busy" if err.retryable else "bad_request"


def check_sessions(config: TalkloopConfig, max_sessions: int) -> None:
    """Refuse settings that cannot serve ``max_sessions`` calls at once.

    An offloaded module streams its blocks through one ring of device slots (its
    BlockOffloader); two calls' generation threads would overwrite each other's blocks.
    """
    offloaded = [n for n, m in config.model.placement.model_dump().items() if m == "offloaded"]
    if offloaded and max_sessions > 1:
        raise ConfigError(
            f"--placement {','.join(f'{n}=offloaded' for n in offloaded)} serves one session at "
            f"a time (the offloaded blocks share one ring of device slots), but --max-sessions is "
            f"{max_sessions}; use --max-sessions 1 or resident placement"
        )


def client_address(ws: ServerConnection) -> str:
    """The client's IP address (the per-address cap counts by it)."""
    peer = ws.remote_address
    return str(peer[0]) if peer else "?"


async def refuse_unless_agent(ws: ServerConnection, query: dict[str, list[str]]) -> bool:
    """Only an agent (``role=agent``) may join a running call by its token: anything else is
    told so and closed. True when it was refused."""
    if query.get("role", [""])[0] == "agent":
        return False
    await ws.send(
        error(
            "not_supported", "joining a running session is only supported for agents (role=agent)"
        )
    )
    await ws.close(4400, "not supported")
    return True


def session_token() -> str:
    """A new session token: 32 hex digits (128 random bits).

    Hex, not ``secrets.token_urlsafe``: a token that starts with ``-`` (as about one in 32 of
    those do) is read as an option when pasted after ``--token`` on a command line, and ``-``
    and ``_`` make a user wonder what needs quoting. Hex digits never need it, in a URL or a shell.
    """
    return secrets.token_hex(16)


@dataclass
class CallSlot:
    """The server's record of one call: the Call and the connections that drive it.

    The Call (``talkloop/rtc/call.py``) is the media side (peer, avatar, mirrors); this adds what only
    the server knows: the page's and the agent's websockets, the slot number and the timers.
    """

    call: Call
    ws: ServerConnection  # the page's websocket
    number: int  # 1..max_sessions, unique among open calls (names per-call mirrors)
    agent: ServerConnection | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)
    offer_timer: asyncio.TimerHandle | None = None  # armed while no peer and no agent
    closed: bool = False


class AvatarServer:
    """Serves ``talkloop/web/`` and the websocket that opens and controls calls.

    Args:
        pipeline: loaded pipeline (modules are shared by all calls).
        reference: (H, W, 3) uint8 avatar image.
        prompt: the initial style prompt of each call.
        call_config: the settings of every call.
        max_sessions: concurrent calls at most; more get a "busy" error.
        notice: a line shown on the page (e.g. that no trained weights are installed).
        mirror_factory: makes the mirror sinks of a new call (e.g. a KVS copy) from the
            call's slot number (1..max_sessions, unique among open calls, reused after a call
            ends), or None.
        access: who may connect (token, origins, per-address cap); default: no token, the
            server's own origin, ``DEFAULT_MAX_CONNECTIONS_PER_IP``.
        offer_timeout_s: a call whose page sends no offer this long (while no agent is
            connected) is closed with ``offer_timeout``.
        ice: the STUN/TURN servers of every call, for our peer and (in ``session``) the page.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        reference: np.ndarray,
        prompt: str = "",
        call_config: CallConfig | None = None,
        max_sessions: int = 1,
        notice: str = "",
        web_dir: Path = WEB_DIR,
        mirror_factory: Callable[[int], list[Sink]] | None = None,
        access: AccessPolicy | None = None,
        offer_timeout_s: float = OFFER_TIMEOUT_S,
        ice: IceConfig | None = None,
    ) -> None:
        check_sessions(pipeline.config, max_sessions)
        self.ice = ice or IceConfig()
        self.pipeline = pipeline
        self.access = access or AccessPolicy()
        self.offer_timeout_s = offer_timeout_s
        # One speaking line and a call set-up per call at a time, plus room for closing.
        self.executor = ThreadPoolExecutor(
            max_workers=max_sessions + 2, thread_name_prefix="talkloop-control"
        )
        self.scheme = "http"  # "https" once started with TLS (the page's origin says which)
        self.mirror_factory = mirror_factory
        self.reference = reference
        self.prompt = prompt
        self.call_config = call_config or CallConfig()
        self.max_sessions = max_sessions
        self.notice = notice
        self.web_dir = web_dir
        self.calls: dict[str, CallSlot] = {}  # by token
        self._pending: set[int] = set()  # slots of calls being created (count against the cap)
        # Slots of closed calls whose mirrors are still draining: a new call on the same slot
        # would write into the same per-call stream while the old one still uploads.
        self._draining: set[int] = set()
        self.on_call: Callable[[Call], None] | None = None  # observers (tests, agents)
        self._ending: set[asyncio.Task] = set()  # calls being ended by the server
        self._ws: WsServer | None = None

    def _slots_taken(self) -> set[int]:
        return self._pending | self._draining | {s.number for s in self.calls.values()}

    # -- HTTP ----------------------------------------------------------------------------------

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == "/ws":
            return self._admit(connection, request)
        if path == "/healthz":
            return connection.respond(HTTPStatus.OK, "ok\n")
        if path == "/api/access":  # the page asks whether to prompt for the access token
            body = json.dumps({"token_required": self.access.token is not None}).encode()
            headers = Headers(
                {
                    "Content-Type": "application/json",
                    "Content-Length": str(len(body)),
                    "Cache-Control": "no-store",
                }
            )
            return Response(HTTPStatus.OK, "OK", headers, body)
        name = "index.html" if path in ("/", "") else path.lstrip("/")
        target = (self.web_dir / name).resolve()
        if self.web_dir.resolve() not in target.parents or not target.is_file():
            return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype == "application/javascript":
            ctype += "; charset=utf-8"
        body = target.read_bytes()
        headers = Headers(
            {"Content-Type": ctype, "Content-Length": str(len(body)), "Cache-Control": "no-cache"}
        )
        return Response(HTTPStatus.OK, "OK", headers, body)

    def _admit(self, connection: ServerConnection, request: Request) -> Response | None:
        """Refuse a websocket before the upgrade: a foreign Origin (403), too many from one
        address (429). None lets the handshake go on."""
        origins = request.headers.get_all("Origin")
        hosts = request.headers.get_all("Host")
        origin = origins[0] if len(origins) == 1 else None
        host = hosts[0] if len(hosts) == 1 else None
        if len(origins) > 1 or not self.access.origin_ok(origin, host, self.scheme):
            log.info("refused a websocket from origin %r (host %r)", origins, host)
            return connection.respond(
                HTTPStatus.FORBIDDEN,
                f"origin {', '.join(origins)} may not open sessions here; the server's operator "
                "can allow it with --allow-origin\n",
            )
        address = client_address(connection)
        if not self.access.may_connect(address):
            return connection.respond(
                HTTPStatus.TOO_MANY_REQUESTS,
                f"{address} has {self.access.max_connections_per_ip} connections open already; "
                "close one first\n",
            )
        return None

    # -- websocket -----------------------------------------------------------------------------

    async def handler(self, ws: ServerConnection) -> None:
        address = client_address(ws)
        # Counted here, not in _admit: a handshake that fails after it never reaches us.
        if not self.access.opened(address):  # several handshakes raced past _admit
            await ws.close(1008, "too many connections from this address")
            return
        try:
            query = parse_qs(urlsplit(ws.request.path).query)
            if not self.access.token_ok(query.get("access", [None])[0]):
                await ws.send(
                    error(
                        "bad_access",
                        "the access token is missing or wrong: this server needs it on every "
                        "connection (?access=<token>; the page asks for it, an agent takes "
                        "--access-token); ask the server's operator for it",
                    )
                )
                await ws.close(4401, "access token missing or wrong")
                return
            await self._route(ws, query)
        except ConnectionClosed:
            pass
        finally:
            self.access.closed(address)

    async def _route(self, ws: ServerConnection, query: dict[str, list[str]]) -> None:
        if "token" in query:
            token = query["token"][0]
            if token not in self.calls:
                await ws.send(
                    error(
                        "bad_token", "unknown session token: it may have ended; open a new session"
                    )
                )
                await ws.close(4401, "unknown session token")
                return
            if await refuse_unless_agent(ws, query):
                return
            await self._agent(self.calls[token], ws)
            return
        free = set(range(1, self.max_sessions + 1)) - self._slots_taken()
        if len(self.calls) + len(self._pending) >= self.max_sessions or not free:
            await ws.send(
                error(
                    "busy",
                    f"the server is at its limit of {self.max_sessions} session(s); try again later",
                )
            )
            await ws.close(1013, "busy")
            return
        number = min(free)
        self._pending.add(number)
        loop = asyncio.get_running_loop()
        try:
            reference = self.reference
            if query.get("avatar", [""])[0] == "1":  # the page sends its own photo first
                reference = await self._read_avatar(ws)
            token = session_token()
            mirrors = self.mirror_factory(number) if self.mirror_factory else []
            make = functools.partial(
                Call,
                self.pipeline,
                reference,
                self.prompt,
                self.call_config,
                token,
                mirrors,
                executor=self.executor,
            )
            call = await loop.run_in_executor(self.executor, make)
        except ConnectionClosed:
            return
        except ProtocolError as err:  # a bad photo ends this connection only
            with contextlib.suppress(ConnectionClosed):
                await ws.send(error(err.code, str(err)))
                await ws.close(4400, err.code)
            return
        except Exception as err:
            log.exception("could not open a call")
            await ws.send(error("internal", f"could not open a session: {err}"))
            await ws.close(1011, "session failed")
            return
        finally:
            self._pending.discard(number)
        slot = CallSlot(call, ws, number)
        self.calls[token] = slot
        call.avatar.listeners.append(lambda event: self._on_playback(slot, event))
        call.avatar.failure_listeners.append(lambda err: self._on_failure(slot, err))
        self._arm_offer_timer(slot)
        log.info("call %s opened (%d active)", token[:6], len(self.calls))
        if self.on_call is not None:
            self.on_call(call)
        try:
            await ws.send(
                json.dumps(
                    {
                        "type": "session",
                        "token": token,
                        "notice": self.notice,
                        "video": {
                            "width": self.pipeline.info.width,
                            "height": self.pipeline.info.height,
                            "fps": self.pipeline.info.fps,
                        },
                        "prompt": self.prompt,
                        "ice": self.ice.for_page(),
                    }
                )
            )
            slot.tasks.append(asyncio.get_running_loop().create_task(self._stats(slot)))
            async for raw in ws:
                reply = await self._guarded(slot, self._on_message(slot, raw))
                if reply is not None:
                    await ws.send(reply)
                if slot.closed:
                    break
        except ConnectionClosed:
            pass
        finally:
            await self._close(slot)

    async def _guarded(self, slot: CallSlot, action) -> str | None:
        """Run one message's ``action``; every failure becomes the ``error`` reply (None: none),
        so no message, however bad, ends the call or its receive loop."""
        try:
            await action
        except ProtocolError as err:
            return error(err.code, str(err))
        except TalkloopError as err:
            return error(error_code(err), str(err))
        except Exception as err:  # a bug or a library's surprise: this message only
            log.warning("call %s: a message failed: %r", slot.call.token[:6], err, exc_info=True)
            return error("internal", f"the server could not act on that message ({err!r:.200})")
        return None

    async def _read_avatar(self, ws: ServerConnection) -> np.ndarray:
        """The photo a page announced with ``?avatar=1``, as the call's reference."""
        try:
            raw = await asyncio.wait_for(ws.recv(), AVATAR_WAIT_S)
        except TimeoutError:
            raise ProtocolError(
                "bad_avatar", f"no avatar photo arrived within {AVATAR_WAIT_S:g} s"
            ) from None
        msg = parse_message(raw)
        if msg["type"] != "avatar":
            raise ProtocolError(
                "bad_avatar",
                f"expected the avatar photo first (connected with ?avatar=1), got {msg['type']!r}",
            )
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, decode_avatar, msg.get("image"), self.pipeline.config
        )

    async def _on_message(self, slot: CallSlot, raw: str | bytes) -> None:
        msg = parse_message(raw)
        kind = msg["type"]
        call = slot.call
        if kind == "offer":
            if call.peer is not None:
                raise ProtocolError(
                    "bad_state", "this session already has a call; open a new session"
                )
            peer = Peer(
                call.audio_track,
                call.video_track,
                on_microphone=call.attach_microphone,
                on_closed=lambda: self._close(slot),
                configuration=self.ice.rtc_configuration(),
                name=call.token[:6],
            )
            call.peer = peer
            self._disarm_offer_timer(slot)
            try:
                sdp = await peer.answer(msg["sdp"])
            except ProtocolError:
                call.peer = None
                await peer.close()
                self._arm_offer_timer(slot)
                raise
            await slot.ws.send(json.dumps({"type": "answer", "sdp": sdp}))
            call.start()
        elif kind == "candidate":
            if call.peer is None:
                raise ProtocolError("bad_state", "send the offer before ICE candidates")
            await call.peer.add_candidate(
                msg.get("candidate"), msg.get("sdpMid"), msg.get("sdpMLineIndex")
            )
        elif kind == "say":
            task = call.say(msg["text"])
            task.add_done_callback(lambda t: self._say_done(slot, t))
        elif kind == "prompt":
            call.set_prompt(msg["text"])
        elif kind == "interrupt":
            call.interrupt()
        elif kind == "bye":
            slot.closed = True
        elif kind == "avatar":
            raise ProtocolError(
                "bad_state", "the avatar photo goes first, on a connection to /ws?avatar=1"
            )

    # -- agents ----------------------------------------------------------------------------------

    async def _agent(self, slot: CallSlot, ws: ServerConnection) -> None:
        """One agent connection driving ``slot``'s call (talkloop/agent/protocol.py)."""
        if slot.agent is not None:
            await ws.send(error("bad_state", "this session already has an agent connected"))
            await ws.close(4409, "agent already connected")
            return
        slot.agent = ws
        self._disarm_offer_timer(slot)  # a connected agent is activity: see docs/agents.md
        channel = AgentChannel(slot.call.avatar)
        info = self.pipeline.info
        log.info("call %s: agent connected", slot.call.token[:6])
        try:
            await ws.send(
                json.dumps(
                    {
                        "type": "agent",
                        "token": slot.call.token,
                        "sample_rate": info.sample_rate,
                        "output_sample_rate": slot.call.avatar.sample_rate,
                        "video": {"width": info.width, "height": info.height, "fps": info.fps},
                    }
                )
            )
            async for raw in ws:
                reply = await self._guarded(slot, self._agent_message(channel, raw))
                if reply is not None:
                    await ws.send(reply)
                if channel.closed or slot.closed:
                    break
        except ConnectionClosed:
            pass
        finally:
            if slot.agent is ws:
                slot.agent = None
                if not slot.closed:
                    with contextlib.suppress(Exception):
                        channel.detach()
                    if slot.call.peer is None:
                        self._arm_offer_timer(slot)
            with contextlib.suppress(Exception):
                await ws.close()
            log.info("call %s: agent left", slot.call.token[:6])

    @staticmethod
    async def _agent_message(channel: AgentChannel, raw: str | bytes) -> None:
        channel.handle(raw)

    # -- offer timeout, failures ---------------------------------------------------------------

    def _arm_offer_timer(self, slot: CallSlot) -> None:
        self._disarm_offer_timer(slot)
        if not slot.closed:
            slot.offer_timer = asyncio.get_running_loop().call_later(
                self.offer_timeout_s, self._offer_timed_out, slot
            )

    @staticmethod
    def _disarm_offer_timer(slot: CallSlot) -> None:
        if slot.offer_timer is not None:
            slot.offer_timer.cancel()
            slot.offer_timer = None

    def _offer_timed_out(self, slot: CallSlot) -> None:
        slot.offer_timer = None
        if slot.closed or slot.call.peer is not None or slot.agent is not None:
            return
        log.info("call %s: no offer within %g s", slot.call.token[:6], self.offer_timeout_s)
        msg = error(
            "offer_timeout",
            f"no offer within {self.offer_timeout_s:g} s: the session was closed to free its "
            "slot; start the call again",
        )
        self._end_soon(slot, msg, 4408, "no offer")

    def _on_failure(self, slot: CallSlot, err: BaseException) -> None:
        """Generation failed: tell the page and the agent, then end this call only."""
        msg = error(
            "generation_failed",
            f"the avatar stopped: generation failed ({err}); the call has ended, start a new one",
        )
        self._end_soon(slot, msg, 1011, "generation failed")

    def _end_soon(self, slot: CallSlot, msg: str, code: int, reason: str) -> None:
        async def end() -> None:
            for ws in (slot.ws, slot.agent):
                if ws is not None:
                    with contextlib.suppress(ConnectionClosed):
                        await ws.send(msg)
            with contextlib.suppress(Exception):
                await slot.ws.close(code, reason)
            await self._close(slot)

        if not slot.closed:
            # Not in slot.tasks: _close cancels those, and this task is the one calling it.
            task = asyncio.get_running_loop().create_task(end())
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

    def _on_playback(self, slot: CallSlot, event: PlaybackEvent) -> None:
        """Playback events go to the page (``speech``) and to the agent (agent protocol)."""
        if isinstance(event, PlaybackStarted):
            state = "started"
        else:
            state = "interrupted" if event.interrupted else "finished"
        self._send_soon(slot, {"type": "speech", "state": state})
        if slot.agent is not None:
            self._send_soon(slot, event_message(event), slot.agent)

    def _say_done(self, slot: CallSlot, task: asyncio.Task) -> None:
        if task.cancelled() or slot.closed:
            return
        err = task.exception()
        if err is not None:
            code = "busy" if getattr(err, "retryable", False) else "bad_request"
            self._send_soon(slot, json.loads(error(code, f"say failed: {err}")))

    # -- sending -------------------------------------------------------------------------------

    def _send_soon(
        self, slot: CallSlot, msg: dict[str, Any], ws: ServerConnection | None = None
    ) -> None:
        if not slot.closed:
            task = asyncio.get_running_loop().create_task(self._send(slot, msg, ws))
            slot.tasks.append(task)
            # Finished sends leave the list: a long call must not accumulate done tasks.
            task.add_done_callback(lambda t: t in slot.tasks and slot.tasks.remove(t))

    async def _send(
        self, slot: CallSlot, msg: dict[str, Any], ws: ServerConnection | None = None
    ) -> None:
        with contextlib.suppress(ConnectionClosed):
            await (ws or slot.ws).send(json.dumps(msg))

    async def _stats(self, slot: CallSlot) -> None:
        last_sent, last_t = 0, time.monotonic()
        while not slot.closed:
            await asyncio.sleep(STATS_INTERVAL_S)
            stats = slot.call.stats()
            now = time.monotonic()
            stats["fps"] = round((stats["frames_sent"] - last_sent) / (now - last_t), 1)
            last_sent, last_t = stats["frames_sent"], now
            await self._send(slot, {"type": "stats", **stats})

    async def _close(self, slot: CallSlot) -> None:
        if self.calls.get(slot.call.token) is not slot:
            return
        slot.closed = True
        del self.calls[slot.call.token]
        self._disarm_offer_timer(slot)
        if self.mirror_factory is not None:
            self._draining.add(slot.number)
        for task in slot.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        try:
            await slot.call.close()
        finally:
            self._draining.discard(slot.number)
        for ws in (slot.ws, slot.agent):
            if ws is not None:
                with contextlib.suppress(Exception):
                    await ws.close()
        log.info("call %s closed (%d active)", slot.call.token[:6], len(self.calls))
        # what the call freed goes back to the system instead of staying in the allocator's pools
        await asyncio.get_running_loop().run_in_executor(self.executor, release_free_memory)

    # -- running -------------------------------------------------------------------------------

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Start listening (https/wss with ``ssl_context``); returns the port (for port 0)."""
        self.scheme = "https" if ssl_context is not None else "http"
        self._ws = await serve(
            self.handler,
            host,
            port,
            ssl=ssl_context,
            process_request=self.process_request,
            max_size=MAX_MESSAGE_BYTES,
            ping_interval=20,
            ping_timeout=20,
        )
        return self._ws.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for slot in list(self.calls.values()):
            await self._close(slot)
        for task in list(self._ending):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._ws is not None:
            self._ws.close()
            await self._ws.wait_closed()
        self.executor.shutdown(wait=False, cancel_futures=True)
