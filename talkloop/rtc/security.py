"""Who may open a websocket to `talkloop serve`: access token, Origin allow-list, per-address cap.

- **Access token** (``--access-token``): every ``/ws`` connection, page or agent, carries it as
  the query parameter ``access=<token>`` (browsers cannot set headers on a websocket). It is
  compared in constant time. A connection without it, or with a wrong one, gets one ``error
  {code: "bad_access"}`` and is closed (code 4401), so the page can ask the user again.
- **Origin**: a browser names the page that opens a websocket in the ``Origin`` header. Allowed:
  the server's own origin (``scheme://`` + the ``Host`` header the browser sent, i.e. the address
  the page was loaded from) and each ``--allow-origin``. Any other Origin (``null`` included) is
  refused with HTTP 403 before the upgrade: a page on another site cannot drive the avatar.
  Clients that send no Origin (agents, scripts) are not browsers and are not refused for it.
- **Per-address cap** (``--max-connections-per-ip``): open websockets per client IP address; one
  more is refused with HTTP 429.

Binding to an address other machines can reach needs a token and TLS, unless ``--insecure``
(``check_exposure``).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from talkloop.pipeline.core.errors import ConfigError

DEFAULT_MAX_CONNECTIONS_PER_IP = 4
OFFER_TIMEOUT_S = 20.0  # a session whose page sends no offer this long (and has no agent) ends


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, default ports dropped, as browsers send it.

    Raises:
        ConfigError: not an http(s) origin (a path, query or user part is not an origin either).
    """
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--allow-origin must look like https://host[:port], got {origin!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ConfigError(
            f"--allow-origin must be an origin (scheme://host[:port], no path), got {origin!r}"
        )
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"--allow-origin has a bad port: {origin!r}") from None
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default else "")


def is_loopback(host: str) -> bool:
    """True for addresses only this machine reaches (127.0.0.0/8, ::1, ``localhost``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other machines may resolve to us; "" and 0.0.0.0 too


def check_exposure(host: str, token: str | None, tls: bool, insecure: bool) -> None:
    """Refuse to serve other machines without an access token and TLS, unless ``insecure``.

    Raises:
        ConfigError: one line that names what is missing and how to add it.
    """
    if is_loopback(host) or insecure:
        return
    missing = [
        what
        for what, present in (
            ("an access token (--access-token TOKEN or --access-token-file FILE)", token),
            ("TLS (--tls-cert FILE --tls-key FILE, or --tls-self-signed)", tls),
        )
        if not present
    ]
    if missing:
        raise ConfigError(
            f"--host {host or '0.0.0.0'} lets other machines connect, so it needs "
            f"{' and '.join(missing)}; or pass --insecure to serve them without"
        )


def check_token(token: str, what: str = "--access-token") -> str:
    """The token, stripped; ConfigError when it is too short to resist guessing."""
    token = token.strip()
    if len(token) < 16:
        raise ConfigError(
            f"{what} must be at least 16 characters (got {len(token)}); "
            'e.g. python -c "import secrets; print(secrets.token_hex(16))"'
        )
    if any(c.isspace() for c in token):
        raise ConfigError(f"{what} must not contain spaces")
    return token


@dataclass
class AccessPolicy:
    """The access rules of one server.

    Args:
        token: the access token every websocket must carry (``?access=``), or None for none.
        allowed_origins: origins allowed besides the server's own (normalised on construction).
        max_connections_per_ip: open websockets per client address at most.
    """

    token: str | None = None
    allowed_origins: Iterable[str] = ()
    max_connections_per_ip: int = DEFAULT_MAX_CONNECTIONS_PER_IP
    _open: Counter = field(default_factory=Counter, init=False, repr=False)

    def __post_init__(self) -> None:
        self.allowed_origins = frozenset(normalize_origin(o) for o in self.allowed_origins)
        if self.max_connections_per_ip < 1:
            raise ConfigError(
                f"--max-connections-per-ip must be at least 1, got {self.max_connections_per_ip}"
            )

    def token_ok(self, given: str | None) -> bool:
        """True when no token is required or ``given`` is it (constant-time comparison)."""
        if self.token is None:
            return True
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def origin_ok(self, origin: str | None, host: str | None, scheme: str) -> bool:
        """True when a websocket with this ``Origin`` header may open (None: not a browser)."""
        if origin is None:
            return True
        try:
            origin = normalize_origin(origin)
        except ConfigError:  # "null" (a file:// or sandboxed page) and anything malformed
            return False
        if origin in self.allowed_origins:
            return True
        if not host:
            return False
        try:
            return origin == normalize_origin(f"{scheme}://{host}")
        except ConfigError:
            return False

    def connections(self, address: str) -> int:
        return self._open[address]

    def may_connect(self, address: str) -> bool:
        return self._open[address] < self.max_connections_per_ip

    def opened(self, address: str) -> bool:
        """Count a new connection from ``address``; False (and not counted) over the cap."""
        if not self.may_connect(address):
            return False
        self._open[address] += 1
        return True

    def closed(self, address: str) -> None:
        self._open[address] -= 1
        if self._open[address] <= 0:
            del self._open[address]
