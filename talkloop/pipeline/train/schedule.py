"""The learning-rate schedule every trainer uses: linear warm-up, then cosine decay."""

from __future__ import annotations

import math


def warmup_cosine(
    step: int, total: int, lr: float, warmup: int, final_frac: float, time_frac: float = 0.0
) -> float:
    """The learning rate of ``step`` of ``total``: a linear warm-up over ``warmup`` steps (at
    most a tenth of the run, so short or budgeted runs still reach the peak), then cosine decay
    from ``lr`` to ``lr * final_frac``.

    ``time_frac`` (the share of a wall-clock budget used) moves the decay along when the clock,
    not the step count, will end the run, so a budgeted run still ends at the low rate.
    """
    warmup = min(warmup, total // 10)
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, max((step - warmup) / max(1, total - warmup), time_frac))
    return lr * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
