"""Per-session state: the rolling memory (docs/architecture.md).

Between chunks a session keeps exactly these items and nothing else:

- the reference as encoded (``ref_latent``), its conditioning with the prompt's expression
  (``ref_latent_hr``, ``ref_latent_lr``) and the text embedding;
- the motion context of the newest N chunk: its last ``ctx_len`` latents and their audio
  features (the last of them is also the near anchor of the next I chunk);
- the streaming audio normalisation statistics and the streaming decoder's bounded cache;
- the driving audio not yet published (``AudioBuffer``), trimmed as frames are published.

The far anchor and the rest of a new N chunk never outlive the step that made them: the I chunk
runs right after its N chunk and both are published together, so no generated latent waits
between steps. Audio features, noise, activations, intermediate latents and RGB frames live only
in a chunk's working fields and are released when the chunk is published.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch

# The fields of SessionState that stages may read and write (the rest is pipeline bookkeeping).
SESSION_FIELDS = frozenset(
    {
        "ref_latent",
        "ref_latent_hr",
        "ref_latent_lr",
        "text_embedding",
        "context_latents",
        "context_audio",
        "audio_norm",
        "decoder_cache",
    }
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


@dataclass
class SessionState:
    """Everything a session keeps between chunks. See the module docstring."""

    ref_latent: torch.Tensor | None = None  # (1, C, h, w) as encoded, kept for prompt changes
    ref_latent_hr: torch.Tensor | None = None  # (1, C, h, w) with the prompt's expression
    ref_latent_lr: torch.Tensor | None = None  # (1, C, h/2, w/2)
    text_embedding: torch.Tensor | None = None  # (1, D_text)
    context_latents: torch.Tensor | None = None  # (ctx, C, h/2, w/2) tail of the newest N chunk
    context_audio: torch.Tensor | None = None  # (ctx, D_audio) their audio features
    audio_norm: torch.Tensor | None = None  # (2, n_mels) running mean / variance
    decoder_cache: torch.Tensor | None = None  # bounded: the decoder's last few latent frames
    audio: AudioBuffer = field(default_factory=AudioBuffer)
    prompt: str = ""
    next_n: int = 0  # index of the next N chunk to generate
    frames_published: int = 0

    def memory_report(self) -> dict[str, tuple[tuple[int, ...], str, int]]:
        """Shape, dtype and bytes of every array the state holds (for tests and the bench)."""
        report: dict[str, tuple[tuple[int, ...], str, int]] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                report[f.name] = (
                    tuple(value.shape),
                    str(value.dtype),
                    value.numel() * value.element_size(),
                )
            elif isinstance(value, AudioBuffer):
                report[f.name] = ((value.samples.shape[0],), str(value.samples.dtype), value.nbytes)
        return report

    def nbytes(self) -> int:
        return sum(entry[2] for entry in self.memory_report().values())
