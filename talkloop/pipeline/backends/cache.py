"""The on-disk cache of exported graphs and of ``auto``'s choice: keys, paths, atomic writes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch


def cache_dir() -> Path:
    """``$TALKLOOP_CACHE`` or ``~/.cache/talkloop``, with ``backends/`` below it (created)."""
    root = Path(os.environ.get("TALKLOOP_CACHE") or Path.home() / ".cache" / "talkloop")
    path = root / "backends"
    path.mkdir(parents=True, exist_ok=True)
    return path


def weights_hash(net: torch.nn.Module) -> str:
    """sha256 over the network's class, tensor names, shapes, dtypes and bytes (16 hex digits)."""
    h = hashlib.sha256(type(net).__qualname__.encode())
    for name, v in sorted(net.state_dict().items()):
        if not isinstance(v, torch.Tensor):
            continue
        h.update(f"{name}{tuple(v.shape)}{v.dtype}".encode())
        t = v.detach().cpu().reshape(-1).contiguous()  # channels-last 1x1 weights: flat first
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def key(*parts: object) -> str:
    """A short stable file-name key for ``parts`` (versions, shapes, hashes)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:20]


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """A temporary path next to ``final``, renamed onto it when the block succeeds.

    Readers never see a half-written file: two processes exporting the same graph each write
    their own temporary file, and the rename (atomic on one filesystem) lets the last one win.
    """
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=final.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def cached_file(final: Path, make: Callable[[Path], None]) -> Path:
    """``final`` if it exists, else ``make(tmp)`` then the atomic rename."""
    if not final.is_file():
        with atomic_path(final) as tmp:
            make(tmp)
    return final
