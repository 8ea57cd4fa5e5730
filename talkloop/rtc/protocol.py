"""The websocket protocol between the page (or any client) and the server: parsing and checks.

Client -> server (JSON text messages):

| type        | fields                                   | effect                                   |
|-------------|------------------------------------------|------------------------------------------|
| `offer`     | `sdp` (str)                              | start the call; answered with `answer`   |
| `candidate` | `candidate` (str or null), `sdpMid`, `sdpMLineIndex` | a trickled ICE candidate     |
| `say`       | `text` (str)                             | speak the text (espeak-ng) and lip-sync  |
| `prompt`    | `text` (str)                             | new style prompt, from the next chunk    |
| `interrupt` | -                                        | drop unplayed speech; back to idle       |
| `bye`       | -                                        | end the call                             |
| `avatar`    | `image` (base64 JPEG/PNG/WebP)           | first message after `/ws?avatar=1`: the  |
|             |                                          | call's avatar photo (``talkloop/rtc/avatar.py``)  |

Server -> client: `session` (the call's hello: token, notice, video, prompt, `ice`: the
``{iceServers, iceTransportPolicy}`` the page builds its RTCPeerConnection with,
``talkloop/rtc/ice.py``), `answer` (sdp), `stats` (once a second), `error` (`code`, `message`),
`speech` (`state`: started / finished / interrupted). The hello keeps its wire name, `session`
(``HELLO``), and the token its name, "session token": see ``HELLO``.

A bad message gets an `error` and the call goes on. Codes: `bad_json` (also JSON nested too
deeply), `bad_message`, `unknown_type`, `too_long`, `bad_sdp`, `bad_candidate` (unparsable, or
without `sdpMid`/`sdpMLineIndex`, or for no media section of the call), `bad_state`, `busy`
(`say` while one line plays and three wait), `internal` (a server bug, that message only).
These end the call: `bad_access` (missing or wrong `?access=` token, close 4401),
`offer_timeout` (no offer within the server's timeout, close 4408), `generation_failed`
(close 1011). Refused before the websocket opens: a foreign `Origin` (HTTP 403), too many
connections from one address (HTTP 429); see ``talkloop/rtc/security.py``.

An agent joins a running call with ``/ws?token=<token>&role=agent`` and speaks the agent
protocol (``talkloop/agent/protocol.py``, ``docs/agents.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from talkloop.agent.protocol import ProtocolError, decode_message, error
from talkloop.agent.text import TextError, check_text
from talkloop.pipeline.core.errors import TalkloopError

__all__ = [
    "CLIENT_TYPES",
    "HELLO",
    "ProtocolError",
    "error",
    "error_code",
    "guarded",
    "parse_message",
]

log = logging.getLogger("talkloop.server")

CLIENT_TYPES = ("offer", "candidate", "say", "prompt", "interrupt", "bye", "avatar")

# The hello of a new call, on the wire. It keeps the protocol's first word for a call, as does
# "session token" for its token and --max-sessions: the page (talkloop/web/app.js switches on
# it), the scripted client (talkloop/rtc/client.py), the cluster front (which learns a call's
# token from it), the agents' examples and docs/agents.md all read it, and so does any page
# left open in a tab across an upgrade; a new name would break each of them for no gain.
HELLO = "session"


def error_code(err: BaseException) -> str:
    """The protocol code of an error that is not a ProtocolError: busy (retry later) or not."""
    return "busy" if getattr(err, "retryable", False) else "bad_request"


async def guarded(action: Awaitable[None], call: str) -> str | None:
    """Run one message's ``action``; every failure becomes the ``error`` reply (None: none),
    so no message, however bad, ends the call or its receive loop.

    Args:
        action: what the message does.
        call: the call's name in log lines (its token's first digits).
    """
    try:
        await action
    except ProtocolError as err:
        return error(err.code, str(err))
    except TalkloopError as err:
        return error(error_code(err), str(err))
    except Exception as err:  # a bug or a library's surprise: this message only
        log.warning("call %s: a message failed: %r", call, err, exc_info=True)
        return error("internal", f"the server could not act on that message ({err!r:.200})")
    return None


def parse_message(raw: str | bytes) -> dict[str, Any]:
    """Decode and check one client message; raises ProtocolError naming what is wrong."""
    if isinstance(raw, bytes):
        raise ProtocolError("bad_message", "binary messages are not accepted here; send JSON text")
    msg = decode_message(raw, CLIENT_TYPES)
    kind = msg["type"]
    if kind == "offer":
        _require_str(msg, "sdp", 200_000)
    elif kind in ("say", "prompt"):
        try:
            check_text(msg.get("text"), f"{kind}: field 'text'", allow_empty=kind == "prompt")
        except TextError as err:
            raise ProtocolError(err.code, str(err)) from None
    elif kind == "candidate":
        cand = msg.get("candidate")
        if cand is not None and not isinstance(cand, str):
            raise ProtocolError("bad_message", "candidate.candidate must be a string or null")
    return msg


def _require_str(msg: dict[str, Any], field: str, limit: int, allow_empty: bool = False) -> None:
    value = msg.get(field)
    if not isinstance(value, str):
        raise ProtocolError("bad_message", f"{msg['type']}: field {field!r} must be a string")
    if not allow_empty and not value.strip():
        raise ProtocolError("bad_message", f"{msg['type']}: field {field!r} is empty")
    if len(value) > limit:
        raise ProtocolError(
            "too_long", f"{msg['type']}: field {field!r} is longer than {limit} characters"
        )
