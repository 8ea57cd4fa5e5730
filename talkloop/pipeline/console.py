"""What the command line shows: progress bars only on a terminal, no library noise unless asked.

``talkloop render`` and ``talkloop serve`` print their own lines and nothing else: the libraries
under them (torch's C++ warnings, transformers' "Loading weights" bar, Python warnings, third-party
loggers, LiteRT's "Created TensorFlow Lite XNNPACK delegate" line) stay quiet unless ``-v`` asks
for them (:func:`quiet`). Progress bars come from :func:`progress_bar`, which draws only when
stderr is a terminal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from tqdm import tqdm

LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"

# Read by the libraries when they are imported, so set before the first import of torch,
# huggingface_hub or transformers (the user's own values win).
QUIET_ENV = {
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10 warnings, e.g. the ONNX exporter's shape inference notes
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" bar
    "TRANSFORMERS_VERBOSITY": "error",
}

# Native log lines dropped from what a native call writes to fd 2 (TFLite's and XNNPACK's format
# is "SEVERITY: message"); WARNING and ERROR lines, and anything else, are passed on.
NATIVE_NOISE = re.compile(r"^(INFO|VERBOSE): ")

_verbose = False
_fd_lock = threading.RLock()  # nested use restores fd 2 like a stack


def progress_bar(iterable: Iterable | None = None, enabled: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar drawn only when ``enabled`` and stderr is a terminal (tqdm's ``disable=None``):
    a log file or a pipe gets no bar. Every progress bar of the package comes from here."""
    return tqdm(iterable, disable=None if enabled else True, **kwargs)


def verbose() -> bool:
    """Whether the command runs with ``-v``: library logs and warnings shown."""
    return _verbose


@contextlib.contextmanager
def quiet(verbose: bool = False) -> Iterator[None]:
    """Run a command with library noise off (``verbose`` False) or with INFO logs on (True).

    Quiet: the :data:`QUIET_ENV` variables are set (call this before torch is imported), Python
    warnings are ignored (unless ``-W``/``PYTHONWARNINGS`` say otherwise), third-party loggers
    show errors only while talkloop's own show warnings, and :func:`native_stderr_muted` drops
    native INFO lines. Verbose: INFO logs of every logger, with time and name, and nothing muted.
    Everything is restored on exit.
    """
    global _verbose
    root, own = logging.getLogger(), logging.getLogger("talkloop")
    levels = root.level, own.level
    env = {k: os.environ.get(k) for k in QUIET_ENV}
    before = _verbose
    _verbose = verbose
    with warnings.catch_warnings():
        try:
            if verbose:
                logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
                root.setLevel(logging.INFO)
                own.setLevel(logging.INFO)
            else:
                for key, value in QUIET_ENV.items():
                    os.environ.setdefault(key, value)
                if not sys.warnoptions:
                    warnings.simplefilter("ignore")
                root.setLevel(logging.ERROR)
                own.setLevel(logging.WARNING)
            yield
        finally:
            _verbose = before
            root.setLevel(levels[0])
            own.setLevel(levels[1])
            for key, value in env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


QUIET_COMMANDS = ("render", "serve")  # library noise off unless -v


def quiet_for(words: list[str]) -> contextlib.AbstractContextManager:
    """:func:`quiet` for a command line (its words after ``talkloop``) whose command prints only
    its own lines (:data:`QUIET_COMMANDS`), verbose with ``-v``; otherwise nothing changes."""
    command = next((w for w in words if not w.startswith("-")), None)
    if command not in QUIET_COMMANDS:
        return contextlib.nullcontext()
    return quiet(verbose="-v" in words or "--verbose" in words)


@contextlib.contextmanager
def native_stderr_muted(noise: re.Pattern[str] = NATIVE_NOISE) -> Iterator[None]:
    """Run native code with file descriptor 2 captured: lines matching ``noise`` are dropped,
    everything else is written to stderr when the block ends, so no error a library reports is
    lost (it is only delayed until the block ends, whichever thread wrote it).

    For libraries that log from C++ straight to fd 2 with no switch to turn it off (LiteRT's
    interpreter). Nothing is captured under ``-v``, or where fd 2 is closed.
    """
    if _verbose:
        yield
        return
    with _fd_lock:
        try:
            if sys.stderr is not None:
                sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no fd 2 (a daemon), or a closed sys.stderr
            saved = None
        if saved is None:
            yield
            return
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                captured.seek(0)
                text = captured.read().decode(errors="replace")
                kept = "".join(
                    line for line in text.splitlines(keepends=True) if not noise.match(line)
                )
                if kept:
                    os.write(2, kept.encode())
