"""Speaking style: four values in [0, 1] and the many ways a prompt can describe them.

The phrase banks are split by index: training prompts use the first part of every bank,
evaluation prompts (``held_out=True``) only the rest, so a model is scored on paraphrases it has
never seen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

STYLE_FIELDS = ("smile", "energy", "brows", "gaze")

# Per field: (low phrases, high phrases). Mid values get no phrase or a "moderately" one.
_BANK: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "smile": (
        (
            "serious",
            "neutral expression",
            "straight-faced",
            "not smiling",
            "stern look",
            "composed and unsmiling",
            "deadpan",
            "earnest face",
            "sober expression",
            "no smile",
        ),
        (
            "smiling",
            "cheerful",
            "happy",
            "friendly smile",
            "warm and smiling",
            "beaming",
            "grinning",
            "joyful",
            "bright smile",
            "upbeat and happy",
        ),
    ),
    "energy": (
        (
            "calm",
            "still head",
            "relaxed and steady",
            "barely moves",
            "quiet and composed",
            "minimal head motion",
            "keeps the head still",
            "serene",
            "low energy",
            "gentle and restrained",
        ),
        (
            "animated",
            "nods a lot",
            "lively head movement",
            "energetic",
            "expressive and bouncy",
            "moves the head a lot",
            "enthusiastic nodding",
            "dynamic",
            "very lively",
            "vigorous gestures with the head",
        ),
    ),
    "brows": (
        (
            "still eyebrows",
            "flat brows",
            "unexpressive eyebrows",
            "brows stay put",
            "relaxed forehead",
            "steady brows",
            "calm eyebrows",
            "no eyebrow movement",
            "smooth forehead",
            "level brows",
        ),
        (
            "raises the eyebrows often",
            "expressive eyebrows",
            "lively brows",
            "brows go up a lot",
            "animated eyebrows",
            "frequent eyebrow raises",
            "eyebrows dance",
            "very expressive forehead",
            "arched, active brows",
            "surprised-looking brows",
        ),
    ),
    "gaze": (
        (
            "looks straight at the camera",
            "steady eye contact",
            "focused gaze",
            "eyes on the viewer",
            "direct look",
            "holds eye contact",
            "fixed gaze",
            "attentive eyes",
            "looks into the lens",
            "unwavering gaze",
        ),
        (
            "glances around",
            "wandering eyes",
            "looks away often",
            "shifty gaze",
            "eyes drift around",
            "distracted look",
            "looks left and right",
            "restless eyes",
            "avoids eye contact",
            "darting glances",
        ),
    ),
}
_OPENERS = (
    ("", "a speaker, ", "a presenter, ", "someone ", "the avatar is ", "talking, "),
    ("an announcer, ", "a person who is ", "a host, ", "speaks while "),
)
_JOINERS = ((", ", ", ", "; "), (", ", " with "))
TRAIN_FRACTION = 0.7
DESCRIBED_BELOW, DESCRIBED_ABOVE = 0.35, 0.65  # style values a prompt puts into words


@dataclass(frozen=True)
class Style:
    """Style values in [0, 1]: smile, head-motion energy, brow activity, gaze wandering."""

    smile: float
    energy: float
    brows: float
    gaze: float

    def to_dict(self) -> dict[str, float]:
        """Field -> value."""
        return asdict(self)

    def vector(self) -> np.ndarray:
        """``(4,)`` float32 in STYLE_FIELDS order."""
        return np.array([getattr(self, f) for f in STYLE_FIELDS], np.float32)


def sample_style(rng: np.random.Generator) -> Style:
    """A random style; values cluster near the ends so prompts have something to say."""
    vals = rng.beta(0.7, 0.7, size=4)
    return Style(*(float(v) for v in vals))


def is_described(value: float) -> bool:
    """Whether :func:`describe` puts a style value into words (the rest it leaves out)."""
    return value < DESCRIBED_BELOW or value > DESCRIBED_ABOVE


SMILE_RANGE = (-0.25, 1.0)  # the rendered smile a style may reach (motion clips to it)


def smile_of_style(value: float) -> float:
    """The rendered ``smile`` a style's smile value centres on, before motion's slow wobble
    (clip to ``SMILE_RANGE``)."""
    return (value - 0.3) * 1.1


def _bank_part(phrases: tuple[str, ...], held_out: bool) -> tuple[str, ...]:
    cut = int(round(len(phrases) * TRAIN_FRACTION))
    return phrases[cut:] if held_out else phrases[:cut]


def field_phrases(field: str, high: bool, held_out: bool) -> tuple[str, ...]:
    """The phrases for one end of one style field (e.g. smiling: ``("smile", True, ...)``)."""
    low, hi = _BANK[field]
    return _bank_part(hi if high else low, held_out)


def phrase_bank(held_out: bool) -> set[str]:
    """Every phrase a prompt may use in that half (for tests and audits)."""
    out: set[str] = set()
    for low, high in _BANK.values():
        out.update(_bank_part(low, held_out))
        out.update(_bank_part(high, held_out))
    return out


def describe(style: Style, rng: np.random.Generator, held_out: bool = False) -> str:
    """A text prompt describing ``style``; phrases come from the train or held-out bank.

    Values above 0.65 or below 0.35 are described (in random order); middling ones are left out,
    and with probability 0.1 the prompt is empty (a model must cope with no text).
    """
    if rng.random() < 0.1:
        return ""
    h = int(held_out)
    picks = []
    for name in STYLE_FIELDS:
        value = getattr(style, name)
        low, high = _BANK[name]
        if value > DESCRIBED_ABOVE:
            picks.append(str(rng.choice(_bank_part(high, held_out))))
        elif value < DESCRIBED_BELOW:
            picks.append(str(rng.choice(_bank_part(low, held_out))))
    if not picks:
        return ""
    rng.shuffle(picks)
    joiners = _JOINERS[h]
    text = picks[0]
    for k, p in enumerate(picks[1:], start=2):
        text += (" and " if k == len(picks) else str(rng.choice(joiners))) + p
    return str(rng.choice(_OPENERS[h])) + text
