"""The sentence bank: deterministic English sentences, addressed by index.

Hand-written lines first, then sentences assembled from phrase lists (a few thousand distinct
ones). Splits take sentences by index (see ``splits.py``), so a test sentence is never trained on.
"""

from __future__ import annotations

from functools import lru_cache

_FIXED = (
    "Hello there, I am your avatar.",
    "Nice to see you again, how was your day?",
    "The quick brown fox jumps over the lazy dog.",
    "Please remember to bring your umbrella tomorrow.",
    "We should probably leave before the traffic gets worse.",
    "Thank you very much for watching this video.",
    "Could you tell me where the nearest train station is?",
    "My favourite colour has always been a deep shade of blue.",
    "It might rain later, so keep the windows closed.",
    "Let me show you how this works, step by step.",
    "That was the best pizza I have ever eaten.",
    "Welcome back to the show, everyone.",
    "Honestly, I did not expect it to be this easy.",
    "She sells sea shells by the sea shore.",
    "Peter Piper picked a peck of pickled peppers.",
    "How much wood would a woodchuck chuck?",
    "The meeting starts at nine, so do not be late.",
    "I think we can finish this by Friday afternoon.",
    "Every morning I walk my dog around the park.",
    "Good evening, and welcome to the news.",
)
_SUBJECTS = (
    "my neighbour",
    "the teacher",
    "our team",
    "a small child",
    "the old fisherman",
    "every student",
    "the pilot",
    "my brother",
    "the chef",
    "your friend",
    "the mayor",
    "a curious cat",
    "the new manager",
    "grandma",
    "the musician",
    "this robot",
)
_VERBS = (
    "found",
    "painted",
    "wanted",
    "borrowed",
    "forgot",
    "fixed",
    "described",
    "sold",
    "built",
    "ordered",
    "carried",
    "loved",
    "watched",
    "opened",
)
_OBJECTS = (
    "a blue bicycle",
    "the heavy box",
    "some fresh bread",
    "an old map",
    "the broken window",
    "a funny movie",
    "three yellow balloons",
    "the wooden boat",
    "a letter from Paris",
    "the last slice of cake",
    "a very loud radio",
    "the garden fence",
)
_TAILS = (
    "yesterday",
    "last summer",
    "before lunch",
    "after the storm",
    "in the morning",
    "without asking",
    "for the party",
    "on Monday",
    "near the river",
    "at midnight",
)


@lru_cache(maxsize=1)
def sentence_bank() -> tuple[str, ...]:
    """All sentences, fixed order (the index is the sentence's identity)."""
    out = list(_FIXED)
    # Interleave the phrase lists with co-prime strides so neighbouring indices differ a lot.
    total = len(_SUBJECTS) * len(_VERBS) * len(_OBJECTS) * len(_TAILS)
    for k in range(total):
        s = _SUBJECTS[k % len(_SUBJECTS)]
        v = _VERBS[(k // len(_SUBJECTS)) % len(_VERBS)]
        o = _OBJECTS[(k * 7) % len(_OBJECTS)]
        t = _TAILS[(k * 3 + k // 5) % len(_TAILS)]
        sent = f"{s} {v} {o} {t}."
        out.append(sent[0].upper() + sent[1:])
    return tuple(dict.fromkeys(out))  # drop duplicates, keep order
