"""release_free_memory gives freed heap pages back to the system (glibc)."""

from __future__ import annotations

import sys

import pytest

from talkloop.pipeline.bench.worker import rss_mb
from talkloop.pipeline.core.heap import release_free_memory


@pytest.mark.unit
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_pages_in_the_middle_of_the_heap_go_back() -> None:
    blocks = [bytearray(4000) for _ in range(40_000)]  # ~160 MB of malloc'd (not mmap'd) blocks
    survivors = blocks[::200]  # a few stay: the heap cannot simply shrink from its top
    del blocks
    before = rss_mb()
    assert release_free_memory() is True
    after = rss_mb()
    assert before - after > 100, (before, after)
    assert len(survivors) == 200
