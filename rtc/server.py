"""`talkloop serve`: one port for the page (HTTP) and for signaling and control (websocket).

Each websocket connection to ``/ws`` opens one avatar session (up to ``max_sessions``) and gets a
token. A voice agent joins that session with ``/ws?token=<token>&role=agent`` (the agent protocol,
``agent/protocol.py``): its speech drives the avatar the viewer sees. A bad message is answered
with an error and the session goes on; a broken session ends alone; the server keeps serving
everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import mimetypes
import secrets
import time
from collections.abc import Callable
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

from agent.frames import PlaybackEvent, PlaybackStarted
from agent.protocol import AgentChannel, event_message
from pipeline.core.errors import TalkloopError
from pipeline.core.pipeline import Pipeline
from pipeline.outputs.sink import Sink
from rtc.avatar import AVATAR_WAIT_S, decode_avatar
from rtc.live import LiveConfig, LiveSession
from rtc.peer import Peer
from rtc.protocol import ProtocolError, error, parse_message

log = logging.getLogger("talkloop.server")

WEB_DIR = Path(__file__).resolve().parents[1] / "web"
MAX_MESSAGE_BYTES = 256 * 1024
STATS_INTERVAL_S = 1.0


def session_token() -> str:
    """A new session token: 32 hex digits (128 random bits).

    Hex, not ``secrets.token_urlsafe``: a token that starts with ``-`` (as about one in 32 of
    those do) is read as an option when pasted after ``--token`` on a command line, and ``-``
    and ``_`` make a user wonder what needs quoting. Hex digits never need it, in a URL or a shell.
    """
    return secrets.token_hex(16)


@dataclass
class Entry:
    """A session and what is attached to it."""

    live: LiveSession
    ws: ServerConnection
    slot: int  # 1..max_sessions, unique among open sessions (names per-session mirrors)
    peer: Peer | None = None
    agent: ServerConnection | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)
    closed: bool = False


class AvatarServer:
    """Serves ``web/`` and the session websocket.

    Args:
        pipeline: loaded pipeline (modules are shared by all sessions).
        reference: (H, W, 3) uint8 avatar image.
        prompt: the initial style prompt of each session.
        live: live-call settings.
        max_sessions: concurrent sessions at most; more get a "busy" error.
        notice: a line shown on the page (e.g. that no trained weights are installed).
        mirror_factory: makes the mirror sinks of a new session (e.g. a KVS copy) from the
            session's slot (1..max_sessions, unique among open sessions, reused after a session
            ends), or None.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        reference: np.ndarray,
        prompt: str = "",
        live: LiveConfig | None = None,
        max_sessions: int = 1,
        notice: str = "",
        web_dir: Path = WEB_DIR,
        mirror_factory: Callable[[int], list[Sink]] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.mirror_factory = mirror_factory
        self.reference = reference
        self.prompt = prompt
        self.live = live or LiveConfig()
        self.max_sessions = max_sessions
        self.notice = notice
        self.web_dir = web_dir
        self.sessions: dict[str, Entry] = {}
        self._pending: set[int] = set()  # slots of sessions being created (count against the cap)
        # Slots of closed sessions whose mirrors are still draining: a new session on the same
        # slot would write into the same per-session stream while the old one still uploads.
        self._draining: set[int] = set()
        self.on_session: Callable[[LiveSession], None] | None = None  # observers (tests, agents)
        self._ws: WsServer | None = None

    def _slots_taken(self) -> set[int]:
        return self._pending | self._draining | {e.slot for e in self.sessions.values()}

    # -- HTTP ----------------------------------------------------------------------------------

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == "/ws":
            return None  # continue with the websocket handshake
        if path == "/healthz":
            return connection.respond(HTTPStatus.OK, "ok\n")
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

    # -- websocket -----------------------------------------------------------------------------

    async def handler(self, ws: ServerConnection) -> None:
        query = parse_qs(urlsplit(ws.request.path).query)
        if "token" in query:
            token = query["token"][0]
            if token not in self.sessions:
                await ws.send(
                    error(
                        "bad_token", "unknown session token: it may have ended; open a new session"
                    )
                )
                await ws.close(4401, "unknown session token")
                return
            if query.get("role", [""])[0] != "agent":
                await ws.send(
                    error(
                        "not_supported",
                        "joining a running session is only supported for agents (role=agent)",
                    )
                )
                await ws.close(4400, "not supported")
                return
            await self._agent(self.sessions[token], ws)
            return
        free = set(range(1, self.max_sessions + 1)) - self._slots_taken()
        if len(self.sessions) + len(self._pending) >= self.max_sessions or not free:
            await ws.send(
                error(
                    "busy",
                    f"the server is at its limit of {self.max_sessions} session(s); try again later",
                )
            )
            await ws.close(1013, "busy")
            return
        slot = min(free)
        self._pending.add(slot)
        try:
            reference = self.reference
            if query.get("avatar", [""])[0] == "1":  # the page sends its own photo first
                reference = await self._read_avatar(ws)
            token = session_token()
            mirrors = self.mirror_factory(slot) if self.mirror_factory else []
            live = await asyncio.to_thread(
                LiveSession, self.pipeline, reference, self.prompt, self.live, token, mirrors
            )
        except ConnectionClosed:
            return
        except ProtocolError as err:  # a bad photo ends this connection only
            with contextlib.suppress(ConnectionClosed):
                await ws.send(error(err.code, str(err)))
                await ws.close(4400, err.code)
            return
        except Exception as err:
            log.exception("could not open a session")
            await ws.send(error("internal", f"could not open a session: {err}"))
            await ws.close(1011, "session failed")
            return
        finally:
            self._pending.discard(slot)
        entry = Entry(live, ws, slot)
        self.sessions[token] = entry
        live.avatar.listeners.append(lambda event: self._on_playback(entry, event))
        log.info("session %s opened (%d active)", token[:6], len(self.sessions))
        if self.on_session is not None:
            self.on_session(live)
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
                    }
                )
            )
            entry.tasks.append(asyncio.get_running_loop().create_task(self._stats(entry)))
            async for raw in ws:
                try:
                    await self._on_message(entry, raw)
                except ProtocolError as err:
                    await ws.send(error(err.code, str(err)))
                except TalkloopError as err:
                    await ws.send(error("bad_request", str(err)))
                if entry.closed:
                    break
        except ConnectionClosed:
            pass
        finally:
            await self._close(entry)

    async def _read_avatar(self, ws: ServerConnection) -> np.ndarray:
        """The photo a page announced with ``?avatar=1``, as the session's reference."""
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
        return await asyncio.to_thread(decode_avatar, msg.get("image"), self.pipeline.config)

    async def _on_message(self, entry: Entry, raw: str | bytes) -> None:
        msg = parse_message(raw)
        kind = msg["type"]
        live = entry.live
        if kind == "offer":
            if entry.peer is not None:
                raise ProtocolError(
                    "bad_state", "this session already has a call; open a new session"
                )
            peer = Peer(live, lambda: self._close(entry))
            entry.peer = peer
            try:
                sdp = await peer.answer(msg["sdp"])
            except ProtocolError:
                entry.peer = None
                await peer.close()
                raise
            await entry.ws.send(json.dumps({"type": "answer", "sdp": sdp}))
            live.start()
        elif kind == "candidate":
            if entry.peer is None:
                raise ProtocolError("bad_state", "send the offer before ICE candidates")
            await entry.peer.add_candidate(
                msg.get("candidate"), msg.get("sdpMid"), msg.get("sdpMLineIndex")
            )
        elif kind == "say":
            task = live.say(msg["text"])
            task.add_done_callback(lambda t: self._say_done(entry, t))
        elif kind == "prompt":
            live.set_prompt(msg["text"])
        elif kind == "interrupt":
            live.interrupt()
        elif kind == "bye":
            entry.closed = True
        elif kind == "avatar":
            raise ProtocolError(
                "bad_state", "the avatar photo goes first, on a connection to /ws?avatar=1"
            )

    # -- agents ----------------------------------------------------------------------------------

    async def _agent(self, entry: Entry, ws: ServerConnection) -> None:
        """One agent connection driving ``entry``'s session (agent/protocol.py)."""
        if entry.agent is not None:
            await ws.send(error("bad_state", "this session already has an agent connected"))
            await ws.close(4409, "agent already connected")
            return
        entry.agent = ws
        channel = AgentChannel(entry.live.avatar)
        info = self.pipeline.info
        log.info("session %s: agent connected", entry.live.token[:6])
        try:
            await ws.send(
                json.dumps(
                    {
                        "type": "agent",
                        "token": entry.live.token,
                        "sample_rate": info.sample_rate,
                        "video": {"width": info.width, "height": info.height, "fps": info.fps},
                    }
                )
            )
            async for raw in ws:
                try:
                    channel.handle(raw)
                except ProtocolError as err:
                    await ws.send(error(err.code, str(err)))
                except TalkloopError as err:
                    await ws.send(error("bad_request", str(err)))
                if channel.closed or entry.closed:
                    break
        except ConnectionClosed:
            pass
        finally:
            if entry.agent is ws:
                entry.agent = None
                if not entry.closed:
                    channel.detach()
            with contextlib.suppress(Exception):
                await ws.close()
            log.info("session %s: agent left", entry.live.token[:6])

    def _on_playback(self, entry: Entry, event: PlaybackEvent) -> None:
        """Playback events go to the page (``speech``) and to the agent (agent protocol)."""
        if isinstance(event, PlaybackStarted):
            state = "started"
        else:
            state = "interrupted" if event.interrupted else "finished"
        self._send_soon(entry, {"type": "speech", "state": state})
        if entry.agent is not None:
            self._send_soon(entry, event_message(event), entry.agent)

    def _say_done(self, entry: Entry, task: asyncio.Task) -> None:
        if task.cancelled() or entry.closed:
            return
        err = task.exception()
        if err is not None:
            code = "busy" if getattr(err, "retryable", False) else "bad_request"
            self._send_soon(entry, json.loads(error(code, f"say failed: {err}")))

    # -- sending -------------------------------------------------------------------------------

    def _send_soon(
        self, entry: Entry, msg: dict[str, Any], ws: ServerConnection | None = None
    ) -> None:
        if not entry.closed:
            task = asyncio.get_running_loop().create_task(self._send(entry, msg, ws))
            entry.tasks.append(task)
            # Finished sends leave the list: a long call must not accumulate done tasks.
            task.add_done_callback(lambda t: t in entry.tasks and entry.tasks.remove(t))

    async def _send(
        self, entry: Entry, msg: dict[str, Any], ws: ServerConnection | None = None
    ) -> None:
        with contextlib.suppress(ConnectionClosed):
            await (ws or entry.ws).send(json.dumps(msg))

    async def _stats(self, entry: Entry) -> None:
        last_sent, last_t = 0, time.monotonic()
        while not entry.closed:
            await asyncio.sleep(STATS_INTERVAL_S)
            stats = entry.live.stats()
            now = time.monotonic()
            stats["fps"] = round((stats["frames_sent"] - last_sent) / (now - last_t), 1)
            last_sent, last_t = stats["frames_sent"], now
            await self._send(entry, {"type": "stats", **stats})

    async def _close(self, entry: Entry) -> None:
        if self.sessions.get(entry.live.token) is not entry:
            return
        entry.closed = True
        del self.sessions[entry.live.token]
        if self.mirror_factory is not None:
            self._draining.add(entry.slot)
        for task in entry.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if entry.peer is not None:
            with contextlib.suppress(Exception):
                await entry.peer.close()
        try:
            await entry.live.close()
        finally:
            self._draining.discard(entry.slot)
        for ws in (entry.ws, entry.agent):
            if ws is not None:
                with contextlib.suppress(Exception):
                    await ws.close()
        log.info("session %s closed (%d active)", entry.live.token[:6], len(self.sessions))

    # -- running -------------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Start listening; returns the port (useful with port 0)."""
        self._ws = await serve(
            self.handler,
            host,
            port,
            process_request=self.process_request,
            max_size=MAX_MESSAGE_BYTES,
            ping_interval=20,
            ping_timeout=20,
        )
        return self._ws.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for entry in list(self.sessions.values()):
            await self._close(entry)
        if self._ws is not None:
            self._ws.close()
            await self._ws.wait_closed()
