"""Checks of a config dataclass's numeric fields, for its `__post_init__`: a bad value is a
ValueError in one line naming the field (`SchedulerConfig.tick_s must be ...`), raised before
anything runs with it. Booleans are not numbers here, though Python's are ints.
"""

from __future__ import annotations

import math


def require_int(where: str, v: object, lo: int, hi: int | None = None) -> None:
    """`v` is an integer in [lo, hi] (hi None: no upper bound)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        raise ValueError(f"{where} must be an integer >= {lo}{f' and <= {hi}' if hi is not None else ''}, "
                         f"got {v!r}")


def require_number(where: str, v: object, lo: float, *, strict: bool) -> None:
    """`v` is a finite number > lo (>= lo when not `strict`)."""
    if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
            or v < lo or (strict and v == lo)):
        raise ValueError(f"{where} must be a finite number {'>' if strict else '>='} {lo:g}, got {v!r}")
