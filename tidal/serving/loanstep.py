"""One loan step for the live scheduler and the simulator: state in, decision and new state out.

    loan_step(state, observed, cfg) -> (LoanStep, LoanState)

as Ray Serve's autoscaling policies return their state. No Ray, no clock: the live scheduler
(`tidal.platform.lending`) and the simulator (`tidal.sim.serving`) each observe the inference
pool their own way (`PoolNow`) and apply what the step returns their own way (the live one asks
the named jobs to stop at their next step boundary, the simulator shrinks them at once); the
step between is this one function, so the simulator's loans are the live system's.

One step, once per loan interval:

0. recalls the executor measured since the last step (`PoolNow.leads`: from a reclaim's decision
   to Serve's wanted replicas RUNNING) join the state's; the step plans with the lead time they
   bound (`tidal.serving.loans.planned_lead`), `LoanConfig.lead_s` until there are any;
1. the interval's demand (in the units of `LoanConfig.replica_rps`: requests/s, or replicas
   for the live scheduler, whose `replica_rps` is 1) joins the history, which keeps the last
   `LoanConfig.history` intervals;
2. the loan decision (`tidal.serving.loans.decide_loan`) says how many of the pool's GPUs
   training may hold until a reclaim decided now has taken effect (`lendable`), and how many a
   borrower may newly be lent (`lendable_new`: idle for its start-up too, `PoolNow.min_loan_s`,
   so that no loan is recalled before the borrower's first step);
3. if training holds more than `lendable`, less what is already on its way back (GPUs of jobs
   asked to stop, `PoolNow.returning`), the reclaim (`reclaim`: by default the least-cost one,
   `tidal.autoscaler.reclaim.choose_reclaim`) names the borrowers to shrink or stop;
4. what is lent per node (`lend_by_node`): what training still holds after the reclaim (a
   reclaim that cannot free enough leaves the rest lent, not double-counted), or
   `lendable_new` if more, at most the pool less the GPUs given back to Serve by earlier steps
   and not serving yet (`PoolNow.starting`). What training gives up this step is on its way to
   Serve (`LoanStep.given_back`); a stopped job's GPUs beyond the shortfall may be lent again.

The decisions the two executors used to make differently, and how they are made here: a reclaim
while a job stops takes only what the stopping jobs do not already give back (the live
scheduler took nothing, the simulator did not wait); GPUs on their way to Serve are not lent
again (the simulator's rule; the live scheduler's Serve counts a replica that waits for a GPU
in its wanted replicas, so it passes none), and only those training gives up are on their way;
a borrower's lost work is one step (`lost_s`) in both; the history is `LoanConfig.history`
intervals in both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tidal.autoscaler.reclaim import Borrower, Reclaim, choose_reclaim
from tidal.serving.loans import LoanConfig, LoanDecision, decide_loan, lend_by_node, planned_lead

Reclaimer = Callable[[Sequence[Borrower], int], Sequence[Reclaim]]


@dataclass(frozen=True, kw_only=True)
class LoanState:
    """What the loan manager remembers between steps (stored by the live scheduler, so that a
    restarted one does not start blind)."""

    demand: tuple[float, ...] = ()  # one sample per interval, oldest first
    lent: Mapping[str, int] = field(default_factory=dict)  # GPUs lent per inference node
    risk: float = 1.0  # the chance a lent GPU is recalled soon (`LoanDecision.recall_risk`)
    leads: tuple[float, ...] = ()  # measured recalls' lead times, s (the last `LEADS_KEPT`)

    def to_dict(self) -> dict[str, Any]:
        return {"demand": list(self.demand), "lent": dict(self.lent), "risk": self.risk,
                "leads": list(self.leads)}

    @classmethod
    def from_dict(cls, d: Any) -> LoanState:
        """The state `to_dict` wrote; ValueError naming the first field that is not what it wrote
        (a list of finite non-negative numbers, a mapping of node → GPUs, a risk in [0, 1])."""
        if not isinstance(d, Mapping):
            raise ValueError(f"loan state: expected a mapping, got {type(d).__name__}")

        def numbers(name: str) -> tuple[float, ...]:
            xs = d.get(name, ())
            if not isinstance(xs, (list, tuple)) or not all(_amount(x) for x in xs):
                raise ValueError(f"loan state: {name} must be a list of non-negative numbers, got {xs!r:.80}")
            return tuple(float(x) for x in xs)

        lent, risk = d.get("lent", {}), d.get("risk", 1.0)
        if not isinstance(lent, Mapping) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                    for v in lent.values()):
            raise ValueError(f"loan state: lent must map nodes to GPU counts, got {lent!r:.80}")
        if not _amount(risk) or risk > 1:
            raise ValueError(f"loan state: risk must be a number in [0, 1], got {risk!r:.80}")
        return cls(demand=numbers("demand"), lent={str(k): int(v) for k, v in lent.items()},
                   risk=float(risk), leads=numbers("leads"))


def _amount(x: Any) -> bool:
    """A finite non-negative number (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


LEADS_KEPT = 20


@dataclass(frozen=True, kw_only=True)
class PoolNow:
    """What the executor observed of the inference pool this interval."""

    pool: Mapping[str, int]  # inference node → its GPUs
    demand: float | None  # the interval's demand; None: nothing observed yet (lend nothing)
    held: Mapping[str, int]  # GPUs training holds per inference node (stopping jobs' included)
    borrowers: tuple[Borrower, ...] = ()  # running jobs holding lent GPUs, and not asked to stop
    returning: int = 0  # lent GPUs held by jobs already asked to stop: on their way back
    starting: int = 0  # GPUs given back to Serve and not serving yet: not lendable
    min_loan_s: float = 0.0  # a new borrower's start-up (its restart cost): a loan must outlive it
    leads: tuple[float, ...] = ()  # recalls measured since the last step: decision → replicas RUNNING, s
    # the demand of the coming intervals when it is known (the simulator's oracle arm, never the
    # live scheduler): the decision keeps exactly that instead of a forecast
    ahead: tuple[float, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class LoanStep:
    decision: LoanDecision | None  # None: no demand observed yet
    reclaims: tuple[Reclaim, ...]  # the borrowers to shrink or stop
    lent: dict[str, int]  # what training may hold per inference node from now on
    held_after: int  # GPUs training holds on the pool once the reclaims have taken effect
    given_back: int = 0  # GPUs the reclaims move to Serve (not lent again): serving after the lead time

    @property
    def lendable(self) -> int:
        return self.decision.lendable if self.decision is not None else 0


def loan_step(state: LoanState, now: PoolNow, cfg: LoanConfig,
              reclaim: Reclaimer = choose_reclaim) -> tuple[LoanStep, LoanState]:
    """One step of the module docstring."""
    demand = state.demand if now.demand is None else (*state.demand, float(now.demand))[-cfg.history:]
    leads = (*state.leads, *now.leads)[-LEADS_KEPT:]
    cfg = replace(cfg, lead_s=planned_lead(leads, cfg))
    total = sum(now.pool.values())
    decision = (decide_loan(demand, total, cfg, min_loan_s=now.min_loan_s, ahead=now.ahead)
                if demand else None)
    lendable = decision.lendable if decision is not None else 0
    fresh = decision.lendable_new if decision is not None else 0
    held = {nid: int(now.held.get(nid, 0)) for nid in now.pool}
    need = sum(held.values()) - now.returning - lendable
    picks: tuple[Reclaim, ...] = tuple(reclaim(now.borrowers, need)) if need > 0 else ()
    for r in picks:
        for nid, g in r.freed_by_node:
            held[nid] -= g
    held_after = sum(held.values())
    # training keeps what it holds up to `lendable`; new loans only up to `lendable_new`; GPUs on
    # their way to Serve from earlier steps are not lent again
    lent_total = min(max(fresh, held_after), total - now.starting)
    lent = lend_by_node(now.pool, lent_total, held)
    # what training gives up (not what the reclaims free: a stopped job's GPUs beyond the
    # shortfall may be lent again at once) is on its way to Serve until the lead time has passed
    given_back = max(0, sum(int(now.held.get(nid, 0)) for nid in now.pool) - now.returning - lent_total)
    risk = decision.recall_risk if decision is not None else 1.0
    return (LoanStep(decision=decision, reclaims=picks, lent=lent, held_after=held_after,
                     given_back=min(given_back, sum(r.freed for r in picks))),
            LoanState(demand=demand, lent=lent, risk=risk, leads=leads))
