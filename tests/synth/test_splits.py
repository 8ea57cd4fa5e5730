"""Splits never share characters, sentences or voices; prompts hold out paraphrases."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from talkloop.pipeline.synth.dataset import make_clip
from talkloop.pipeline.synth.sentences import sentence_bank
from talkloop.pipeline.synth.splits import (
    CHARACTER_SEEDS,
    SPLITS,
    sentence_indices,
    split_of_character,
    voices,
)
from talkloop.pipeline.synth.style import Style, describe, phrase_bank

pytestmark = pytest.mark.unit


def test_sentences_disjoint_and_cover_the_bank() -> None:
    sets = {s: set(sentence_indices(s).tolist()) for s in SPLITS}
    for a, b in itertools.combinations(SPLITS, 2):
        assert not sets[a] & sets[b]
    assert set().union(*sets.values()) == set(range(len(sentence_bank())))
    texts = {s: {sentence_bank()[i] for i in sets[s]} for s in SPLITS}
    assert not texts["train"] & texts["test"]


def test_voices_disjoint_in_base_and_variant() -> None:
    parts = {s: [v.split("+") for v in voices(s)] for s in SPLITS}
    for a, b in itertools.combinations(SPLITS, 2):
        assert not {x[0] for x in parts[a]} & {x[0] for x in parts[b]}
        assert not {x[1] for x in parts[a]} & {x[1] for x in parts[b]}


def test_every_variant_exists_in_espeak_data() -> None:
    # espeak-ng silently falls back to the plain voice for an unknown variant.
    roots = [Path(p) / "voices" / "!v" for p in ("/usr/lib/x86_64-linux-gnu/espeak-ng-data",)]
    root = next((r for r in roots if r.is_dir()), None)
    if root is None:
        pytest.skip("espeak-ng-data not at the Debian path")
    variants = {v.split("+")[1] for s in SPLITS for v in voices(s)}
    assert not [v for v in variants if not (root / v).is_file()]


def test_character_ranges_disjoint() -> None:
    for a, b in itertools.combinations(SPLITS, 2):
        ra, rb = CHARACTER_SEEDS[a], CHARACTER_SEEDS[b]
        assert ra.stop <= rb.start or rb.stop <= ra.start


def test_clips_stay_in_their_split() -> None:
    seen: dict[str, dict[str, set]] = {}
    for split in SPLITS:
        got = {"chars": set(), "voices": set(), "sentences": set()}
        for i in range(6):
            c = make_clip(split, i, render=False, augment=False)
            assert split_of_character(c.character.seed) == split
            got["chars"].add(c.character.seed)
            got["voices"].add(c.voice)
            got["sentences"].update(c.sentence_ids)
            assert c.voice in voices(split)
            assert set(c.sentence_ids) <= set(sentence_indices(split).tolist())
        seen[split] = got
    for key in ("chars", "voices", "sentences"):
        assert not seen["train"][key] & seen["test"][key]


def test_held_out_prompts_use_unseen_phrases() -> None:
    train, held = phrase_bank(False), phrase_bank(True)
    assert train and held and not train & held
    rng = np.random.default_rng(0)
    style = Style(smile=0.9, energy=0.1, brows=0.9, gaze=0.1)
    for _ in range(20):
        text = describe(style, rng, held_out=True)
        assert not any(p in text for p in train if all(p not in h for h in held))
