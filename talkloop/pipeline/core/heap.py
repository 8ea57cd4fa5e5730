"""The heap of a long-lived process: free pages given back, the collector's passes kept short.

glibc's allocator keeps what a finished call freed (its frames, encoder buffers, per-thread
arenas) for reuse and shows it as resident; over a server's first dozens of calls that looks like
growth although nothing is held. ``malloc_trim`` returns the free pages
(:func:`release_free_memory`; elsewhere, musl or macOS, it does nothing).

Python's cyclic collector walks every tracked object on a full (generation 2) pass, with the GIL
held. A server that has loaded its networks, aiortc and numpy holds some 200,000 such objects: a
full pass took 85-90 ms right after the imports and 250 ms in a server that had run three calls
(2-core AMD EPYC Zen 4, docs/benchmarks.md), and such a pass can come mid-call: every call of the
process stalls that long at once. Nearly all of those objects live as long as the process.
:func:`freeze_loaded` moves them out of the collector's sight once loading is done, so later
passes walk only what was made since. Frozen objects are still freed by reference counting; only
a cycle among them would never be collected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import sys


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the heap's free pages to the system; True if the allocator could (glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def freeze_loaded() -> None:
    """Collect what loading left behind, then freeze every object alive now (``gc.freeze``).
    Call it once a long-lived process has loaded what it keeps, before it serves."""
    gc.collect()
    gc.freeze()
