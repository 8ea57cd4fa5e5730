"""The KVS mirror: a live copy of the stream to Amazon Kinesis Video Streams (PutMedia).

``KvsSink`` is the Sink (``sink.py``); ``kvs_sink_from_args`` builds one from the flags that
``add_kvs_args`` declares (``args.py``), so ``render`` and ``serve`` attach it the same way
(``serve``: one stream per session, named from a ``{session}`` template). See docs/kvs.md.
"""

from __future__ import annotations

from talkloop.pipeline.outputs.kvs.args import (
    add_kvs_args,
    check_kvs_args,
    kvs_sink_from_args,
    kvs_stream_name,
)
from talkloop.pipeline.outputs.kvs.putmedia import KvsError
from talkloop.pipeline.outputs.kvs.sink import KvsSink, KvsStatus

__all__ = [
    "KvsError",
    "KvsSink",
    "KvsStatus",
    "add_kvs_args",
    "check_kvs_args",
    "kvs_sink_from_args",
    "kvs_stream_name",
]
