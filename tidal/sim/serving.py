"""The inference pool in the simulator: Serve's demand, GPUs lent to training, and reclaims.

Four arms run the same training policy (`tidal.core.policy.decide`) and differ only here:

* `none`    no loaning: the inference pool serves alone; training sees the training pool only.
* `evict`   Kueue-style cohort borrowing: training may hold whatever inference GPUs are idle
            *now* (no forecast, no headroom); when Serve needs them back, whole borrowing jobs
            are evicted, most recently admitted first (`tidal.autoscaler.reclaim.evict_newest`),
            and lose the work since their last periodic checkpoint.
* `shrink`  Tidal: the loan manager lends what the *forecast* demand leaves idle for the
            reclaim lead time (`tidal.serving.loans`), and a reclaim takes the least-cost lent
            GPUs (`tidal.autoscaler.reclaim.choose_reclaim`): the affected jobs checkpoint at a
            step boundary (one step lost) and restart on fewer GPUs, or stop if they cannot.
* `oracle`  `shrink` with a clairvoyant loan manager: it knows the demand until a reclaim decided
            at the next round takes effect (`PoolNow.ahead`) and lends the rest, the most any
            forecast could lend without a shortfall (what `lent_capture` divides by).

Every round (the simulator's `round_s`, equal to the loan interval) the pool first decides the
loan from the demand of the intervals so far, reclaims if training holds more than is lendable,
then hands the scheduler's snapshot one `Node(pool="inference", recallable=True)` per inference
node with the GPUs lent there. A GPU training gives up at t (`LoanStep.given_back`) serves from
t + `reclaim_s` (stop + a replica's start); until then it is neither training nor serving. A
reclaim decided at a round charges nothing of the round's demand it could not see: the loan step
sees the intervals before the current one.

**Wasted loans**: a job (re)launched on lent GPUs counts one loan; a reclaim that hits it while it
still restarts (before its first step on the loan) wastes it (`wasted_loans` = wasted ÷ loans).

**Serving accounting.** In interval k the demand is d_k requests/s; the replicas up are
u(t) = pool − GPUs training holds on inference nodes − reclaimed GPUs not yet up. Requests over
the SLO in [a, b) = max(0, d_k − u · replica_rps) · (b − a) (what exceeds the replicas' capacity
at the SLO waits past it); Serve's GPUs in use = min(u, ⌈d_k / replica_rps⌉). The invariant that
no GPU is held by Serve and training at once is checked every round (`ServingError`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from tidal.autoscaler.reclaim import Borrower, Reclaim, choose_reclaim, evict_newest
from tidal.core.policy import Allocation, Node
from tidal.core.state import JobState
from tidal.jobs.spec import Plan
from tidal.serving.loans import LoanConfig, horizon
from tidal.serving.loanstep import LoanState, PoolNow, Reclaimer, loan_step
from tidal.sim.records import ActiveJob, SimResult

Mode = Literal["none", "evict", "shrink", "oracle"]


class ServingError(AssertionError):
    """A GPU was held by Serve and by training at once."""


@dataclass(frozen=True, kw_only=True)
class InferencePool:
    rates: tuple[float, ...]  # requests/s per loan interval (wraps around past the end)
    loan: LoanConfig
    mode: Mode = "shrink"
    nodes: int = 4
    gpus_per_node: int = 8
    reclaim_s: float = 30.0  # a reclaimed GPU serves this long after the reclaim
    ckpt_interval_s: float = 600.0  # periodic checkpoints: what an eviction rolls back to


@dataclass(kw_only=True)
class ServingStats:
    requests: float = 0.0
    over_slo: float = 0.0
    serving_gpu_s: float = 0.0
    lent_gpu_s: float = 0.0
    reclaims: int = 0
    preemptions: int = 0  # jobs stopped or shrunk by a reclaim
    loans: int = 0  # (re)launches of a job on lent GPUs
    wasted: int = 0  # reclaims of a job still restarting (before its first step on the loan)
    reclaimed_gpus: int = 0
    timeline: list[tuple[float, int, int, float]] = field(default_factory=list)  # t, up, lent, demand


class ServingSim:
    def __init__(self, pool: InferencePool, restart_s: float,
                 iter_time: Callable[[ActiveJob, Plan, tuple[int, ...]], float]) -> None:
        self.pool, self.restart_s, self.iter_time = pool, restart_s, iter_time
        self.node_ids = tuple(f"inf-{i:03d}" for i in range(pool.nodes))
        self.lent = {nid: 0 for nid in self.node_ids}
        self.pending: list[tuple[float, int]] = []  # (time up, GPUs) of reclaimed GPUs
        self.stats = ServingStats()
        self.total = pool.nodes * pool.gpus_per_node
        self.risk = 1.0
        self.state = LoanState()  # the loan step's (`tidal.serving.loanstep`)
        self.on_loan: dict[str, Allocation] = {}  # job → the allocation it was lent GPUs under

    def rate(self, t: float) -> float:
        r = self.pool.rates
        return r[int(t // self.pool.loan.interval_s) % len(r)]

    def _held(self, active: dict[str, ActiveJob]) -> dict[str, int]:
        held = {nid: 0 for nid in self.node_ids}
        for j in active.values():
            if j.alloc is not None:
                for nid, g in j.alloc.gpus_by_node:
                    if nid in held:
                        held[nid] += g
        return held

    # -- before the scheduler's step ------------------------------------------------------

    def nodes(self) -> tuple[Node, ...]:
        if self.pool.mode == "none":
            return ()
        return tuple(Node(node_id=nid, gpus=self.lent[nid], pool="inference", recallable=True,
                          recall_risk=self.risk) for nid in self.node_ids)

    def before_round(self, t: float, active: dict[str, ActiveJob], result: SimResult) -> None:
        """The loan step (`tidal.serving.loanstep.loan_step`, the live scheduler's) on the demand
        of the intervals so far; its reclaims take effect at once (`_apply`)."""
        if self.pool.mode == "none":
            return
        cfg = self.pool.loan
        if self.pool.mode == "oracle":  # it knows the true lead time too
            cfg = replace(cfg, lead_s=self.pool.reclaim_s)
        k = int(t // cfg.interval_s)
        seen = [self.pool.rates[i % len(self.pool.rates)] for i in range(max(0, k - cfg.history), k)]
        held = self._held(active)
        borrowers = []
        for jid, j in active.items():
            lent = tuple((nid, g) for nid, g in (j.alloc.gpus_by_node if j.alloc else ()) if nid in held)
            if not lent or j.alloc is None:
                continue
            borrowers.append(Borrower(job_id=jid, gpus=j.alloc.gpus, lent_by_node=lent,
                                      options=tuple(o.gpus for o in j.options),
                                      lost_s=1.0 / max(j.rate, 1e-9), restart_s=self.restart_s))
        now = PoolNow(pool={nid: self.pool.gpus_per_node for nid in self.node_ids},
                      demand=seen[-1] if seen else None, held=held, borrowers=tuple(borrowers),
                      starting=sum(g for u, g in self.pending if u > t), min_loan_s=self.restart_s,
                      ahead=self._ahead(k, cfg))
        started = {jid: (j.started or 0.0) for jid, j in active.items()}
        reclaim: Reclaimer = (lambda bs, need: evict_newest(bs, need, started)) if self.pool.mode == "evict" \
            else choose_reclaim
        # the trace is known: the history is the window before this interval, whatever rounds ran
        step, self.state = loan_step(replace(self.state, demand=tuple(seen[:-1])), now, cfg, reclaim)
        self.risk = self.state.risk
        if step.reclaims:
            for r in step.reclaims:
                self.stats.wasted += t < active[r.job_id].blocked_until
                self._apply(t, active[r.job_id], r, result)
            self.stats.reclaims += 1
            self.stats.reclaimed_gpus += sum(r.freed for r in step.reclaims)
            self.pending.append((t + self.pool.reclaim_s, step.given_back))
        self.lent = step.lent

    def _ahead(self, k: int, cfg: LoanConfig) -> tuple[float, ...] | None:
        """The oracle's knowledge at round k: the demand of intervals k, k + 1, … for as long as
        a new loan must last (`tidal.serving.loans.horizon`); the loan step keeps the busiest of
        the first H, until a reclaim decided at round k + 1 serves."""
        if self.pool.mode != "oracle":
            return None
        h = horizon(cfg, self.restart_s)  # cfg: the oracle's, with the true lead time
        return tuple(self.pool.rates[i % len(self.pool.rates)] for i in range(k, k + h))

    def _apply(self, t: float, job: ActiveJob, r: Reclaim, result: SimResult) -> None:
        """Shrink (graceful: checkpoint at the step boundary) or evict the job."""
        assert job.alloc is not None
        self.stats.preemptions += 1
        jid = job.spec.name
        result.actions.append((t, "stop", jid, job.alloc.gpus_by_node, ""))
        if self.pool.mode == "evict":  # killed: back to its last periodic checkpoint
            ran = max(0.0, t - job.blocked_until)
            job.iters = max(0.0, job.iters - job.rate * (ran % self.pool.ckpt_interval_s))
        if r.keep_gpus == 0:
            job.evicted = True  # its relaunch counts as a recall, not against the restart limit
            job.phase, job.alloc, job.rate = JobState.QUEUED, None, 0.0
            result.timeline.append((t, jid, 0))
            return
        left = dict(job.alloc.gpus_by_node)
        for nid, g in r.freed_by_node:
            left[nid] -= g
        surplus = sum(left.values()) - r.keep_gpus
        for nid in sorted(left, key=lambda n: (n not in self.lent, -left[n])):  # lent GPUs go first
            take = min(surplus, left[nid])
            left[nid] -= take
            surplus -= take
        option = next(o for o in job.options if o.gpus == r.keep_gpus)
        alloc = Allocation(gpus_by_node=tuple(sorted((n, g) for n, g in left.items() if g > 0)),
                           plan=option.plan)
        job.alloc = alloc
        per_node = tuple(g for _, g in alloc.gpus_by_node)
        job.rate = 1.0 / self.iter_time(job, alloc.plan, per_node)
        job.blocked_until = t + self.restart_s
        job.recalls += 1  # forced by Serve: not counted against the policy's restart limit
        result.actions.append((t, "launch", jid, alloc.gpus_by_node, alloc.plan.short()))
        result.timeline.append((t, jid, alloc.gpus))

    # -- after the scheduler's step: serve the round --------------------------------------

    def serve(self, t0: float, t1: float, active: dict[str, ActiveJob]) -> None:
        held = self._held(active)
        for jid, j in active.items():  # count the loans the scheduler's step made
            if j.alloc is not None and any(nid in held for nid, _ in j.alloc.gpus_by_node):
                if self.on_loan.get(jid) is not j.alloc:
                    self.stats.loans += 1
                    self.on_loan[jid] = j.alloc
            else:
                self.on_loan.pop(jid, None)
        for jid in set(self.on_loan) - set(active):  # ended
            del self.on_loan[jid]
        for nid in self.node_ids:
            if self.pool.mode != "none" and held[nid] > self.lent[nid]:
                raise ServingError(f"{nid}: training holds {held[nid]} GPUs, {self.lent[nid]} lent")
        train = sum(held.values())
        cuts = sorted({t0, t1, *(u for u, _ in self.pending if t0 < u < t1)})
        iv = self.pool.loan.interval_s
        bounds = (k * iv for k in range(math.ceil(t0 / iv), math.ceil(t1 / iv)) if t0 < k * iv < t1)
        cuts = sorted({*cuts, *bounds})
        rps = self.pool.loan.replica_rps
        for a, b in itertools.pairwise(cuts):
            waiting = sum(g for u, g in self.pending if u > a)
            up = self.total - train - waiting
            if up < 0:
                raise ServingError(f"t={a:.0f}: {train} GPUs training + {waiting} starting > {self.total}")
            d = self.rate(a)
            self.stats.requests += d * (b - a)
            self.stats.over_slo += max(0.0, d - up * rps) * (b - a)
            self.stats.serving_gpu_s += min(up, math.ceil(d / rps - 1e-9)) * (b - a)
            self.stats.lent_gpu_s += train * (b - a)
        self.stats.timeline.append((t0, self.total - train, train, self.rate(t0)))
        self.pending = [(u, g) for u, g in self.pending if u > t1]

    def metrics(self, train_gpu_s: float, train_gpus: int, end_s: float, jobs: int) -> dict[str, float]:
        """Serving and whole-cluster figures over [0, end_s] (end_s: the last job's finish).

        gpu_util_all = (training GPU-s + Serve's GPU-s in use) ÷ (all GPUs · end_s)."""
        st = self.stats
        return {
            "slo_violation_rate": st.over_slo / st.requests if st.requests else 0.0,
            "gpu_util_all": (train_gpu_s + st.serving_gpu_s) / ((train_gpus + self.total) * end_s),
            "lent_gpu_s": st.lent_gpu_s,
            "reclaims": float(st.reclaims),
            "preemptions_per_job": st.preemptions / max(1, jobs),
            "wasted_loans": st.wasted / st.loans if st.loans else 0.0,
        }
