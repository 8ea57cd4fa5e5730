"""The network flags of `talkloop serve`: TLS, access token, origins, per-address cap, offer timeout,
ICE servers.

``add_serving_args`` declares them; ``serving_from_args`` checks them (one ConfigError line per
problem, before anything is loaded) and returns what the server needs.
"""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from talkloop.pipeline.core.errors import ConfigError
from talkloop.rtc.ice import URL_FORMS, IceConfig
from talkloop.rtc.security import (
    DEFAULT_MAX_CONNECTIONS_PER_IP,
    OFFER_TIMEOUT_S,
    AccessPolicy,
    check_exposure,
    check_token,
    is_loopback,
)
from talkloop.rtc.tls import default_folder, fingerprint, self_signed, server_context

WILDCARDS = ("", "0.0.0.0", "::")


def add_serving_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving to other machines (README: Serving to other machines)")
    g.add_argument("--tls-cert", metavar="FILE", help="PEM certificate (chain): serve https/wss")
    g.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    g.add_argument(
        "--tls-self-signed",
        nargs="?",
        const="",
        default=None,
        metavar="NAMES",
        help="make (or reuse) a self-signed certificate for these comma-separated host names and "
        "IPs, plus localhost and --host; browsers warn once",
    )
    g.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where --tls-self-signed keeps its certificate (default ~/.config/talkloop/tls)",
    )
    g.add_argument(
        "--access-token",
        metavar="TOKEN",
        help="every websocket (page or agent) must carry it as ?access=TOKEN (16+ characters)",
    )
    g.add_argument(
        "--access-token-file", metavar="FILE", help="read --access-token from a file (first line)"
    )
    g.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="URL",
        help="also accept pages from this origin (scheme://host[:port]); repeatable. The "
        "server's own origin is always accepted",
    )
    g.add_argument(
        "--max-connections-per-ip",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS_PER_IP,
        metavar="N",
        help=f"open websockets per client address (default {DEFAULT_MAX_CONNECTIONS_PER_IP})",
    )
    g.add_argument(
        "--offer-timeout-s",
        type=float,
        default=OFFER_TIMEOUT_S,
        metavar="S",
        help="close a session whose page sends no call offer this long while no agent is "
        f"connected (default {OFFER_TIMEOUT_S:g})",
    )
    g.add_argument(
        "--ice-server",
        action="append",
        default=None,
        metavar="URL",
        help=f"STUN/TURN server of every call, for this server and the page: {URL_FORMS}; "
        "repeatable; 'none' for no server at all. Default: aiortc's public STUN server",
    )
    g.add_argument("--ice-username", metavar="USER", help="user name of the turn: --ice-server")
    g.add_argument("--ice-credential", metavar="PASS", help="password of the turn: --ice-server")
    g.add_argument(
        "--ice-credential-file",
        metavar="FILE",
        help="read --ice-credential from a file (first line), out of the process list",
    )
    g.add_argument(
        "--ice-relay-only",
        action="store_true",
        help="calls go through the TURN server only (iceTransportPolicy relay, both sides)",
    )
    g.add_argument(
        "--insecure",
        action="store_true",
        help="serve a non-loopback --host without access token and/or TLS (trusted networks)",
    )


@dataclass
class Serving:
    """What the server needs from the flags, and lines to print at start."""

    access: AccessPolicy
    ssl_context: ssl.SSLContext | None
    offer_timeout_s: float
    ice: IceConfig = field(default_factory=IceConfig)
    notes: list[str] = field(default_factory=list)


def serving_from_args(args: argparse.Namespace) -> Serving:
    """Check the network flags and build the server's access policy and TLS context.

    Raises:
        ConfigError: a bad or contradictory flag, or an exposed --host without token and TLS.
    """
    token = args.access_token
    if args.access_token_file:
        if token:
            raise ConfigError("give --access-token or --access-token-file, not both")
        try:
            lines = Path(args.access_token_file).read_text().splitlines()
        except OSError as err:
            raise ConfigError(
                f"--access-token-file: cannot read {args.access_token_file}: {err.strerror or err}"
            ) from None
        token = lines[0] if lines else ""
        token = check_token(token, "--access-token-file's token")
    elif token is not None:
        token = check_token(token)
    if not 0 < args.offer_timeout_s <= 3600:
        raise ConfigError(f"--offer-timeout-s must be in (0, 3600], got {args.offer_timeout_s:g}")
    access = AccessPolicy(token, args.allow_origin, args.max_connections_per_ip)
    notes: list[str] = []
    context = None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together: give both")
    if args.tls_cert and args.tls_self_signed is not None:
        raise ConfigError("give --tls-cert/--tls-key or --tls-self-signed, not both")
    tls = args.tls_cert is not None or args.tls_self_signed is not None
    check_exposure(args.host, token, tls, args.insecure)
    if args.tls_cert:
        context = server_context(args.tls_cert, args.tls_key)
    elif args.tls_self_signed is not None:
        names = [n for n in args.tls_self_signed.split(",") if n.strip()]
        names += ["localhost", "127.0.0.1"]
        if args.host not in WILDCARDS and not is_loopback(args.host):
            names.append(args.host)
        cert, key = self_signed(names, args.tls_dir or default_folder())
        context = server_context(cert, key)
        notes.append(
            f"self-signed certificate {cert} (SHA-256 {fingerprint(cert)}); browsers warn "
            "once, agents trust it with that file as their CA"
        )
    if token is None and not is_loopback(args.host):
        notes.append("warning: no access token: anyone who reaches this port can open calls")
    return Serving(access, context, args.offer_timeout_s, ice_from_args(args), notes)


def ice_from_args(args: argparse.Namespace) -> IceConfig:
    """``--ice-server`` (``none``: no server), credentials and ``--ice-relay-only``.

    Raises:
        ConfigError: a bad URL, credentials without a TURN server or the other way round.
    """
    urls = args.ice_server
    credential = args.ice_credential
    if args.ice_credential_file:
        if credential is not None:
            raise ConfigError("give --ice-credential or --ice-credential-file, not both")
        try:
            lines = Path(args.ice_credential_file).read_text().splitlines()
        except OSError as err:
            raise ConfigError(
                f"--ice-credential-file: cannot read {args.ice_credential_file}: "
                f"{err.strerror or err}"
            ) from None
        credential = lines[0].strip() if lines else ""
        if not credential:
            raise ConfigError(f"--ice-credential-file {args.ice_credential_file} is empty")
    if urls is not None and "none" in urls:
        if len(urls) > 1:
            raise ConfigError("--ice-server none means no ICE server: give it alone")
        urls = []
    return IceConfig(urls, args.ice_username, credential, args.ice_relay_only)
