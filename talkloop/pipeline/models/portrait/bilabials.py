"""Where the bilabials (p, b, m) of a clip are: from phone times next to the audio, or its text.

For ``NAME.wav`` (any audio suffix) this looks, in order, for:

- ``NAME.lab``: phone times, one ``start end phone`` per line in seconds (whitespace-separated:
  Audacity's label export and the tests' voices, ``tests/data/voices/``). Exact when the
  synthesiser wrote them.
- ``NAME.txt``: the transcript. espeak-ng says it with phoneme events (``audio/espeak.py``), and a
  dynamic time warp of the two recordings' cepstra maps espeak's phoneme times onto the clip.
  Approximate: it finds the bilabials' syllables, not their exact closure (the figure the
  evaluation reports keeps a frame of slack on either side).

With neither, a clip has no bilabial figures (``source`` None).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from talkloop.pipeline.audio.espeak import speak
from talkloop.pipeline.audio.io import resample
from talkloop.pipeline.core.errors import InputError

# ARPAbet (flite, festival, CMUdict; em = syllabic m) and espeak-ng's mnemonics.
BILABIAL_PHONES = frozenset({"p", "b", "m", "em"})
_HOP_S = 0.01  # cepstral frames every 10 ms, 25 ms windows
_WIN_S = 0.025
_MELS, _CEPS = 26, 13


@dataclass(frozen=True)
class Phone:
    """One phone of a clip: ``start`` and ``end`` in seconds of the clip."""

    start: float
    end: float
    phone: str


def phone_name(label: str) -> str:
    """A phone label without stress digits, espeak's stress and length marks, in lower case."""
    return label.strip().strip("'\",:;_-0123456789").lower()


def read_lab(path: Path) -> list[Phone]:
    """``start end phone`` lines (seconds); blank lines and ``#`` comments are skipped.

    Raises:
        InputError: a line without two numbers and a label, or an end before its start.
    """
    phones = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        try:
            start, end, label = float(parts[0]), float(parts[1]), parts[2]
        except (ValueError, IndexError):
            raise InputError(
                f"{path}:{n}: expected 'start end phone' in seconds, got {line!r}"
            ) from None
        if end < start:
            raise InputError(f"{path}:{n}: phone ends ({end}) before it starts ({start})")
        phones.append(Phone(start, end, label))
    return phones


def _cepstra(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """(N, 13) mel cepstra every 10 ms, each coefficient normalised over the recording."""
    win, hop = int(_WIN_S * sample_rate), int(_HOP_S * sample_rate)
    n_fft = 1 << (win - 1).bit_length()
    x = np.pad(audio.astype(np.float64), (win // 2, win))
    frames = max(1, (len(x) - win) // hop + 1)
    idx = np.arange(win)[None, :] + hop * np.arange(frames)[:, None]
    spec = np.abs(np.fft.rfft(x[idx] * np.hanning(win), n_fft)) ** 2  # (N, n_fft/2+1)
    # Triangular mel filters from 60 Hz to 7.6 kHz (the band every input rate here carries).
    mel = np.linspace(*(2595 * np.log10(1 + f / 700) for f in (60.0, 7600.0)), _MELS + 2)
    hz = 700 * (10 ** (mel / 2595) - 1)
    bins = np.fft.rfftfreq(n_fft, 1 / sample_rate)
    lo, mid, hi = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    fb = np.clip(np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0, None)
    logmel = np.log(spec @ fb.T + 1e-10)  # (N, 26)
    k = np.arange(_MELS)
    dct = np.cos(np.pi / _MELS * (k[None, :] + 0.5) * np.arange(_CEPS)[:, None])  # (13, 26)
    c = logmel @ dct.T
    return (c - c.mean(0)) / (c.std(0) + 1e-8)


def warp_path(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dynamic time warp of two feature sequences (steps right, down, diagonal; both ends tied).

    Args:
        a: (N, D) features; b: (M, D).

    Returns:
        (N,) int: for each frame of ``a``, the frame of ``b`` the cheapest path pairs it with
        (the middle one where it pairs several).
    """
    n, m = len(a), len(b)
    cost = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))  # (N, M)
    acc = np.full((n, m), np.inf)
    step = np.zeros((n, m), np.int8)  # 0 diagonal, 1 from above (i-1), 2 from the left (j-1)
    # Cells on one anti-diagonal i + j = d depend only on the two before it: one vector op each.
    acc[0, 0] = cost[0, 0]
    for d in range(1, n + m - 1):
        i = np.arange(max(0, d - m + 1), min(n, d + 1))
        j = d - i
        diag = np.where((i > 0) & (j > 0), acc[i - 1, j - 1], np.inf)
        up = np.where(i > 0, acc[i - 1, j], np.inf)
        left = np.where(j > 0, acc[i, j - 1], np.inf)
        best = np.stack([diag, up, left])
        step[i, j] = best.argmin(0)
        acc[i, j] = cost[i, j] + best.min(0)
    pairs: list[list[int]] = [[] for _ in range(n)]
    i, j = n - 1, m - 1
    while True:
        pairs[i].append(j)
        if i == 0 and j == 0:
            break
        s = step[i, j]
        if i == 0:
            j -= 1
        elif j == 0 or s == 1:
            i -= 1
        elif s == 2:
            j -= 1
        else:
            i, j = i - 1, j - 1
    return np.array([int(np.median(p)) for p in pairs])


def align_transcript(text: str, audio: np.ndarray, sample_rate: int) -> list[Phone]:
    """espeak-ng's phonemes of ``text``, with times mapped onto ``audio`` by a time warp.

    Args:
        text: what ``audio`` says.
        audio: (n,) float32 mono at ``sample_rate``.

    Returns:
        Phones in clip seconds (espeak's mnemonics; pauses included).
    """
    said = speak(text)
    ref = resample(said.audio, said.sample_rate, sample_rate)
    path = warp_path(_cepstra(ref, sample_rate), _cepstra(audio, sample_rate))

    def to_clip(sample: int) -> float:
        k = min(len(path) - 1, int(round(sample / said.sample_rate / _HOP_S)))
        return float(path[k]) * _HOP_S

    ends = [*said.starts[1:], len(said.audio)]
    return [
        Phone(to_clip(int(s)), to_clip(int(e)), p)
        for p, s, e in zip(said.phonemes, said.starts, ends, strict=True)
    ]


def clip_phones(
    audio_path: Path, audio: np.ndarray, sample_rate: int
) -> tuple[list[Phone], str | None]:
    """The phones of a clip and where they came from: ``"lab"``, ``"transcript"`` or None."""
    audio_path = Path(audio_path)
    lab, txt = audio_path.with_suffix(".lab"), audio_path.with_suffix(".txt")
    if lab.is_file():
        return read_lab(lab), "lab"
    if txt.is_file() and txt.read_text().strip():
        return align_transcript(txt.read_text().strip(), audio, sample_rate), "transcript"
    return [], None


def bilabials(phones: list[Phone]) -> list[Phone]:
    """The bilabial phones (``BILABIAL_PHONES``) among ``phones``."""
    return [p for p in phones if phone_name(p.phone) in BILABIAL_PHONES]
