"""The OS names of a process's Python threads (``talkloop.pipeline.core.threadnames``)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from talkloop.pipeline.core.threadnames import COMM_BYTES, name_os_threads, os_name

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names threads in /proc"),
]


def _comm(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().rstrip("\n")


def test_every_thread_but_the_main_one_gets_its_python_name_as_the_kernel_keeps_it() -> None:
    main_before = _comm(threading.main_thread().native_id)
    ready, done = threading.Event(), threading.Event()

    def wait() -> None:
        ready.set()
        done.wait(30)

    threads = [
        threading.Thread(target=wait, name="engine-publish_1"),  # 16 bytes: one too many
        threading.Thread(target=wait, name="micro-\u00e9t\u00e9"),  # not ASCII
    ]
    for t in threads:
        ready.clear()
        t.start()
        ready.wait(30)
    try:
        before = [_comm(t.native_id) for t in threads]
        assert name_os_threads() >= len(threads)
        assert [_comm(t.native_id) for t in threads] == ["engine-publish_", "micro-?t?"]
        assert before != ["engine-publish_", "micro-?t?"]  # they were not named so before
        assert _comm(threading.main_thread().native_id) == main_before  # the process's name
    finally:
        done.set()
        for t in threads:
            t.join(30)


def test_os_name_keeps_what_the_kernel_keeps() -> None:
    assert os_name("asyncio_0") == b"asyncio_0"
    assert len(os_name("x" * 40)) == COMM_BYTES
