"""Admission: the door of `talkloop serve`, the one port for the page (HTTP) and the websockets.

HTTP: the page (``talkloop/web/``), ``/healthz``, and ``/api/access`` (whether the page must ask
for the access token). A websocket to ``/ws`` is refused before the upgrade for a foreign Origin
(403) or too many connections from one address (429); once open, it is counted against its
address until it closes, and without the access token it gets ``bad_access`` (close 4401). The
rules are ``talkloop/rtc/security.py``'s; TLS is ``talkloop/rtc/tls.py``'s context.

An admitted websocket goes to one of two routes: with ``?token=`` to the agent route (an agent
joining a running call), else to the page route (a page opening a call). A single process
routes them to its page signaling and agent endpoint (``talkloop/rtc/server.py``); a cluster's
front to its placement and relay (``talkloop/rtc/cluster.py``).
"""

from __future__ import annotations

import json
import logging
import mimetypes
import ssl
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from talkloop.rtc.protocol import error
from talkloop.rtc.security import AccessPolicy

log = logging.getLogger("talkloop.server")

WEB_DIR = Path(__file__).resolve().parents[1] / "web"
MAX_MESSAGE_BYTES = 256 * 1024

Query = dict[str, list[str]]
Route = Callable[[ServerConnection, Query], Awaitable[None]]

__all__ = ["MAX_MESSAGE_BYTES", "WEB_DIR", "Admission", "Query", "Route", "client_address"]


def client_address(ws: ServerConnection) -> str:
    """The client's IP address (the per-address cap counts by it)."""
    peer = ws.remote_address
    return str(peer[0]) if peer else "?"


class Admission:
    """Serves the page over HTTP and admits websockets to ``page`` or ``agent``.

    Args:
        page: serves a page's websocket (no ``token`` in its query) until it closes.
        agent: serves a websocket with a ``token`` in its query (an agent) until it closes.
        access: who may connect (token, origins, per-address cap); default: no token, the
            server's own origin, ``DEFAULT_MAX_CONNECTIONS_PER_IP``.
        web_dir: the page's folder.
    """

    def __init__(
        self,
        page: Route,
        agent: Route,
        access: AccessPolicy | None = None,
        web_dir: Path = WEB_DIR,
    ) -> None:
        self.page, self.agent = page, agent
        self.access = access or AccessPolicy()
        self.web_dir = web_dir
        self.scheme = "http"  # "https" once started with TLS (the page's origin says which)
        self._ws: WsServer | None = None

    # -- HTTP ----------------------------------------------------------------------------------

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == "/ws":
            return self._refuse_before_upgrade(connection, request)
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

    def _refuse_before_upgrade(
        self, connection: ServerConnection, request: Request
    ) -> Response | None:
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
                f"origin {', '.join(origins)} may not open calls here; the server's operator "
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
        # Counted here, not before the upgrade: a handshake that fails after it never reaches us.
        if not self.access.opened(address):  # several handshakes raced past the check
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
            await (self.agent if "token" in query else self.page)(ws, query)
        except ConnectionClosed:
            pass
        finally:
            self.access.closed(address)

    # -- running -------------------------------------------------------------------------------

    async def listen(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
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

    async def close(self) -> None:
        """Stop listening and close the connections still open."""
        if self._ws is not None:
            self._ws.close()
            await self._ws.wait_closed()
