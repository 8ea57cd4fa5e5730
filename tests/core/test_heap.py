"""release_free_memory gives freed heap pages back to the system (glibc)."""

from __future__ import annotations

import subprocess
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


@pytest.mark.unit
def test_a_frozen_process_collects_only_what_it_made_since() -> None:
    # In a child: the objects a server loaded are many; after freeze_loaded a full pass walks
    # none of them, and garbage made afterwards (a cycle, as a call leaves behind) still goes.
    script = """
import gc, weakref
from talkloop.pipeline.core.heap import freeze_loaded
kept = [[i] for i in range(100_000)]  # lists: tracked by the collector
freeze_loaded()
assert gc.get_freeze_count() >= 100_000, gc.get_freeze_count()
assert len(gc.get_objects()) < 1_000, len(gc.get_objects())
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None
print("ok", len(kept))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0 and out.stdout.split() == ["ok", "100000"], out.stderr
