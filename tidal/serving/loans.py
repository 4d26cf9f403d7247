"""The loan manager: how many inference GPUs Serve can lend to training now. Pure functions.

Serve's demand (requests/s, one sample per interval) comes in as data; the live system feeds it
from its Serve deployment's request counts, the simulator from a replayed trace. Nothing here
reads a clock or the cluster.

**Forecast** (Holt's linear exponential smoothing, plus a burst margin). With r_t the rate of
interval t:

    ℓ_t = α r_t + (1 − α)(ℓ_{t−1} + b_{t−1}),   b_t = β (ℓ_t − ℓ_{t−1}) + (1 − β) b_{t−1}
    r̂(t + h) = ℓ_t + h b_t
    F = max( max_{1≤h≤H} r̂(t + h),  max_{t−W<s≤t} r_s ) · (1 + headroom)

H = ⌈(lead_s + interval_s) / interval_s⌉ intervals: the demand must be covered until a reclaim
decided at the next interval has taken effect (lead_s: checkpoint + stop + replica start). The
window maximum W keeps GPUs from being lent in the lull between two bursts of a bursty stream
(the trend alone reacts a step late), and the headroom covers the noise of one interval.

**Lendable GPUs**: replicas needed R = max(min_replicas, ⌈F / replica_rps⌉) (replica_rps: one
replica's requests/s at the latency SLO, measured), lendable = max(0, pool − R). Lending never
exceeds what Serve does not need: lendable ≤ pool − ⌈r_t / replica_rps⌉ for the current rate
too, whatever the forecast says (the forecast only ever lends less).

**Which GPUs** (`lend_by_node`): a node's GPUs are either running a replica or lendable; GPUs
training already holds stay lent while the count allows (a recall costs a restart), the rest
fill nodes with the fewest replicas first so Serve's replicas stay packed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class LoanConfig:
    replica_rps: float  # one replica's requests/s at the SLO (measured: tidal.serving.capacity)
    interval_s: float = 60.0
    lead_s: float = 30.0  # reclaim lead time: checkpoint + stop + a replica's start
    alpha: float = 0.5
    beta: float = 0.3
    window: int = 5  # intervals of the burst maximum
    headroom: float = 0.1
    min_replicas: int = 1
    predictive: bool = True  # False: lend what is idle now (Kueue's borrowing), no forecast
    history: int = 60  # intervals of demand the loan step keeps (`tidal.serving.loanstep`)


@dataclass(frozen=True, kw_only=True)
class LoanDecision:
    forecast_rps: float
    replicas: int  # replicas Serve must be able to run until the next decision takes effect
    lendable: int  # inference GPUs training may hold
    recall_risk: float  # chance a lent GPU is recalled soon: the share of the pool Serve needs (≥ 0.1)


def forecast(rates: Sequence[float], cfg: LoanConfig) -> float:
    """F of the module docstring, from the rates of the intervals so far (oldest first)."""
    if not rates:
        return 0.0
    if not cfg.predictive:
        return float(rates[-1])
    level, trend = float(rates[0]), 0.0
    for r in rates[1:]:
        prev = level
        level = cfg.alpha * r + (1 - cfg.alpha) * (level + trend)
        trend = cfg.beta * (level - prev) + (1 - cfg.beta) * trend
    h = max(1, math.ceil((cfg.lead_s + cfg.interval_s) / cfg.interval_s))
    ahead = max(level + k * trend for k in range(1, h + 1))
    recent = max(rates[-cfg.window:])
    return max(ahead, recent, 0.0) * (1.0 + cfg.headroom)


def replicas_for(rps: float, cfg: LoanConfig) -> int:
    return max(cfg.min_replicas, math.ceil(rps / cfg.replica_rps - 1e-9))


def decide_loan(rates: Sequence[float], pool_gpus: int, cfg: LoanConfig) -> LoanDecision:
    """How many of the pool's GPUs may be lent now (module docstring)."""
    f = forecast(rates, cfg)
    now = float(rates[-1]) if rates else 0.0
    replicas = min(pool_gpus, max(replicas_for(f, cfg), replicas_for(now, cfg)))
    return LoanDecision(forecast_rps=f, replicas=replicas, lendable=max(0, pool_gpus - replicas),
                        recall_risk=max(0.1, replicas / pool_gpus) if pool_gpus else 1.0)


def lend_by_node(pool: Mapping[str, int], lendable: int, training: Mapping[str, int]) -> dict[str, int]:
    """Lent GPUs per inference node: at most `lendable` in all, each node's training holdings kept
    first (as far as the count allows), the rest on nodes in order of most lent already."""
    out = {nid: 0 for nid in pool}
    left = lendable
    for nid in sorted(pool, key=lambda n: (-training.get(n, 0), n)):
        take = min(training.get(nid, 0), pool[nid], left)
        out[nid] = take
        left -= take
    for nid in sorted(pool, key=lambda n: (-out[n], n)):
        take = min(pool[nid] - out[nid], left)
        out[nid] += take
        left -= take
    return out
