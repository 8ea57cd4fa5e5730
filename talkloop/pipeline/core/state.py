"""Per-session state: the rolling memory (docs/architecture.md).

Between chunks a session keeps exactly these items and nothing else:

- the fields every family's chunk stages share (:data:`SHARED_FIELDS`): the prompt's text
  embedding, the reference the A2V DiT conditions on, the motion context of the newest N chunk
  (its last ``ctx_len`` latents and their audio features, the last of them also the near anchor
  of the next I chunk) and the streaming audio normalisation statistics;
- the fields the family's spec declares (``FamilySpec.state_fields``: for example an encoded
  reference and a streaming decoder's cache, or a renderer built from the photo);
- the driving audio not yet published (``AudioBuffer``), trimmed as frames are published.

Anything else a chunk makes (audio features, noise, activations, intermediate latents, RGB
frames) lives only in the chunk's working fields and is released when the chunk is published.
:meth:`SessionState.memory_report` counts everything the state holds, objects included, so a
field that grows with the session's length shows up in the rolling-memory tests and the bench.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from talkloop.pipeline.models.spec import StateField

SHARED_FIELDS = (
    StateField("text_embedding", "(1, D_text) the prompt's embedding; None: no prompt"),
    StateField("a2v_reference", "the reference frame the A2V DiT conditions on"),
    StateField(
        "context_latents", "(ctx, ...) the tail of the newest N chunk's latents", starts_empty=True
    ),
    StateField("context_audio", "(ctx, D_audio) their audio features", starts_empty=True),
    StateField("audio_norm", "(2, n_mels) running mean and variance", starts_empty=True),
)


class AudioBuffer:
    """Driving audio from sample ``offset`` on: appended at the end, trimmed at the front."""

    def __init__(self) -> None:
        self.samples = np.zeros(0, dtype=np.float32)
        self.offset = 0  # absolute index of samples[0]
        self.received = 0  # absolute index one past the last sample received
        self.ended = False

    def append(self, samples: np.ndarray) -> None:
        self.samples = np.concatenate([self.samples, samples.astype(np.float32, copy=False)])
        self.received += samples.shape[0]

    def trim_before(self, sample: int) -> None:
        """Forget samples before absolute index ``sample``."""
        drop = min(max(0, sample - self.offset), self.samples.shape[0])
        if drop:
            self.samples = self.samples[drop:].copy()  # copy: let the old array go
            self.offset += drop

    def replace_from(self, start: int, samples: np.ndarray) -> None:
        """``samples`` in place of everything from absolute index ``start`` on (held or not yet
        received): ``received`` becomes ``start + len(samples)``."""
        if start < self.offset or start > self.received:
            raise ValueError(
                f"cannot replace audio from sample {start}: {self.offset}..{self.received} held"
            )
        head = self.samples[: start - self.offset]
        self.samples = np.concatenate([head, samples.astype(np.float32, copy=False)])
        self.received = start + samples.shape[0]

    def window(self, start: int, stop: int) -> np.ndarray:
        """Samples ``[start, stop)``, zeros where outside the audio received so far."""
        out = np.zeros(stop - start, dtype=np.float32)
        lo, hi = max(start, self.offset), min(stop, self.received)
        if min(stop, self.offset) > max(start, 0):
            # A bug, not bad input: the pipeline trims only audio that no future window needs.
            raise RuntimeError(f"audio before sample {self.offset} was already released")
        if hi > lo:
            out[lo - start : hi - start] = self.samples[lo - self.offset : hi - self.offset]
        return out

    @property
    def nbytes(self) -> int:
        return int(self.samples.nbytes)


def held_bytes(value: Any, seen: set[int] | None = None) -> int:
    """Bytes of the arrays ``value`` holds: a tensor or array itself, the items of a container,
    the attributes of an object (each array counted once however often it is reached)."""
    seen = set() if seen is None else seen
    if value is None or id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(held_bytes(v, seen) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(held_bytes(v, seen) for v in value)
    if isinstance(value, (str, bytes, int, float, bool, torch.nn.Module)):
        return 0  # scalars; modules are the pipeline's, shared by every session
    attributes = getattr(value, "__dict__", None)
    return held_bytes(attributes, seen) if attributes is not None else 0


class SessionState:
    """Everything a session keeps between chunks. See the module docstring.

    Args:
        fields: the session fields of the pipeline's stages (:data:`SHARED_FIELDS` and the
            family's own), each None until a stage writes it.
        prompt: the prompt the session starts with.
    """

    def __init__(self, fields: Sequence[StateField], prompt: str = "") -> None:
        self.fields: dict[str, Any] = {f.name: None for f in fields}
        self.audio = AudioBuffer()
        self.prompt = prompt
        self.next_n = 0  # index of the next N chunk to generate
        self.frames_published = 0

    def clear(self) -> None:
        """Let go of every field and all buffered audio (a session that ended)."""
        self.fields = dict.fromkeys(self.fields)
        self.audio = AudioBuffer()

    def memory_report(self) -> dict[str, tuple[tuple[int, ...], str, int]]:
        """Shape, type and bytes of every field that holds memory (for tests and the bench):
        a tensor's or array's shape and dtype, an object's class and all that it holds."""
        report: dict[str, tuple[tuple[int, ...], str, int]] = {}
        for name, value in [*self.fields.items(), ("audio", self.audio)]:
            if isinstance(value, (torch.Tensor, np.ndarray)):
                report[name] = (tuple(value.shape), str(value.dtype), held_bytes(value))
            elif isinstance(value, AudioBuffer):
                report[name] = ((value.samples.shape[0],), str(value.samples.dtype), value.nbytes)
            elif value is not None and (nbytes := held_bytes(value)):
                report[name] = ((), type(value).__name__, nbytes)
        return report

    def nbytes(self) -> int:
        return sum(entry[2] for entry in self.memory_report().values())
