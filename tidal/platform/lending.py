"""The live loan step's executor: what the scheduler observes of the inference pool, the pure
step (`tidal.serving.loanstep.loan_step`, the simulator's too), and its state kept in the store.

Each tick the scheduler reads Serve's wanted replicas (`tidal.serving.demand`) and passes them
here with the scheduled jobs and Ray's nodes. This module builds the step's view of the pool:
the inference nodes (label `tidal.io/pool=inference`), the GPUs Tidal's jobs hold there, the
borrowers a reclaim may shrink (RUNNING jobs with a live run; each loses about one step, its
checkpoint being taken at the stop), and the GPUs already on their way back (those of STOPPING
jobs). It returns the jobs the step reclaims, for the scheduler to stop at their next step
boundary with a checkpoint; the policy relaunches them on what is left. What is lent per node is
what the snapshot offers training on the inference nodes (`tidal.platform.capacity.build_nodes`).

**One brain with Serve.** Serve's demand is what `tidal.serving.demand.ServeDemand` reads: the
need Tidal's autoscaling policy publishes per deployment (`tidal.serving.autoscaling`), the
replica count of other deployments. Each tick the replicas the step keeps for Serve
(`LoanDecision.replicas`, while the forecast is finite) go back through `keep`, and Tidal's
deployments run that many warm: the GPUs kept for a forecast rise serve instead of idling.

The step's state (the demand history, the last loan, the measured lead times) is stored under
`LOAN_STATE`, so that a restarted scheduler forecasts from the history it had instead of
starting blind.

**Measured lead time.** Each reclaim is timed from its decision until Serve runs the replicas it
wanted then (or more); the time is an event, the metric `ray_tidal_recall_lead_seconds`, and a
sample of the lead time the step plans with (`tidal.serving.loans.planned_lead`). A recall not
answered within `LEAD_GIVE_UP_S` counts as that long.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidal.autoscaler.reclaim import Borrower
from tidal.platform.capacity import held_by_node, pool_of
from tidal.platform.metrics import Metrics
from tidal.platform.store import JobRecord, JobState, Store, StoreWriteError
from tidal.serving.loans import LoanConfig, planned_lead
from tidal.serving.loanstep import LoanState, PoolNow, loan_step

log = logging.getLogger("tidal.scheduler")
LOAN_STATE = "loan_state"  # the store's key for `LoanState.to_dict()`
LEAD_GIVE_UP_S = 600.0  # a recall still unanswered after this long is recorded as this long


@dataclass(frozen=True)
class _Recall:
    at: float  # when the reclaim was decided
    want: int  # the replicas Serve wanted then: it is answered once that many run


class Lending:
    """The loan step's state and its tick."""

    def __init__(self, cfg: LoanConfig, metrics: Metrics, store: Store,
                 event: Callable[[str], None] = log.info,
                 keep: Callable[[int | None], None] | None = None) -> None:
        self.cfg, self.metrics, self.store, self.event = cfg, metrics, store, event
        self.keep = keep  # told each tick the replicas the step keeps for Serve (module docstring)
        self.recalls: list[_Recall] = []  # reclaims whose replicas Serve does not run yet
        self.loan = LoanState()
        if kept := store.measured(LOAN_STATE):
            try:
                self.loan = LoanState.from_dict(kept)
            except ValueError as e:  # a damaged record costs the history, never the scheduler
                log.warning("%s; the loan step starts without history (the store's key %r is "
                            "rewritten at the next change)", e, LOAN_STATE)
        self.stored = self.loan  # what the store holds: a tick that changes nothing writes nothing
        self.state: dict[str, Any] = {}  # the last loan as `Scheduler.pools` shows it; {} without a pool

    def step(self, recs: list[JobRecord], ray_nodes: list[dict[str, Any]],
             serve_demand: Callable[[], float], has_run: Callable[[str], bool], restart_s: float,
             step_s: Callable[[JobRecord], float], *, now: float | None = None,
             serve_running: Callable[[], int] | None = None) -> list[tuple[JobRecord, str]]:
        """One tick over the scheduled jobs `recs`: the jobs to stop, each with why.
        `serve_demand`: Serve's wanted replicas now (read only where there is an inference pool);
        `has_run`: whether a job's run is live; `restart_s`: what a borrower's restart costs;
        `step_s`: a job's seconds per step (the work a reclaim loses); `now` and
        `serve_running` (Serve's RUNNING replicas): given, recalls are timed (module docstring)."""
        pool = {n["NodeID"]: int(n["Resources"].get("GPU", 0)) for n in ray_nodes
                if n.get("Alive") and pool_of(n) == "inference" and n["Resources"].get("GPU", 0) >= 1}
        if not pool:
            self.state = {}
            self._tell(None)
            return []
        demand = float(serve_demand())
        live = [r for r in recs if r.state in (JobState.RUNNING, JobState.STOPPING)]
        held = {nid: int(h.gpus) for nid, h in held_by_node((r.allocation for r in live), 0.0).items()
                if nid in pool}
        returning = sum(int(g) for r in live if r.state is JobState.STOPPING
                        for nid, g in r.allocation or [] if nid in pool)
        borrowers = []
        for r in live:
            lent = tuple((nid, int(g)) for nid, g in r.allocation or [] if nid in pool)
            if r.state is not JobState.RUNNING or not lent or not has_run(r.job_id):
                continue
            borrowers.append(Borrower(job_id=r.job_id, gpus=sum(int(g) for _, g in r.allocation or []),
                                      lent_by_node=lent, options=tuple(o.gpus for o in r.options),
                                      lost_s=step_s(r), restart_s=restart_s or 30.0))
        leads = self._answered(now, serve_running) if now is not None and serve_running else ()
        observed = PoolNow(pool=pool, demand=demand, held=held, borrowers=tuple(borrowers),
                           returning=returning, min_loan_s=restart_s, leads=leads)
        step, self.loan = loan_step(self.loan, observed, self.cfg)
        d = step.decision
        self._tell(d.replicas if d is not None and math.isfinite(d.forecast_rps) else None)
        if step.reclaims and now is not None:
            self.recalls.append(_Recall(at=now, want=math.ceil(demand)))
        self._keep()
        by_id = {r.job_id: r for r in recs}
        stops = []
        for pick in step.reclaims:
            self.metrics.reclaims.inc(tags={"job": pick.job_id})
            why = (f"reclaim: Serve needs {demand:.1f} replicas, {step.lendable} GPUs "
                   f"lendable; gives back {dict(pick.freed_by_node)}, "
                   f"resumes on {pick.keep_gpus or 'no'} GPUs")
            stops.append((by_id[pick.job_id], why))
        total, lendable = sum(pool.values()), max(0, min(step.lendable, sum(pool.values())))
        self.state = {"lead_s": planned_lead(self.loan.leads, self.cfg),
                      "lent": step.lent, "lendable": lendable, "pool_gpus": total, "serve_replicas": demand,
                      "forecast": _finite(step.decision.forecast_rps if step.decision else 0.0),
                      "risk": self.loan.risk, "held": sum(held.values()),
                      "history": len(self.loan.demand)}  # Serve's demand samples the step has
        self.metrics.pool_gpus.set(total, tags={"pool": "inference", "kind": "total"})
        self.metrics.pool_gpus.set(lendable, tags={"pool": "inference", "kind": "lendable"})
        self.metrics.pool_gpus.set(sum(held.values()), tags={"pool": "inference", "kind": "lent"})
        return stops

    def _answered(self, now: float, serve_running: Callable[[], int]) -> tuple[float, ...]:
        """The lead times of the open recalls Serve has answered (or given up on) by now."""
        if not self.recalls:
            return ()
        running = int(serve_running())
        done = [r for r in self.recalls if running >= r.want or now - r.at >= LEAD_GIVE_UP_S]
        self.recalls = [r for r in self.recalls if r not in done]
        leads = tuple(min(now - r.at, LEAD_GIVE_UP_S) for r in done)
        for lead in leads:
            self.metrics.recall_lead_s.set(lead)
            plan = planned_lead((*self.loan.leads, lead), self.cfg)
            self.event(f"recall answered: Serve runs its replicas {lead:.1f} s after the reclaim "
                       f"(the loan step plans with a lead of {plan:.0f} s)")
        return leads

    def _tell(self, kept: int | None) -> None:
        """Tell Serve's side the replicas kept for it (None: the demand is not bounded yet); a
        failure costs this tick's floors, which expire on their own (`autoscaling.FLOOR_TTL_S`)."""
        if self.keep is None:
            return
        try:
            self.keep(kept)
        except Exception as e:  # the loan step must not stop on Serve's side
            log.warning("Serve's floors not published: %s", e)

    def _keep(self) -> None:
        """Store the step's state if it changed (a refused write is logged: the next tick stores
        it again). Steady demand leaves it as it is: no write per tick on an idle pool."""
        if self.loan == self.stored:
            return
        try:
            self.store.set_measured(LOAN_STATE, self.loan.to_dict())
            self.stored = self.loan
        except StoreWriteError as e:
            log.warning("loan state not stored: %s", e)


def _finite(x: float) -> float | None:
    """A forecast as JSON shows it: None while the history cannot bound the demand (∞)."""
    return x if math.isfinite(x) else None
