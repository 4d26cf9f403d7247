"""The live loan step: Serve's demand → inference GPUs lendable to training → reclaims.

Each tick Serve's wanted replicas (`tidal.serving.demand`) join the demand history; the loan
decision (`tidal.serving.loans.decide_loan`, a forecast over the reclaim lead time) says how many
inference GPUs training may hold. If Tidal's jobs hold more, the least-cost reclaim
(`tidal.autoscaler.reclaim.choose_reclaim`) names the jobs to stop at their next step boundary
with a checkpoint; the policy relaunches them on what is left. While a job is still stopping
nothing more is reclaimed (its GPUs are on their way back). What is lent, per node
(`lend_by_node`), is what the snapshot offers training on the inference nodes
(`tidal.platform.capacity.build_nodes`).

The simulator runs the same sequence (`tidal.sim.serving.InferencePool.before_round`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from tidal.autoscaler.reclaim import Borrower, choose_reclaim
from tidal.platform.capacity import held_by_node, pool_of
from tidal.platform.metrics import Metrics
from tidal.platform.store import JobRecord, JobState
from tidal.serving.loans import LoanConfig, decide_loan, lend_by_node


class Lending:
    """The loan manager's state (Serve's demand history, the last loan) and its tick."""

    def __init__(self, cfg: LoanConfig, metrics: Metrics) -> None:
        self.cfg, self.metrics = cfg, metrics
        self.demand: deque[float] = deque(maxlen=120)  # Serve's wanted replicas, one per tick
        self.state: dict[str, Any] = {}  # the last loan (`Scheduler.pools`); {} without an inference pool

    def step(self, recs: list[JobRecord], ray_nodes: list[dict[str, Any]], has_run: Callable[[str], bool],
             restart_s: float) -> list[tuple[JobRecord, str]]:
        """One tick over the scheduled jobs `recs`: the jobs to stop (each with why) so that
        training holds no more inference GPUs than are lendable. `has_run`: whether a job's run is
        live; `restart_s`: what a borrower's restart costs (`Borrower.restart_s`)."""
        from tidal.serving.demand import current_demand

        pool = {n["NodeID"]: int(n["Resources"].get("GPU", 0)) for n in ray_nodes
                if n.get("Alive") and pool_of(n) == "inference" and n["Resources"].get("GPU", 0) >= 1}
        if not pool:
            self.state = {}
            return []
        self.demand.append(float(current_demand()))
        total = sum(pool.values())
        decision = decide_loan(list(self.demand), total, self.cfg)
        live = [r.allocation for r in recs if r.state in (JobState.RUNNING, JobState.STOPPING)]
        held = {nid: int(h.gpus) for nid, h in held_by_node(live, 0.0).items() if nid in pool}
        need = sum(held.values()) - decision.lendable
        stopping = any(r.state is JobState.STOPPING for r in recs)
        stops: list[tuple[JobRecord, str]] = []
        if need > 0 and not stopping:
            borrowers = []
            for r in recs:
                lent = tuple((nid, int(g)) for nid, g in r.allocation or [] if nid in pool)
                if r.state is not JobState.RUNNING or not lent or not has_run(r.job_id):
                    continue
                gpus = sum(int(g) for _, g in r.allocation or [])
                borrowers.append(Borrower(job_id=r.job_id, gpus=gpus, lent_by_node=lent,
                                          options=tuple(o.gpus for o in r.options),
                                          restart_s=restart_s or 30.0))
            by_id = {r.job_id: r for r in recs}
            for pick in choose_reclaim(borrowers, need):
                self.metrics.reclaims.inc(tags={"job": pick.job_id})
                why = (f"reclaim: Serve wants {self.demand[-1]:.0f} replicas, {decision.lendable} GPUs "
                       f"lendable; gives back {dict(pick.freed_by_node)}, "
                       f"resumes on {pick.keep_gpus or 'no'} GPUs")
                stops.append((by_id[pick.job_id], why))
        lendable = max(0, min(decision.lendable, total))
        self.state = {"lent": lend_by_node(pool, lendable, held), "lendable": lendable, "pool_gpus": total,
                      "serve_replicas": self.demand[-1], "forecast": decision.forecast_rps,
                      "risk": decision.recall_risk, "held": sum(held.values())}
        self.metrics.pool_gpus.set(total, tags={"pool": "inference", "kind": "total"})
        self.metrics.pool_gpus.set(lendable, tags={"pool": "inference", "kind": "lendable"})
        self.metrics.pool_gpus.set(sum(held.values()), tags={"pool": "inference", "kind": "lent"})
        return stops
