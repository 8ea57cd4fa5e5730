"""Give the C heap's free pages back to the system after a call or a render ends.

glibc's allocator keeps what a finished call freed (its frames, encoder buffers, per-thread
arenas) for reuse and shows it as resident; over a server's first dozens of calls that looks like
growth although nothing is held. ``malloc_trim`` returns the free pages. Elsewhere (musl, macOS)
this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
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
