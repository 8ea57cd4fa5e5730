"""Phonemes to mouth tracks: viseme targets blended by dominance functions (coarticulation).

Each phoneme segment pulls the mouth towards its viseme target with a dominance that is flat over
the middle of the segment and falls off as a Gaussian outside it (Cohen-Massaro style). Lip
closures (p, b, m) dominate strongly so they always close; vowels spread wide so neighbouring
consonants inherit their shape. Targets lead the audio by ``LEAD_S``: the mouth forms a sound a
little before it is heard. Pauses close the mouth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from talkloop.pipeline.core.clock import frame_at_sample, frame_start_sample, frames_for_samples

LEAD_S = 0.03

# (open, width, round, teeth, tongue, dominance, spread seconds)
_V = tuple[float, float, float, float, float, float, float]
_SILENCE: _V = (0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.06)
_TABLE: dict[str, _V] = {
    # lip closures and lip-teeth contacts
    "p": (0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.025),
    "b": (0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.025),
    "m": (0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.03),
    "f": (0.1, 0.1, 0.0, 1.0, 0.0, 3.0, 0.03),
    "v": (0.1, 0.1, 0.0, 1.0, 0.0, 3.0, 0.03),
    # tongue tip
    "T": (0.2, 0.1, 0.0, 0.6, 1.0, 2.0, 0.03),
    "D": (0.2, 0.1, 0.0, 0.6, 1.0, 2.0, 0.03),
    "t": (0.18, 0.15, 0.0, 0.8, 0.6, 1.2, 0.025),
    "d": (0.18, 0.15, 0.0, 0.8, 0.6, 1.2, 0.025),
    "n": (0.18, 0.1, 0.0, 0.6, 0.6, 1.0, 0.03),
    "l": (0.28, 0.1, 0.0, 0.5, 1.0, 1.0, 0.03),
    "s": (0.1, 0.35, 0.0, 1.0, 0.2, 2.0, 0.03),
    "z": (0.1, 0.35, 0.0, 1.0, 0.2, 2.0, 0.03),
    "S": (0.18, -0.2, 0.7, 0.9, 0.2, 2.0, 0.03),
    "Z": (0.18, -0.2, 0.7, 0.9, 0.2, 2.0, 0.03),
    "tS": (0.18, -0.2, 0.7, 0.9, 0.3, 2.0, 0.03),
    "dZ": (0.18, -0.2, 0.7, 0.9, 0.3, 2.0, 0.03),
    # back of the tongue, glides
    "k": (0.3, 0.05, 0.0, 0.3, 0.0, 0.7, 0.03),
    "g": (0.3, 0.05, 0.0, 0.3, 0.0, 0.7, 0.03),
    "N": (0.25, 0.05, 0.0, 0.3, 0.0, 0.7, 0.03),
    "h": (0.35, 0.0, 0.0, 0.1, 0.0, 0.3, 0.03),
    "r": (0.22, -0.2, 0.5, 0.3, 0.3, 1.0, 0.035),
    "w": (0.1, -0.6, 1.0, 0.0, 0.0, 2.5, 0.035),
    "j": (0.2, 0.35, 0.0, 0.5, 0.3, 1.0, 0.03),
    # vowels
    "a": (0.9, 0.15, 0.0, 0.3, 0.1, 1.0, 0.06),
    "A": (1.0, 0.05, 0.1, 0.2, 0.1, 1.0, 0.06),
    "V": (0.7, 0.05, 0.0, 0.3, 0.1, 1.0, 0.05),
    "E": (0.6, 0.4, 0.0, 0.5, 0.1, 1.0, 0.05),
    "e": (0.5, 0.45, 0.0, 0.6, 0.1, 1.0, 0.05),
    "I": (0.35, 0.55, 0.0, 0.7, 0.1, 1.0, 0.05),
    "i": (0.3, 0.7, 0.0, 0.8, 0.1, 1.0, 0.05),
    "@": (0.42, 0.0, 0.0, 0.3, 0.1, 0.6, 0.045),
    "3": (0.4, -0.1, 0.3, 0.3, 0.1, 0.8, 0.05),
    "0": (0.75, -0.25, 0.6, 0.2, 0.1, 1.0, 0.06),
    "O": (0.7, -0.35, 0.8, 0.2, 0.1, 1.0, 0.06),
    "o": (0.5, -0.4, 0.85, 0.2, 0.1, 1.0, 0.06),
    "U": (0.3, -0.5, 0.9, 0.1, 0.1, 1.0, 0.05),
    "u": (0.25, -0.6, 1.0, 0.1, 0.1, 1.2, 0.06),
    "y": (0.25, -0.5, 1.0, 0.3, 0.1, 1.2, 0.06),
}
_VOWELS = set("aAVEeIi@3 0OoUuy".replace(" ", ""))
_CONSONANT: _V = (0.25, 0.05, 0.0, 0.4, 0.2, 0.8, 0.03)


def is_pause(phoneme: str) -> bool:
    """espeak's pause mnemonics: ``_``, ``_:``, ``_!``, ``||`` and friends."""
    return not phoneme or phoneme[0] in "_|"


def viseme_targets(phoneme: str) -> list[_V]:
    """One target per part of the phoneme (diphthongs give two: start and end shape)."""
    if is_pause(phoneme):
        return [_SILENCE]
    core = phoneme.strip("'%,:;#-2")  # stress/length marks and variant suffixes
    if core in _TABLE:
        return [_TABLE[core]]
    if core[:2] in _TABLE and len(core) > 2:
        return [_TABLE[core[:2]]]
    if core and core[0] in _VOWELS:
        parts = [_TABLE.get(c) for c in core if c in _VOWELS]
        parts = [p for p in parts if p is not None]
        return parts[:2] if parts else [_TABLE["@"]]
    if core and core[0] in _TABLE:
        return [_TABLE[core[0]]]
    return [_CONSONANT]


def is_vowel(phoneme: str) -> bool:
    """Whether the mnemonic is a vowel (syllable nucleus)."""
    core = phoneme.strip("'%,")
    return bool(core) and core[0] in _VOWELS


@dataclass
class MouthTracks:
    """Per-frame mouth parameters, each ``(T,)`` float32, plus speech activity."""

    mouth_open: np.ndarray
    mouth_width: np.ndarray
    mouth_round: np.ndarray
    teeth: np.ndarray
    tongue: np.ndarray
    jaw: np.ndarray
    speaking: np.ndarray  # (T,) bool: a non-pause phoneme overlaps the frame


def mouth_tracks(
    phonemes: list[str],
    starts: np.ndarray,
    num_samples: int,
    sample_rate: int,
    fps: int,
    articulation: float = 1.0,
) -> MouthTracks:
    """Blend viseme targets into per-frame mouth tracks.

    Args:
        phonemes: mnemonics; ``starts[i]`` is the sample where phoneme ``i`` starts (the audio
            before ``starts[0]`` and everything not covered are silence).
        num_samples: audio length; the tracks have ``frames_for_samples(num_samples)`` frames.
        articulation: scales how far the mouth opens on vowels (0.6 mumbly .. 1.2 crisp).

    Returns:
        Tracks sampled at the middle of each frame's audio interval.
    """
    n_frames = frames_for_samples(num_samples, fps, sample_rate)
    bounds = np.array([frame_start_sample(j, fps, sample_rate) for j in range(n_frames + 1)])
    t = 0.5 * (bounds[:-1] + np.minimum(bounds[1:], num_samples)) / sample_rate + LEAD_S
    ends = np.append(starts[1:], num_samples).astype(np.float64)
    seg_t0, seg_t1, targets, dom, spread = [], [], [], [], []
    # Silence before the first phoneme and after the last one.
    first = float(starts[0]) if len(starts) else float(num_samples)
    for a, b in ((-1.0, first), (float(ends[-1]) if len(ends) else 0.0, num_samples + 1.0)):
        if b > a:
            seg_t0.append(a / sample_rate)
            seg_t1.append(b / sample_rate)
            targets.append(_SILENCE[:5])
            dom.append(_SILENCE[5])
            spread.append(_SILENCE[6])
    for ph, s, e in zip(phonemes, starts, ends, strict=True):
        parts = viseme_targets(ph)
        edges = np.linspace(float(s), float(e), len(parts) + 1) / sample_rate
        for k, part in enumerate(parts):
            tgt = np.array(part[:5])
            if is_vowel(ph):
                tgt[0] = min(1.0, tgt[0] * articulation)
            seg_t0.append(edges[k])
            seg_t1.append(edges[k + 1])
            targets.append(tuple(tgt))
            dom.append(part[5])
            spread.append(part[6])
    t0, t1 = np.array(seg_t0)[:, None], np.array(seg_t1)[:, None]
    centre, half = 0.5 * (t0 + t1), 0.5 * (t1 - t0)
    # Flat over the inner half of the segment, Gaussian falloff outside it.
    dist = np.maximum(0.0, np.abs(t[None, :] - centre) - 0.5 * half)
    weights = np.array(dom)[:, None] * np.exp(-((dist / np.array(spread)[:, None]) ** 2))
    weights += 1e-9
    values = (weights[:, :, None] * np.array(targets)[:, None, :]).sum(0) / weights.sum(0)[:, None]
    values = values.astype(np.float32)  # (T, 5)
    speaking = np.zeros(n_frames, bool)
    for ph, s, e in zip(phonemes, starts, ends, strict=True):
        if not is_pause(ph) and e > s:
            lo = frame_at_sample(int(s), fps, sample_rate)
            speaking[lo : frame_at_sample(int(e) - 1, fps, sample_rate) + 1] = True
    opening = values[:, 0]
    return MouthTracks(
        mouth_open=opening,
        mouth_width=values[:, 1],
        mouth_round=values[:, 2],
        teeth=values[:, 3] * np.clip(opening * 4.0, 0.0, 1.0),
        tongue=values[:, 4],
        jaw=np.clip(opening * 0.8, 0.0, 1.0).astype(np.float32),
        speaking=speaking,
    )
