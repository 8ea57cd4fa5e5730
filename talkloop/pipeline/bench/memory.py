"""Memory over time: warm-up growth, then the slope of the steady part.

Resident memory rises at the start of every run (allocator pools, the decoder's cache, kernel
and encoder buffers, the first chunks) and then stays level if nothing accumulates. A slope
fitted across the rise mistakes warm-up for a leak (docs/benchmarks.md, "Figures behind code
choices"). So the first ``WARMUP_S`` seconds (of generated video offline, of call time live) are
reported as one growth figure, and the slope is fitted to what follows only when at least
``MIN_STEADY_S`` seconds follow; shorter runs report no slope (null in JSON, n/a in tables).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["MIN_STEADY_S", "WARMUP_S", "memory_trend"]

# Long enough for the shipped model's RSS to reach its level, offline and live
# (docs/benchmarks.md, "Figures behind code choices").
WARMUP_S = 30.0
# A slope fitted to less than a minute is mostly the RSS wobble of a few chunks.
MIN_STEADY_S = 60.0


def memory_trend(
    samples: Sequence[Sequence[float]],
    warmup_s: float = WARMUP_S,
    min_steady_s: float = MIN_STEADY_S,
) -> dict[str, float | list[float] | None]:
    """Warm-up growth and steady slope of ``(seconds, rss_mb)`` samples.

    Args:
        samples: (seconds since the start, resident memory in MB), in time order.
        warmup_s: the warm-up: samples before it count only towards ``mem_warmup_growth_mb``.
        min_steady_s: the least time after the warm-up for a slope.

    Returns:
        ``mem_warmup_s`` (``warmup_s``); ``mem_warmup_growth_mb``: the RSS at the end of the
        warm-up (the first sample at or after it) minus the first sample, None if the run ends
        before the warm-up does; ``mem_slope_mb_per_min``: least-squares slope of the samples
        from the warm-up on, None when they span less than ``min_steady_s``;
        ``mem_steady_range_mb``: [min, max] RSS from the warm-up on, None before the warm-up ends.
    """
    pts = np.asarray(samples, dtype=np.float64).reshape(-1, 2)  # (N, 2): seconds, MB
    steady = pts[pts[:, 0] >= warmup_s]
    out: dict[str, float | list[float] | None] = {
        "mem_warmup_s": warmup_s,
        "mem_warmup_growth_mb": None,
        "mem_slope_mb_per_min": None,
        "mem_steady_range_mb": None,
    }
    if steady.shape[0] == 0:
        return out
    out["mem_warmup_growth_mb"] = float(steady[0, 1] - pts[0, 1])
    out["mem_steady_range_mb"] = [float(steady[:, 1].min()), float(steady[:, 1].max())]
    if steady.shape[0] >= 3 and steady[-1, 0] - steady[0, 0] >= min_steady_s:
        out["mem_slope_mb_per_min"] = float(np.polyfit(steady[:, 0] / 60.0, steady[:, 1], 1)[0])
    return out
