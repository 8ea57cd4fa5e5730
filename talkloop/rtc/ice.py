"""ICE servers of a call: which STUN/TURN servers both peers use, and whether only relays count.

One ``IceConfig`` feeds both sides: aiortc's ``RTCConfiguration`` on the server (``talkloop/rtc/peer.py``)
and the page's ``new RTCPeerConnection({iceServers, iceTransportPolicy})`` (sent in the
``session`` message, so only a page that passed the access token learns TURN credentials).

URLs follow RFC 7064/7065, as browsers take them: ``stun:HOST[:PORT]``,
``turn:HOST[:PORT][?transport=udp|tcp]``, ``turns:HOST[:PORT][?transport=tcp]``. A TURN server's
user name and password come from ``--ice-username``/``--ice-credential`` (one pair for all TURN
URLs), never from the URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiortc import RTCConfiguration, RTCIceServer
from aiortc.rtcconfiguration import RTCIceTransportPolicy

from talkloop.pipeline.core.errors import ConfigError

# host: a name, an IPv4 address or a bracketed IPv6 address; port 1-65535 checked below.
_URL = re.compile(
    r"(?P<scheme>stuns?|turns?):(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>\d{1,5}))?"
    r"(?:\?transport=(?P<transport>udp|tcp))?"
)
URL_FORMS = "stun:HOST[:PORT], turn:HOST[:PORT][?transport=udp|tcp] or turns:HOST[:PORT]"


def check_ice_url(url: str) -> str:
    """Return ``url`` if it is a STUN/TURN URL both aiortc and browsers accept.

    Raises:
        ConfigError: naming the URL and what is wrong with it.
    """
    m = _URL.fullmatch(url)
    if m is None:
        hint = ""
        if "@" in url:
            hint = " (give TURN credentials with --ice-username/--ice-credential, not in the URL)"
        elif url.startswith(("http:", "https:", "udp:", "tcp:")):
            hint = " (ICE servers are stun:, turn: or turns: URLs)"
        raise ConfigError(f"--ice-server {url!r}: expected {URL_FORMS}{hint}")
    if m["port"] is not None and not 1 <= int(m["port"]) <= 65535:
        raise ConfigError(f"--ice-server {url!r}: port {m['port']} is not in 1-65535")
    if m["transport"] and m["scheme"].startswith("stun"):
        raise ConfigError(f"--ice-server {url!r}: a stun: URL takes no ?transport=")
    if m["scheme"] == "turns" and m["transport"] == "udp":
        raise ConfigError(f"--ice-server {url!r}: turns: (TLS) runs over tcp only")
    return url


def is_turn(url: str) -> bool:
    return url.startswith("turn")


@dataclass(frozen=True)
class IceConfig:
    """The ICE servers of every call.

    ``urls`` None keeps aiortc's default (a public Google STUN server for the server side, none
    for the page); an empty list uses no server at all (host candidates only). aiortc uses the
    first STUN and the first TURN URL only; the page uses them all.
    """

    urls: list[str] | None = None
    username: str | None = None
    credential: str | None = None
    relay_only: bool = False

    def __post_init__(self) -> None:
        for url in self.urls or []:
            check_ice_url(url)
        turns = [u for u in self.urls or [] if is_turn(u)]
        if (self.username is None) != (self.credential is None):
            raise ConfigError("--ice-username and --ice-credential go together: give both")
        if turns and self.username is None:
            raise ConfigError(
                f"--ice-server {turns[0]}: a TURN server needs --ice-username and --ice-credential"
            )
        if self.username is not None and not turns:
            raise ConfigError("--ice-username/--ice-credential are for a turn: --ice-server")
        if self.relay_only and not turns:
            raise ConfigError(
                "--ice-relay-only needs a TURN server: give --ice-server turn:HOST[:PORT]"
            )

    def _servers(self) -> list[RTCIceServer] | None:
        if self.urls is None:
            return None
        return [
            RTCIceServer(u, self.username, self.credential) if is_turn(u) else RTCIceServer(u)
            for u in self.urls
        ]

    def rtc_configuration(self) -> RTCConfiguration:
        """aiortc's configuration for the server's peer connection."""
        policy = RTCIceTransportPolicy.RELAY if self.relay_only else RTCIceTransportPolicy.ALL
        return RTCConfiguration(iceServers=self._servers(), iceTransportPolicy=policy)

    def for_page(self) -> dict:
        """What the page passes to ``new RTCPeerConnection(...)``."""
        servers = [
            {
                "urls": s.urls,
                **({"username": s.username, "credential": s.credential} if is_turn(s.urls) else {}),
            }
            for s in self._servers() or []
        ]
        return {"iceServers": servers, "iceTransportPolicy": "relay" if self.relay_only else "all"}
