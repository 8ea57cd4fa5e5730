"""Command-line flags for the KVS mirror, shared by every command that can attach it.

``talkloop serve`` mirrors each live session on its own: with ``--max-sessions`` above 1 the
stream name is a template whose ``{session}`` placeholder becomes the session's slot, 1 to
``--max-sessions`` (a slot is reused once its session has ended and its mirror has drained), so
``--kvs-stream 'avatar-{session}' --max-sessions 3`` writes to the streams avatar-1, avatar-2 and
avatar-3, which must exist. One stream shared by concurrent sessions would interleave their
fragments, so that combination is refused at start.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.outputs.kvs.sink import KvsSink

if TYPE_CHECKING:
    from talkloop.pipeline.outputs.kvs.sink import KvsSink

__all__ = [
    "SESSION_PLACEHOLDER",
    "add_kvs_args",
    "check_kvs_args",
    "kvs_sink_from_args",
    "kvs_stream_name",
]

SESSION_PLACEHOLDER = "{session}"


def add_kvs_args(parser: argparse.ArgumentParser) -> None:
    """Declare ``--kvs-stream``, ``--kvs-region`` and ``--kvs-endpoint``."""
    g = parser.add_argument_group("KVS mirror (a live copy to Amazon Kinesis Video Streams)")
    g.add_argument(
        "--kvs-stream",
        metavar="NAME",
        help="mirror to this existing KVS stream; for serve with --max-sessions > 1, a name with "
        "{session} (the session's slot, 1..max-sessions), e.g. 'avatar-{session}'",
    )
    g.add_argument("--kvs-region", metavar="REGION", help="AWS region (default: AWS config)")
    g.add_argument(
        "--kvs-endpoint",
        metavar="URL",
        help="kinesisvideo API endpoint, e.g. a local test server (default: AWS)",
    )


def kvs_stream_name(template: str, session: int | None = None) -> str:
    """The stream name of one session: ``template`` with ``{session}`` replaced by ``session``.

    Args:
        template: the ``--kvs-stream`` value.
        session: the live session's slot (1..max_sessions); None for a single stream (render).

    Raises:
        ConfigError: a ``{session}`` placeholder where there is no session.
    """
    if SESSION_PLACEHOLDER not in template:
        return template
    if session is None:
        raise ConfigError(
            f"--kvs-stream {template!r}: {SESSION_PLACEHOLDER} names one stream per live session "
            f"(talkloop serve); this command writes one stream: give its name"
        )
    return template.replace(SESSION_PLACEHOLDER, str(session))


def check_kvs_args(args: argparse.Namespace, max_sessions: int) -> None:
    """Refuse, before a server starts, ``--kvs-*`` flags that would fail or mix sessions.

    Args:
        args: parsed flags (``add_kvs_args``).
        max_sessions: concurrent live sessions at most.

    Raises:
        ConfigError: one stream for several concurrent sessions, or a name, region or setting
            that ``KvsSink`` refuses (checked for the first and the last slot's name).
    """
    template = getattr(args, "kvs_stream", None)
    if not template:
        return
    if max_sessions > 1 and SESSION_PLACEHOLDER not in template:
        example = f"{template}-{SESSION_PLACEHOLDER}"
        raise ConfigError(
            f"--kvs-stream {template!r} with --max-sessions {max_sessions} would mirror every "
            f"session into one stream, their fragments interleaved: name a stream per session, "
            f"e.g. --kvs-stream '{example}' (streams {kvs_stream_name(example, 1)} to "
            f"{kvs_stream_name(example, max_sessions)}, created beforehand), or use "
            f"--max-sessions 1"
        )
    for session in sorted({1, max_sessions}):
        kvs_sink_from_args(args, session)


def kvs_sink_from_args(
    args: argparse.Namespace, session: int | None = None, **options: object
) -> KvsSink | None:
    """The KvsSink the flags ask for, or None without ``--kvs-stream``.

    Args:
        args: parsed flags (``add_kvs_args``).
        session: the live session's slot, for a ``{session}`` template (None: one stream).
        options: more ``KvsSink`` keyword arguments (e.g. ``drain_timeout_s``).

    Raises:
        ConfigError: an invalid stream name or region, a ``{session}`` placeholder without a
            session, or boto3 is not installed.
    """
    template = getattr(args, "kvs_stream", None)
    if not template:
        return None
    name = kvs_stream_name(template, session)

    return KvsSink(
        name,
        getattr(args, "kvs_region", None),
        endpoint_url=getattr(args, "kvs_endpoint", None),
        **options,  # type: ignore[arg-type]
    )
