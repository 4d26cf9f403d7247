"""A family of serving demand for the simulator: seeded synthetic shapes and a real trace under
several time-scales, each a requests/s series per interval whose busiest interval needs the
whole inference pool (`peak_rps`). A loan manager is judged on all of them, worst case first,
as the policy is judged on a family of workloads (`tidal.sim.workload.family`), never on one
file.

Shapes (n intervals of `interval_s`; every one with multiplicative noise of one interval,
lognormal σ = 0.1):

* `diurnal`   e(t) of `tidal.serving.traffic.Envelope` over min(a day, the span);
* `onoff`     an idle floor (10% of the peak) broken by bursts whose lengths and gaps are
              Pareto(1.5) (heavy-tailed: most short, a few long) and whose heights are uniform
              in [0.3, 1]: traffic that jumps within one interval and falls back as abruptly;
* `flash`     a diurnal base at a third of its range, with flash crowds (Poisson, one per two
              hours on average) that jump within one interval to [0.6, 1] and decay
              exponentially over 5–30 minutes;
* `ramp`      a slow rise from 5% to the peak over the span;
* `trace×s`   the real trace's arrivals with its seconds multiplied by s, tiled over the span,
              under the diurnal envelope: s = 1 keeps its own minute-to-minute bursts, larger s
              smooths them (`stretched` spreads the trace once over the span, as
              `benchmarks/loan_compare.py` does by default).
"""

from __future__ import annotations

import math

import numpy as np

from tidal.serving.traffic import Envelope, demand_series

SHAPES = ("diurnal", "onoff", "flash", "ramp")
TRACE_SCALES = (1.0, 4.0, 16.0)


def _noisy(x: np.ndarray, rng: np.random.Generator, peak_rps: float) -> np.ndarray:
    y = np.clip(x, 0.0, None) * rng.lognormal(0.0, 0.1, size=len(x))
    top = y.max()
    if top <= 0:
        raise ValueError("a demand shape with no requests")
    return y * (peak_rps / top)


def shape(name: str, n: int, interval_s: float, *, peak_rps: float, seed: int = 0) -> np.ndarray:
    """One synthetic shape of the module docstring: requests/s per interval, busiest = peak_rps."""
    if name not in SHAPES:
        raise ValueError(f"demand shape {name!r}: one of {', '.join(SHAPES)}")
    rng = np.random.default_rng([seed, SHAPES.index(name)])
    t = np.arange(n) * interval_s
    day = Envelope(period_s=min(86_400.0, max(n * interval_s, interval_s)))
    if name == "diurnal":
        x = day(t + 0.5 * interval_s)
    elif name == "onoff":
        x = np.full(n, 0.1)
        i = 0
        while i < n:
            i += math.ceil(3 * rng.pareto(1.5) + 1)  # an idle gap, in intervals
            length = math.ceil(2 * rng.pareto(1.5) + 1)
            x[i:i + length] = rng.uniform(0.3, 1.0)
            i += length
    elif name == "flash":
        x = 0.1 + 0.25 * day(t + 0.5 * interval_s)
        for start in rng.uniform(0, n * interval_s, size=rng.poisson(n * interval_s / 7200.0)):
            after = t - start
            tau = rng.uniform(300.0, 1800.0)
            crowd = np.where(after >= 0, rng.uniform(0.6, 1.0) * np.exp(-np.clip(after, 0, None) / tau), 0.0)
            x = np.maximum(x, crowd)
    else:  # ramp
        x = np.linspace(0.05, 1.0, n)
    return _noisy(x, rng, peak_rps)


def tiled_trace(arrivals: np.ndarray, n: int, interval_s: float, *, scale: float,
                peak_rps: float) -> np.ndarray:
    """`trace×scale` of the module docstring: the trace's seconds × scale, repeated to cover n
    intervals, under the diurnal envelope, busiest interval = peak_rps."""
    span = n * interval_s
    one = arrivals * scale
    length = float(one[-1]) + interval_s
    t = np.concatenate([one + k * length for k in range(max(1, math.ceil(span / length)))])
    t = t[t < span]
    counts = np.bincount((t // interval_s).astype(int), minlength=n)[:n].astype(float)
    counts *= Envelope(period_s=min(86_400.0, span))((np.arange(n) + 0.5) * interval_s)
    if counts.max() <= 0:
        raise ValueError("the trace has no requests in the span")
    return counts * (peak_rps / counts.max())


def family(arrivals: np.ndarray, n: int, interval_s: float, *, peak_rps: float,
           seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """Every shape and the trace at every time-scale, plus the trace stretched over the span."""
    out = [(name, shape(name, n, interval_s, peak_rps=peak_rps, seed=seed)) for name in SHAPES]
    out += [(f"trace×{s:g}", tiled_trace(arrivals, n, interval_s, scale=s, peak_rps=peak_rps))
            for s in TRACE_SCALES]
    stretched = demand_series(arrivals, n * interval_s, interval_s, peak_rps=peak_rps,
                              envelope=Envelope(period_s=min(86_400.0, n * interval_s)))
    return [*out, ("trace stretched", stretched)]
