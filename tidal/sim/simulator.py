"""A discrete-event simulator with a virtual clock for the scheduling policies.

It runs the live system's controller step (`tidal.core.controller.reconcile_step`) over the
live system's policy (`tidal.core.policy.decide`) or a baseline with the same signature;
only the executor is simulated:

* jobs arrive from a workload (`tidal.sim.workload`); the policy sees each job's options from
  the simulated planner's fitted model (`tidal.sim.views`), never the truth;
* a running job advances 1 / iter_time iterations per second, iter_time looked up in the
  measured tables (`tidal.sim.tables.Truth`) for the plan and the placement actually chosen;
* every start and every change of GPUs or plan costs `restart_s` of no progress (the Rubick
  setting: 260 s); a stopped (shrunk, moved or preempted) job releases its old GPUs at once
  and makes no progress until it is launched again;
* decisions are taken every `round_s` (the Rubick setting: 60 s; jobs that finish mid-round
  free their GPUs at the next round), or, with `round_s=None`, at every arrival and completion.

The per-node capacity is checked after every decision (`CapacityError` if ever exceeded).
Metrics: average and p99 JCT, makespan, average queueing delay (first start − arrival), GPU
utilisation (GPU-seconds held ÷ capacity × makespan), GPU-seconds left idle while a job waits
(`idle_while_waiting_gpu_s`), restarts per job, and guarantee violation, defined once for
every policy:

    guarantee_violation_s = Σ over guaranteed jobs of the seconds between the job's first start
                            and its completion during which it was stopped (preempted, waiting
                            to be relaunched), or held an allocation whose *true* throughput
                            is below its floor (restart time included)
    floor = the true throughput of the job's own plan on its requested GPUs, packed on the
            fewest nodes (the Rubick guarantee, at threshold 1.0)

Each violating second has one of three causes, reported apart (`guarantee_violation_<cause>_s`):
`stopped`; `spread`, an allocation below the floor over more nodes than its GPUs packed need
(the floor is measured packed); `model`, a packed allocation below the floor (the policy chose
an option the model over-predicted).

Waiting before the first start is admission control (queueing), not a violation; a restart
onto an allocation at or above the floor is a permitted reconfiguration. The threshold is 1.0,
not the Rubick artifact's 2/3: a job promised what it asked for should never run slower than
it would have on what it asked for (the artifact's 2/3 would count a job a third slower than
its request as served). Policies see only predictions, so a violation comes from preempting a
guaranteed job or from the model's error.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tidal.core import policy as tidal_policy
from tidal.core.controller import Policy, reconcile_step
from tidal.core.correction import CorrectionConfig, corrected, observe
from tidal.core.gcpause import paused_gc
from tidal.core.policy import Allocation, JobView, Node, Option, PolicyConfig, Snapshot
from tidal.core.state import JobState
from tidal.jobs.spec import Plan
from tidal.sim import baselines
from tidal.sim.records import ActiveJob, JobRecord, SimResult
from tidal.sim.serving import InferencePool, ServingSim
from tidal.sim.tables import Truth, packed
from tidal.sim.views import Kind
from tidal.sim.workload import SimJob, check_jobs


class World(Protocol):
    """The truth the simulated executor runs on (`tidal.sim.tables.Truth` for the Rubick traces)."""

    def apps(self) -> tuple[str, ...]: ...
    def global_batch(self, app: str) -> int: ...
    def plan_time(self, app: str, plan: Plan, gpus_per_node: tuple[int, ...]) -> float: ...
    def fastest(self, app: str, max_gpus: int) -> float: ...


class Views(Protocol):
    """What the policies are shown (`tidal.sim.views.SimPlanner`: a fitted model)."""

    def options(self, job: SimJob, kind: Kind) -> tuple[Option, ...]: ...
    def requested_throughput(self, job: SimJob) -> float: ...


VIOLATION_CAUSES = ("stopped", "spread", "model")  # module docstring


class CapacityError(AssertionError):
    """A decision placed more GPUs or CPUs on a node than it has."""


class StallError(RuntimeError):
    """Jobs are waiting, nothing runs, nothing arrives, and the policy starts nothing."""


@dataclass(frozen=True, kw_only=True)
class PolicyUnderTest:
    name: str
    kind: Kind  # what the policy is shown (tidal.sim.views)
    decide: Policy
    corrected: bool = False  # sees predictions corrected online (Tidal's scheduler does; baselines not)


POLICIES: dict[str, PolicyUnderTest] = {p.name: p for p in (
    PolicyUnderTest(name="fifo_static", kind="static", decide=baselines.fifo),
    PolicyUnderTest(name="tiresias", kind="static", decide=baselines.las),
    PolicyUnderTest(name="elastic", kind="elastic", decide=tidal_policy.decide, corrected=True),
    PolicyUnderTest(name="tuned_once", kind="tuned", decide=baselines.fifo),
    PolicyUnderTest(name="rubick", kind="co", decide=baselines.rubick),
    PolicyUnderTest(name="tidal", kind="co", decide=tidal_policy.decide, corrected=True),
)}


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    nodes: int = 8
    gpus_per_node: int = 8
    cpus_per_node: float = 96.0
    memory_per_node: float = 1600e9
    round_s: float | None = 60.0
    restart_s: float = 260.0
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # the live scheduler's defaults
    # online correction of each job's predictions by its true throughput, as the live scheduler
    # corrects by its runs' measured samples/s (None: off)
    correction: CorrectionConfig | None = field(default_factory=CorrectionConfig)

    @property
    def gpus(self) -> int:
        """The training cluster's GPUs."""
        return self.nodes * self.gpus_per_node


class Simulator:
    def __init__(self, jobs: list[SimJob], truth: World, planner: Views, policy: PolicyUnderTest,
                 config: SimConfig | None = None, serving: InferencePool | None = None) -> None:
        self.cfg = config or SimConfig()
        self.truth, self.planner, self.policy = truth, planner, policy
        self.jobs = sorted(jobs, key=lambda j: (j.submit, j.name))
        check_jobs(self.jobs, truth.apps(), self.cfg.gpus,
                   artifact_plans=isinstance(truth, Truth))
        self.nodes = tuple(Node(node_id=f"node-{i:03d}", gpus=self.cfg.gpus_per_node,
                                cpus=self.cfg.cpus_per_node, memory=self.cfg.memory_per_node)
                           for i in range(self.cfg.nodes))
        self._fastest: dict[str, float] = {}
        self.serving = None if serving is None else ServingSim(
            serving, self.cfg.restart_s,
            lambda job, plan, per_node: self.truth.plan_time(job.spec.app, plan, per_node))

    def _nodes(self) -> tuple[Node, ...]:
        """The training pool, plus the inference GPUs lent now (`tidal.sim.serving`)."""
        return self.nodes + (self.serving.nodes() if self.serving else ())

    # -- the executor, simulated --------------------------------------------------------

    def _admit(self, j: SimJob) -> ActiveJob:
        cap = self.cfg.gpus
        options = tuple(o for o in self.planner.options(j, self.policy.kind) if o.gpus <= cap)
        guarantee = floor = requested = None
        if j.is_sla:
            guarantee = self.planner.requested_throughput(j)
            requested = next(iter(self.planner.options(j, "static")), None)  # its own plan, requested GPUs
            assert requested is not None
            per_node = packed(j.num_gpus, self.cfg.gpus_per_node)
            floor = 1.0 / self.truth.plan_time(j.app, requested.plan, per_node)
        return ActiveJob(spec=j, options=options, guarantee=guarantee, true_floor=floor, requested=requested)

    def _view(self, job: ActiveJob, t: float) -> JobView:
        b = self.truth.global_batch(job.spec.app)
        running = job.phase is JobState.RUNNING
        # since its last launch: its own, or a reclaim's shrink (`tidal.sim.serving`)
        since = job.blocked_until - self.cfg.restart_s
        view = JobView(job_id=job.spec.name, arrival=job.spec.submit, options=job.options,
                       guarantee=job.guarantee, requested=job.requested,
                       current=job.alloc if running else None,
                       restarts=job.restarts, restart_cost_s=self.cfg.restart_s,
                       running_s=t - since if running else 0.0,
                       remaining_samples=max(0.0, job.spec.steps - job.iters) * b,
                       attained_gpu_s=job.attained, admitted=job.started is not None)
        return corrected(view, job.correction)

    def _rate(self, job: ActiveJob, alloc: Allocation) -> float:
        per_node = tuple(g for _, g in alloc.gpus_by_node)
        return 1.0 / self.truth.plan_time(job.spec.app, alloc.plan, per_node)

    def _check_capacity(self, active: dict[str, ActiveJob]) -> None:
        used: dict[str, int] = {}
        cpus: dict[str, float] = {}
        for job in active.values():
            if job.alloc is None:
                continue
            per_gpu = job.spec.num_cpus / job.spec.num_gpus
            for nid, g in job.alloc.gpus_by_node:
                used[nid] = used.get(nid, 0) + g
                cpus[nid] = cpus.get(nid, 0.0) + per_gpu * g
        for n in self._nodes():
            if used.get(n.node_id, 0) > n.gpus or cpus.get(n.node_id, 0.0) > n.cpus + 1e-6:
                raise CapacityError(f"{n.node_id}: {used.get(n.node_id, 0)} GPUs / "
                                    f"{cpus.get(n.node_id, 0):.0f} CPUs allocated, "
                                    f"capacity {n.gpus} / {n.cpus:.0f}")

    def _reconcile(self, t: float, active: dict[str, ActiveJob], result: SimResult) -> None:
        """The controller's steps at time t until it launches (or has nothing to do). A stop
        takes effect at once: the next step decides again."""
        for _ in range(4):
            phases = {k: j.phase for k, j in active.items()}
            snap = Snapshot(now=t, nodes=self._nodes(), jobs=tuple(self._view(j, t) for j in active.values()),
                            config=self.cfg.policy)
            t0 = time.perf_counter()
            with paused_gc():  # a round's garbage is freed by reference counting (`tidal.core.gcpause`)
                actions = reconcile_step(snap, phases, self.policy.decide)
            result.round_ms.append(1e3 * (time.perf_counter() - t0))
            for jid in actions.stop:
                job = active[jid]
                result.actions.append((t, "stop", jid, job.alloc.gpus_by_node if job.alloc else (), ""))
                job.phase, job.alloc, job.rate = JobState.QUEUED, None, 0.0
                result.timeline.append((t, jid, 0))
            for jid, alloc in actions.launch:
                job = active[jid]
                job.phase, job.alloc, job.rate = JobState.RUNNING, alloc, self._rate(job, alloc)
                job.blocked_until = t + self.cfg.restart_s
                if job.started is None:
                    job.started = t
                elif job.evicted:  # relaunched after a reclaim evicted it: Serve's restart, not the policy's
                    job.recalls += 1
                    job.evicted = False
                else:
                    job.restarts += 1
                result.actions.append((t, "launch", jid, alloc.gpus_by_node, alloc.plan.short()))
                result.timeline.append((t, jid, alloc.gpus))
            self._check_capacity(active)
            if not actions.stop:
                break

    @staticmethod
    def _violate(job: ActiveJob, cause: str, dt: float) -> None:
        job.violation_s += dt
        job.violation_by[cause] = job.violation_by.get(cause, 0.0) + dt

    def _advance(self, t0: float, t1: float, active: dict[str, ActiveJob], result: SimResult) -> None:
        for jid, job in list(active.items()):
            if job.phase is not JobState.RUNNING or job.alloc is None:
                if job.true_floor is not None and job.started is not None:
                    self._violate(job, "stopped", t1 - t0)  # stopped after its admission
                continue
            start = max(t0, job.blocked_until)
            end = t1
            if start < t1:
                need = (job.spec.steps - job.iters) / job.rate
                if need <= t1 - start + 1e-9:  # (t1 may be this job's own completion time)
                    end = start + need
                    job.iters = float(job.spec.steps)
                    job.finished = end
                else:
                    job.iters += (t1 - start) * job.rate
                if self.cfg.correction is not None and self.policy.corrected:  # the table's as measured
                    said = tidal_policy.predicted(job.options, job.requested, job.alloc)
                    job.correction = observe(job.correction, gpus=job.alloc.gpus, predicted=said,
                                             measured=job.rate * self.truth.global_batch(job.spec.app),
                                             dt=end - start, cfg=self.cfg.correction)
            if job.true_floor is not None and job.rate < job.true_floor * (1 - 1e-9):
                spread = len(job.alloc.gpus_by_node) > len(packed(job.alloc.gpus, self.cfg.gpus_per_node))
                self._violate(job, "spread" if spread else "model", end - t0)  # its restart too
            job.attained += job.alloc.gpus * (end - t0)
            if job.finished is not None:
                result.timeline.append((end, jid, 0))
                del active[jid]
                result.jobs.append(self._record(job))

    def _completion_time(self, t: float, active: dict[str, ActiveJob]) -> float:
        best = math.inf
        for job in active.values():
            if job.phase is JobState.RUNNING and job.rate > 0:
                best = min(best, max(t, job.blocked_until) + (job.spec.steps - job.iters) / job.rate)
        return best

    def _record(self, job: ActiveJob) -> JobRecord:
        app = job.spec.app
        if app not in self._fastest:
            self._fastest[app] = self.truth.fastest(app, self.cfg.gpus)
        assert job.started is not None and job.finished is not None
        return JobRecord(name=job.spec.name, app=app, submit=job.spec.submit, start=job.started,
                         finish=job.finished, restarts=job.restarts + job.recalls, steps=job.spec.steps,
                         isolated_s=self.cfg.restart_s + job.spec.steps * self._fastest[app],
                         violation_s=job.violation_s, violation_by=tuple(sorted(job.violation_by.items())))

    # -- the loop -----------------------------------------------------------------------

    def run(self, progress: Callable[[float, int, int], None] | None = None) -> SimResult:
        result = SimResult(policy=self.policy.name, jobs=[], timeline=[], actions=[], round_ms=[], metrics={})
        arrivals = deque(self.jobs)
        active: dict[str, ActiveJob] = {}
        rs = self.cfg.round_s
        t = 0.0 if rs else (arrivals[0].submit if arrivals else 0.0)
        decisions = 0
        while arrivals or active:
            while arrivals and arrivals[0].submit <= t:
                j = arrivals.popleft()
                active[j.name] = self._admit(j)
            if self.serving is not None:
                self.serving.before_round(t, active, result)
            if active:
                self._reconcile(t, active, result)
                decisions += 1
                if progress is not None and decisions % 200 == 0:
                    progress(t, len(result.jobs), len(self.jobs))
            nothing_runs = not any(j.phase is JobState.RUNNING for j in active.values())
            if active and nothing_runs and not arrivals:
                raise StallError(f"{len(active)} jobs wait at t={t:.0f} s and the policy starts none")
            if rs:
                t_next = t + rs
                if nothing_runs and arrivals:  # skip idle rounds
                    t_next = max(t_next, math.ceil(arrivals[0].submit / rs) * rs)
            else:
                t_next = min(arrivals[0].submit if arrivals else math.inf, self._completion_time(t, active))
                if not math.isfinite(t_next):
                    raise StallError(f"{len(active)} jobs wait at t={t:.0f} s and the policy starts none")
            if self.serving is not None:
                self.serving.serve(t, t_next, active)
            self._advance(t, t_next, active, result)
            t = t_next
        result.metrics = metrics(result, self.cfg.gpus)
        if self.serving is not None:
            end = max(j.finish for j in result.jobs)
            result.metrics.update(self.serving.metrics(
                held_gpu_s(result), self.cfg.gpus, end, len(result.jobs)))
        return result


def held_gpu_s(result: SimResult) -> float:
    """GPU-seconds the training jobs held (from the allocation timeline)."""
    held = 0.0
    last: dict[str, tuple[float, int]] = {}
    for t, jid, g in sorted(result.timeline, key=lambda x: x[0]):
        if jid in last:
            t0, g0 = last[jid]
            held += g0 * (t - t0)
        last[jid] = (t, g)
    return held


def idle_while_waiting_gpu_s(result: SimResult, capacity: int) -> float:
    """GPU-seconds of the training pool left idle while some arrived, unfinished job held no GPU
    (waiting to start, or stopped and not yet relaunched): capacity a work-conserving policy
    would have put to use, unless what waits cannot use it (too big for the idle GPUs, or a
    guaranteed job waiting for a packed placement).

        ∫ max(0, capacity − held(t)) · [some job waits at t] dt
    """
    events: list[tuple[float, int, str, int]] = []  # (time, order at a tie, job, GPUs held or ±1)
    for j in result.jobs:
        events += [(j.submit, 0, j.name, 1), (j.finish, 0, j.name, -1)]
    events += [(t, 1, jid, g) for t, jid, g in result.timeline]
    events.sort(key=lambda e: (e[0], e[1]))
    held: dict[str, int] = {}
    present: set[str] = set()
    total = waiting = 0  # GPUs held; present jobs holding none (kept as events come)
    idle, last = 0.0, events[0][0] if events else 0.0
    for t, kind, jid, x in events:
        if waiting:
            idle += max(0, capacity - total) * (t - last)
        last = t
        before = held.get(jid, 0)
        if kind == 1:  # the job holds x GPUs from now on
            held[jid] = x
            total += x - before
            if jid in present:
                waiting += (x == 0) - (before == 0)
        elif x > 0:  # arrives
            present.add(jid)
            waiting += before == 0
        else:  # finishes
            present.discard(jid)
            waiting -= before == 0
            total -= held.pop(jid, 0)
    return idle


def metrics(result: SimResult, capacity: int) -> dict[str, float]:
    jobs = result.jobs
    jct = np.array([j.jct for j in jobs])
    first = min(j.submit for j in jobs)
    makespan = max(j.finish for j in jobs) - first
    held = held_gpu_s(result)
    return {
        "avg_jct_s": float(jct.mean()),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "makespan_s": float(makespan),
        "avg_queue_s": float(np.mean([j.start - j.submit for j in jobs])),
        "gpu_util": float(held / (capacity * makespan)) if makespan > 0 else 0.0,
        "idle_while_waiting_gpu_s": idle_while_waiting_gpu_s(result, capacity),
        "restarts_per_job": float(np.mean([j.restarts for j in jobs])),
        "guarantee_violation_s": float(sum(j.violation_s for j in jobs)),
        **{f"guarantee_violation_{c}_s": float(sum(dict(j.violation_by).get(c, 0.0) for j in jobs))
           for c in VIOLATION_CAUSES},
        "jobs": float(len(jobs)),
    }
