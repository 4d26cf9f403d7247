"""The loan manager: how many inference GPUs Serve can lend to training now. Pure functions.

Serve's demand (one sample per interval, in the units of `LoanConfig.replica_rps`) comes in as
data; the live system feeds it from its Serve deployments, the simulator from a replayed trace.
Nothing here reads a clock or the cluster.

**What must stay with Serve.** A loan decided now can only be undone by a reclaim decided at the
next interval, which takes effect `lead_s` later (checkpoint + stop + a replica's start). So the
replicas kept now must serve the demand of the next H intervals,

    D_t = max(r_{t+1}, …, r_{t+H}),   H = ⌈(lead_s + interval_s) / interval_s⌉.

**Risk-bounded forecast** (split conformal prediction over the traffic's own history). Each past
interval s with H intervals after it gives one score, the rise it was followed by relative to
its level (plus one replica's worth c = replica_rps, so that an idle service's rises are
counted in replicas rather than as infinite ratios):

    e_s = (D_s − r_s) / (r_s + c)

With n scores sorted, the kept demand is the current rate plus the k-th smallest score scaled
to the current level,

    F = r_t + e_(k) · (r_t + c),   k = ⌈(n + 1)(1 − risk)⌉,

which covers D_t with probability at least 1 − risk when the scores are exchangeable (the
conformal guarantee; the split needs no model of the traffic). When k > n the history is too
short to say so and nothing is lent (F = ∞): n ≥ (1 − risk) / risk scores are needed, 9 at
the default risk of 10%. The risk is a setting, the chance per decision that the demand outgrows
what was kept before a reclaim can answer; a shortfall then costs the excess for at most one
lead time, so the share of requests over the SLO is a fraction of it. Scores are relative
because traffic's rises scale with its level (a diurnal peak rises more requests/s in a minute
than its trough).

**Lendable GPUs**: replicas needed R = max(min_replicas, ⌈F / replica_rps⌉), lendable =
max(0, pool − R). Lending never exceeds what Serve does not need now: F ≥ r_t whatever the
scores (the forecast only ever lends less); `min_replicas` is the availability floor lending
never takes. With `predictive` off, F = r_t (Kueue's cohort borrowing: lend what is idle now).
The simulator's oracle passes D_t itself (`ahead`): the most any forecast could lend without a
shortfall.

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
    interval_s: float = 60.0  # seconds per interval of demand: one loan decision each
    lead_s: float = 30.0  # reclaim lead time: checkpoint + stop + a replica's start
    # the chance per decision that the demand before a reclaim can answer outgrows what is kept
    risk: float = 0.1
    min_replicas: int = 1  # the availability floor: replicas lending never takes
    predictive: bool = True  # False: lend what is idle now (Kueue's borrowing), no forecast
    history: int = 120  # intervals of demand the loan step keeps (`tidal.serving.loanstep`)

    def __post_init__(self) -> None:
        if not 0.0 < self.risk < 1.0:
            raise ValueError(f"risk: a probability in (0, 1), got {self.risk}")
        if not self.replica_rps > 0 or not self.interval_s > 0 or self.lead_s < 0:
            raise ValueError("replica_rps and interval_s must be > 0, lead_s ≥ 0")
        if self.history < horizon(self) + 1:
            raise ValueError(f"history: at least {horizon(self) + 1} intervals (the lead time's "
                             f"{horizon(self)} and one), got {self.history}")


@dataclass(frozen=True, kw_only=True)
class LoanDecision:
    forecast_rps: float  # F: the demand kept for (∞: the history cannot bound it yet)
    replicas: int  # replicas Serve must be able to run until the next decision takes effect
    lendable: int  # inference GPUs training may hold
    lendable_new: int  # of which newly lent: what stays idle for a borrower's start too (≤ lendable)
    recall_risk: float  # chance a lent GPU is recalled soon: the share of the pool Serve needs (≥ 0.1)


def horizon(cfg: LoanConfig, extra_s: float = 0.0) -> int:
    """H: the intervals a loan decided now must leave covered (`extra_s` more for a new loan)."""
    return max(1, math.ceil((cfg.lead_s + extra_s + cfg.interval_s) / cfg.interval_s - 1e-9))


def level(rates: Sequence[float], s: int, h: int) -> float:
    """b_s of the module docstring: the busiest of the h intervals up to s."""
    return max(rates[max(0, s - h + 1):s + 1])


def rise_scores(rates: Sequence[float], h: int) -> list[float]:
    """e_s of the module docstring over a horizon of h intervals, for every interval with h
    intervals after it."""
    return [max(rates[s + 1:s + h + 1]) - level(rates, s, h) for s in range(len(rates) - h)]


def margin(rates: Sequence[float], cfg: LoanConfig, h: int) -> float:
    """e_(k) of the module docstring over a horizon of h intervals (∞: too few scores yet)."""
    scores = sorted(rise_scores(rates, h))
    k = math.ceil((len(scores) + 1) * (1.0 - cfg.risk) - 1e-9)
    return max(0.0, scores[k - 1]) if k <= len(scores) else math.inf


def forecast(rates: Sequence[float], cfg: LoanConfig) -> float:
    """F of the module docstring, from the rates of the intervals so far (oldest first)."""
    if not rates:
        return 0.0
    if not cfg.predictive:
        return max(0.0, float(rates[-1]))
    h = horizon(cfg)
    return level(rates, len(rates) - 1, h) + margin(rates, cfg, h)


def forecast_new(rates: Sequence[float], cfg: LoanConfig, extra_s: float, kept: float) -> float:
    """F_new: the demand over the lead time plus `extra_s` (a new borrower's start-up), plus the
    margin the forecast `kept` (= F) holds above its level, so that a new loan is not recalled by
    a later forecast either; at least F."""
    if not rates or not cfg.predictive or extra_s <= 0:
        return kept
    h, h_new = horizon(cfg), horizon(cfg, extra_s)
    held_margin = kept - level(rates, len(rates) - 1, h)
    return max(kept, level(rates, len(rates) - 1, h_new) + margin(rates, cfg, h_new) + held_margin)


def planned_lead(leads: Sequence[float], cfg: LoanConfig) -> float:
    """The lead time a step plans with: `lead_s` until recalls have been measured (from the
    decision to Serve's wanted replicas RUNNING), then the ⌈(n + 1)(1 − risk)⌉-th smallest of the
    n measured (the conformal bound of the next one); while n is too small for that, the larger
    of `lead_s` and the longest measured. At most what the history can score: half of it."""
    if not leads:
        return cfg.lead_s
    ordered = sorted(leads)
    k = math.ceil((len(ordered) + 1) * (1.0 - cfg.risk) - 1e-9)
    lead = ordered[k - 1] if k <= len(ordered) else max(ordered[-1], cfg.lead_s)
    return min(lead, (cfg.history // 2 - 1) * cfg.interval_s)


def replicas_for(rps: float, cfg: LoanConfig) -> int:
    return max(cfg.min_replicas, math.ceil(rps / cfg.replica_rps - 1e-9)) if math.isfinite(rps) else 2**31


def decide_loan(rates: Sequence[float], pool_gpus: int, cfg: LoanConfig, *, min_loan_s: float = 0.0,
                ahead: Sequence[float] | None = None) -> LoanDecision:
    """How many of the pool's GPUs may be lent now (module docstring), and how many of them to a
    new borrower, whose loan must outlive its start-up (`min_loan_s`, its restart cost): those
    idle over the lead time plus `min_loan_s`. `ahead`: the coming intervals' demand when it is
    known (the simulator's oracle), used instead of the forecast."""
    if ahead is not None:  # clairvoyant: exactly the demand ahead, no floor of the present
        f = max(ahead[:horizon(cfg)], default=0.0)
        f_new = max(ahead[:horizon(cfg, min_loan_s)], default=0.0)
        replicas, fresh = replicas_for(f, cfg), replicas_for(f_new, cfg)
    else:
        f = forecast(rates, cfg)
        floor = replicas_for(float(rates[-1]) if rates else 0.0, cfg)
        replicas = max(replicas_for(f, cfg), floor)
        fresh = max(replicas_for(forecast_new(rates, cfg, min_loan_s, f), cfg), floor)
    replicas = min(pool_gpus, replicas)
    fresh = min(pool_gpus, max(replicas, fresh))
    return LoanDecision(forecast_rps=f, replicas=replicas, lendable=max(0, pool_gpus - replicas),
                        lendable_new=max(0, pool_gpus - fresh),
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
