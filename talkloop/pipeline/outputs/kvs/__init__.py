"""The KVS mirror: a live copy of the stream to Amazon Kinesis Video Streams (PutMedia).

``KvsSink`` is the Sink (``sink.py``); ``kvs_sink_from_args`` builds one from the flags that
``add_kvs_args`` declares (``args.py``), so ``render`` and ``serve`` attach it the same way
(``serve``: one stream per session, named from a ``{session}`` template). See docs/kvs.md.
"""

from __future__ import annotations

from typing import Any

from talkloop.pipeline.outputs.kvs.args import (
    add_kvs_args,
    check_kvs_args,
    kvs_sink_from_args,
    kvs_stream_name,
)

__all__ = [
    "KvsError",
    "KvsSink",
    "KvsStatus",
    "add_kvs_args",
    "check_kvs_args",
    "kvs_sink_from_args",
    "kvs_stream_name",
]


def __getattr__(name: str) -> Any:
    # Lazy: the command line imports this package to declare its flags, and should not pay
    # for PyAV and the encoder code unless a mirror is asked for.
    if name in ("KvsSink", "KvsStatus"):
        from talkloop.pipeline.outputs.kvs import sink

        return getattr(sink, name)
    if name == "KvsError":
        from talkloop.pipeline.outputs.kvs.putmedia import KvsError

        return KvsError
    raise AttributeError(name)
