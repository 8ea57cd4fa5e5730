"""Command-line flags for the KVS mirror, shared by every command that can attach it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.outputs.kvs.sink import KvsSink

__all__ = ["add_kvs_args", "kvs_sink_from_args"]


def add_kvs_args(parser: argparse.ArgumentParser) -> None:
    """Declare ``--kvs-stream``, ``--kvs-region`` and ``--kvs-endpoint``."""
    g = parser.add_argument_group("KVS mirror (a live copy to Amazon Kinesis Video Streams)")
    g.add_argument("--kvs-stream", metavar="NAME", help="mirror to this existing KVS stream")
    g.add_argument("--kvs-region", metavar="REGION", help="AWS region (default: AWS config)")
    g.add_argument(
        "--kvs-endpoint",
        metavar="URL",
        help="kinesisvideo API endpoint, e.g. a local test server (default: AWS)",
    )


def kvs_sink_from_args(args: argparse.Namespace, **options: object) -> KvsSink | None:
    """The KvsSink the flags ask for, or None without ``--kvs-stream``.

    Args:
        args: parsed flags (``add_kvs_args``).
        options: more ``KvsSink`` keyword arguments (e.g. ``drain_timeout_s``).

    Raises:
        ConfigError: an invalid stream name or region, or boto3 is not installed.
    """
    name = getattr(args, "kvs_stream", None)
    if not name:
        return None
    from pipeline.outputs.kvs.sink import KvsSink  # PyAV and boto3 only when mirroring

    return KvsSink(
        name,
        getattr(args, "kvs_region", None),
        endpoint_url=getattr(args, "kvs_endpoint", None),
        **options,  # type: ignore[arg-type]
    )
