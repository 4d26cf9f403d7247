"""The LR range test's sweep and its reading (`tidal.jobs.autolrs`, phase 1)."""

from __future__ import annotations

import math

import numpy as np


def sweep_lrs(lo: float, hi: float, steps: int) -> list[float]:
    """The range test's LRs: geometric from `lo` to `hi` in `steps` steps."""
    return [lo * (hi / lo) ** (i / (steps - 1)) for i in range(steps)]


def sweep_diverged(losses: list[float]) -> bool:
    """The sweep has passed every useful LR: its last loss is not finite, or the sweep has
    trained (its lowest loss at least 10% below its first) and then lost all of it (the last
    loss above the first). The margin keeps one noisy batch near the start from ending it."""
    if len(losses) < 2:
        return False
    first, last = losses[0], losses[-1]
    if not math.isfinite(last):
        return True
    return min(losses) < first - 0.1 * abs(first) and last > first


def read_range_test(lrs: list[float], losses: list[float], *, within: float = 0.1) -> float:
    """lr_k, the sweep's knee: the first LR at which the loss, smoothed by a centred moving
    average of w = max(3, R/8) points (odd) so that one noisy batch cannot decide it, is within
    `within` of its whole fall (its first smoothed value − its lowest) of its lowest:

        lr_k = lr[min{ j : s_j ≤ min(s) + within·(s_0 − min(s)) }]

    A sweep cut short by divergence is read over the steps it ran, the diverging one excluded."""
    n = len(losses)
    if sweep_diverged(losses):
        n -= 1
    y = np.asarray(losses[:n], dtype=float)
    if n < 3:
        return lrs[0]
    w = max(3, n // 8) | 1
    w = min(w, n if n % 2 else n - 1)
    smooth = np.convolve(y, np.ones(w) / w, mode="valid")  # smooth[j] centres on point j + w//2
    low = float(smooth.min())
    knee = int(np.argmax(smooth <= low + within * (float(smooth[0]) - low)))
    return float(lrs[knee + w // 2])
