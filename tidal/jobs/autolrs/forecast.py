"""A probe's loss curve fitted with L(t) = a·e^(b·t) + c and forecast at a stage's end."""

from __future__ import annotations

import math

import numpy as np


def fit_exponential(t: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares fit of y ≈ a·e^(b·t) + c with b < 0.

    For a fixed b the model is linear in (a, c), so the fit is a one-dimensional search over b:
    a log-spaced grid of decay rates (from 1/1000 to 3 of the curve's length per step), the
    closed-form (a, c) for each, then a bounded refinement of b around the best grid point.
    """
    from scipy.optimize import minimize_scalar

    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    if t.shape != y.shape or t.size < 3:
        raise ValueError("fit_exponential needs at least 3 points of equal-length t and y")
    span = max(float(t.max() - t.min()), 1.0)

    def solve(b: float) -> tuple[float, float, float]:
        x = np.exp(b * (t - t[0]))
        design = np.stack([x, np.ones_like(x)], axis=1)
        (a0, c), *_ = np.linalg.lstsq(design, y, rcond=None)
        sse = float(np.sum((design @ np.array([a0, c]) - y) ** 2))
        return sse, float(a0), float(c)

    grid = -np.geomspace(1e-3 / span, 3.0, 60)
    sses = [solve(float(b))[0] for b in grid]
    i = int(np.argmin(sses))
    lo, hi = grid[min(i + 1, len(grid) - 1)], grid[max(i - 1, 0)]
    b = float(minimize_scalar(lambda b: solve(b)[0], bounds=(min(lo, hi), max(lo, hi)),
                              method="bounded").x) if lo != hi else float(grid[i])
    _, a0, c = solve(b)
    a = a0 * math.exp(-b * float(t[0]))  # refer a to t = 0: a·e^(b·t) = a0·e^(b·(t − t0))
    return a, b, c


def forecast(losses: list[float], horizon: int) -> float:
    """The loss a probe's curve (losses at t = 1..τ′) predicts at t = horizon.

    A curve that is not finite (diverged) forecasts +inf; the caller maps it to a penalty.
    """
    y = np.asarray(losses, dtype=float)
    if not np.all(np.isfinite(y)):
        return math.inf
    t = np.arange(1, len(y) + 1, dtype=float)
    a, b, c = fit_exponential(t, y)
    value = a * math.exp(b * horizon) + c
    # A rising curve extrapolates without bound: cap it at its own range above its maximum (it
    # ranks last either way). A loss is never negative.
    hi = float(y.max()) + abs(float(y[-1] - y[0]))
    return float(min(max(value, 0.0), hi))
