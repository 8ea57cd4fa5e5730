"""OS names for a process's Python threads, so that ``top -H``, ``ps -L``, ``py-spy`` and
``talkloop bench --calls`` can tell a server's threads apart.

Python names its threads (``threading.Thread.name``: ``engine-0``, ``asyncio_1``,
``audio-decoder``) but before 3.14 does not hand the name to the operating system, so every
thread of a server shows as the program's name and its CPU cannot be told apart from outside.
:func:`name_os_threads` writes each live thread's name, its first ``COMM_BYTES`` bytes (the
kernel's limit), to ``/proc/self/task/<tid>/comm``; threads that libraries start (aiortc's
decoders, asyncio's executor) are named as well, whenever it runs. ``talkloop serve`` runs it every
``NAME_EVERY_S`` seconds. The main thread keeps its name: on Linux it is the process's own name,
the one ``ps`` and ``pkill`` match.

Elsewhere than Linux it names nothing.
"""

from __future__ import annotations

import threading
from pathlib import Path

COMM_BYTES = 15  # the kernel keeps 16 bytes of a task's name, the last one a NUL
NAME_EVERY_S = 2.0  # how often a server names its threads (each call starts a few)
TASKS = Path("/proc/self/task")


def os_name(name: str) -> bytes:
    """The name as the kernel would keep it: ASCII (others as ``?``), at most ``COMM_BYTES``."""
    return name.encode("ascii", "replace")[:COMM_BYTES]


def name_os_threads() -> int:
    """Give every live Python thread but the main one its name in the OS. Returns how many
    threads carry their name now (0 where ``/proc`` is missing)."""
    named = 0
    main = threading.main_thread()
    for thread in threading.enumerate():
        tid = thread.native_id
        if thread is main or tid is None:
            continue
        comm = TASKS / str(tid) / "comm"
        want = os_name(thread.name)
        try:
            if comm.read_bytes().rstrip(b"\n") != want:
                comm.write_bytes(want)
        except OSError:  # the thread ended meanwhile, or no /proc
            continue
        named += 1
    return named
