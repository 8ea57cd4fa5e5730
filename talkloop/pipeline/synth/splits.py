"""Train / val / test splits by character, sentence and voice: no test item is ever trained on.

- characters: disjoint seed ranges;
- sentences: the bank index modulo 10 (8 train, 1 val, 1 test);
- voices: an espeak voice is ``base+variant``; both the base voices and the variants are split,
  so a held-out voice differs from every training voice in accent and in timbre.
"""

from __future__ import annotations

import numpy as np

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.synth.sentences import sentence_bank

SPLITS = ("train", "val", "test")

CHARACTER_SEEDS = {
    "train": range(0, 1_000_000),
    "val": range(1_000_000, 1_100_000),
    "test": range(2_000_000, 2_100_000),
}
_SENTENCE_RESIDUES = {"train": range(0, 8), "val": range(8, 9), "test": range(9, 10)}

_BASES = {
    "train": ("en", "en-us", "en-gb-x-rp", "en-gb-scotland", "de", "fr", "nl", "es"),
    "val": ("en-gb-x-gbcwmd", "it"),
    "test": ("en-029", "en-us-nyc", "en-gb-x-gbclan", "pl"),
}
_VARIANTS = {
    "train": (
        "m1",
        "m2",
        "m3",
        "m4",
        "m5",
        "f1",
        "f2",
        "f3",
        "klatt",
        "klatt2",
        "klatt3",
        "Alex",
        "Andrea",
        "Andy",
        "Annie",
        "anika",
        "aunty",
        "belinda",
        "benjamin",
        "boris",
        "caleb",
        "david",
        "ed",
        "edward",
        "iven",
        "iven2",
        "john",
        "max",
        "michel",
        "norbert",
        "paul",
        "pedro",
        "steph",
        "steph2",
    ),
    "val": ("m6", "f4", "klatt4", "linda", "robert", "shelby"),
    "test": ("m7", "m8", "f5", "klatt5", "grandpa", "grandma", "steph3", "travis", "victor", "zac"),
}


def check_split(split: str) -> str:
    """Return ``split`` or raise a ConfigError naming the valid ones."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    return split


def voices(split: str) -> tuple[str, ...]:
    """Every espeak voice name (``base+variant``) of the split."""
    check_split(split)
    return tuple(f"{b}+{v}" for b in _BASES[split] for v in _VARIANTS[split])


def sentence_indices(split: str) -> np.ndarray:
    """Indices into ``sentence_bank()`` that belong to the split."""
    residues = _SENTENCE_RESIDUES[check_split(split)]
    idx = np.arange(len(sentence_bank()))
    return idx[np.isin(idx % 10, list(residues))]


def character_seed(split: str, k: int) -> int:
    """The ``k``-th character seed of the split (wraps around the range)."""
    r = CHARACTER_SEEDS[check_split(split)]
    return r.start + k % len(r)


def split_of_character(seed: int) -> str | None:
    """Which split a character seed belongs to (None: outside every range)."""
    for name, r in CHARACTER_SEEDS.items():
        if seed in r:
            return name
    return None
