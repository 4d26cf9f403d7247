"""The Tidal scheduler: a named, detached Ray actor (`tidal-scheduler` in namespace `tidal`).

It holds the queue and the running jobs, persists them in SQLite (`tidal.platform.store`), and
every `tick_s` runs one reconcile step — an explicit controller loop:

    1. collect runs that ended: SUCCEEDED, FAILED (error kept), or back to QUEUED with their
       checkpoint (a reconfiguration or a preemption);
    2. if a job is still STOPPING, wait: its GPUs are not free yet;
    3. snapshot the cluster (alive nodes with GPUs, CPUs, memory) and the jobs, and call the
       pure policy `decide(snapshot)`;
    4. apply only the difference (`tidal.platform.controller.reconcile_step`, the step the
       simulator runs too): running jobs whose allocation or plan changes are asked to
       stop at their next step boundary with a checkpoint (→ STOPPING); when nothing is
       stopping, queued jobs with an allocation are launched on exactly the nodes the decision
       names (`Resources.node_ids`) from their checkpoint (→ RUNNING).

A restarted actor (`max_restarts=-1`) reopens the store: jobs it had RUNNING or STOPPING lost
their runs with the old actor (Ray Train's controller and workers are owned by it), so they
return to QUEUED from the newest checkpoint found under their run's storage directory.

Jobs are planned at submission: a few profiles on real engines (`tidal.planner.fitting`), then
the resource matrix (best plan and predicted samples/s per GPU count) the policy chooses from.
A job that fits no plan on the cluster is rejected with the reason. Profiles that are not in the
cache need GPUs and CPUs like any run; `submit` reserves them on chosen nodes
(`tidal.platform.reservations`) and every snapshot the policy sees has that much less capacity
until profiling ends, so on a full cluster the policy shrinks running jobs to make room instead
of `submit` waiting for one to finish. A reservation never takes a guaranteed job's GPUs.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import pickle
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from tidal.autoscaler.reclaim import Borrower, choose_reclaim
from tidal.jobs.checkpoint import read_meta, read_metrics
from tidal.jobs.runner import Resources, RunHandle, launch, storage_root
from tidal.jobs.spec import JobSpec, Plan, SpecError
from tidal.platform.capacity import POOL_LABEL, Held, build_nodes
from tidal.platform.controller import ActionRecord, Phase, reconcile_step
from tidal.platform.policy import Allocation, JobView, Node, Option, PolicyConfig, Snapshot
from tidal.platform.reservations import Reservation, reserve, without
from tidal.platform.store import JobRecord, JobState, Store, state_dir
from tidal.serving.loans import LoanConfig, decide_loan, lend_by_node

log = logging.getLogger("tidal.scheduler")
LOG_LIMIT = 10_000  # entries kept of the actor's action and placement logs

SCHEDULER_NAME = "tidal-scheduler"
NAMESPACE = "tidal"


@dataclass(frozen=True, kw_only=True)
class Profiling:
    """A submission whose profiles are being measured (`submit` has not returned yet)."""

    name: str
    plans: int  # plans measured (the cached ones are not counted)
    reservation: Reservation | None  # None: nothing could host the workers; they wait in Ray


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    tick_s: float = 2.0
    state_path: str | None = None  # SQLite file; default $TIDAL_STATE/tidal.sqlite
    profile_samples: int = 4  # plans profiled per job (≤ 8)
    profile_steps: int = 2
    profile_gpus: float = 1.0  # GPUs per profiling worker (0 profiles on CPUs)
    use_cuda: bool = False
    gpu_mem_gib: float = 80.0
    cpus_per_worker: float = 1.0
    restart_cost_s: float = 30.0
    max_failures: int = 1  # Ray Train restarts a crashed worker group from its last checkpoint
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # the loan manager, in Serve replicas (one GPU each) per tick: replica_rps=1 makes its rates
    # replica counts; lead_s: checkpoint + stop + a replica's start
    loans: LoanConfig = field(default_factory=lambda: LoanConfig(replica_rps=1.0, interval_s=2.0, lead_s=15.0,
                                                                 window=15, min_replicas=0))
    max_infra_restarts: int = 10  # requeues after infrastructure failures before a job FAILS
    release_grace_s: float = 20.0  # a stopped run's GPUs count as Tidal's this long (Ray frees them late)


# What an infrastructure failure looks like from a run's error: a dead worker, node or actor, or
# a collective torn down under a surviving worker (gloo/NCCL). Anything else — the job's loss or
# model raising, a non-finite loss (tidal.jobs.worker.NonFiniteLoss) — is the job's own error.
_INFRA_TYPES = ("ActorDiedError", "RayActorError", "WorkerCrashedError", "NodeDiedError",
                "ActorUnavailableError", "OwnerDiedError", "ObjectLostError", "RaySystemError")
_INFRA_TEXT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL error",
               "ProcessGroupNCCL", "ProcessGroupGloo", "The actor died", "worker died",
               "node died", "SYSTEM_ERROR", "Socket Timeout")


def infrastructure_failure(error: BaseException) -> bool:
    """True if a run failed for the cluster's reason, not the job's (see the markers above). The
    job's own error wins when both appear: a NonFiniteLoss is never retried."""
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in chain and len(chain) < 10:
        chain.append(e)
        e = getattr(e, "cause", None) or e.__cause__ or e.__context__
    text = " ".join(f"{type(x).__name__}: {x}" for x in chain)
    if "NonFiniteLoss" in text or "non-finite loss" in text:
        return False
    return any(t in text for t in _INFRA_TYPES) or any(t in text for t in _INFRA_TEXT)


def _run_checkpoints(run_id: str | None) -> tuple[str | None, int, list[dict[str, Any]]]:
    """A lost run's newest complete checkpoint, its step, and the metrics of the steps up to it."""
    if not run_id:
        return None, 0, []
    root = storage_root() / run_id
    best: tuple[str | None, int] = (None, 0)
    metrics: list[dict[str, Any]] = []
    for d in sorted(root.glob("step_*")) if root.exists() else []:
        try:
            step = int(read_meta(d)["step"])
        except Exception:  # a half-written checkpoint: skip it
            continue
        metrics += read_metrics(d)
        if step >= best[1]:
            best = (str(d), step)
    return best[0], best[1], [m for m in metrics if int(m["step"]) <= best[1]]


class _Metrics:
    """Ray metrics (`ray.util.metrics`): exported as `ray_tidal_*` on the metrics endpoint, so the
    Ray dashboard / Prometheus / Grafana show them."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge

        self.jobs = Gauge("tidal_jobs", "Tidal jobs per state", tag_keys=("state",))
        self.gpus = Gauge("tidal_job_gpus", "GPUs held by a Tidal job", tag_keys=("job",))
        self.sps = Gauge("tidal_job_samples_per_s", "Throughput of a Tidal job, predicted and measured",
                         tag_keys=("job", "kind"))
        self.changes = Counter("tidal_plan_changes", "Reconfigurations of running jobs", tag_keys=("job",))
        self.pool_gpus = Gauge("tidal_pool_gpus",
                               "GPUs per pool: total, lendable (inference), lent to training",
                               tag_keys=("pool", "kind"))
        self.reclaims = Counter("tidal_reclaims", "Jobs stopped to give lent GPUs back to Serve",
                                tag_keys=("job",))

    def update(self, recs: list[JobRecord]) -> None:
        for state in JobState:
            self.jobs.set(sum(1 for r in recs if r.state is state), tags={"state": state.value})
        for r in recs:
            self.gpus.set(sum(int(g) for _, g in r.allocation or []), tags={"job": r.job_id})
            self.sps.set(r.predicted_sps, tags={"job": r.job_id, "kind": "predicted"})
            self.sps.set(r.measured_sps, tags={"job": r.job_id, "kind": "measured"})


class Scheduler:
    """The actor's body (wrapped by `ray.remote` in `tidal.platform.sdk`)."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.cfg = config or SchedulerConfig()
        path = Path(self.cfg.state_path) if self.cfg.state_path else state_dir() / "tidal.sqlite"
        self.store = Store(path)
        self.curves_dir = path.parent / "curves"
        self.curves_dir.mkdir(parents=True, exist_ok=True)
        self.handles: dict[str, RunHandle] = {}
        # in-memory logs of a long-lived actor: bounded (the store and the logger keep the rest)
        self.placement_checks: deque[dict[str, Any]] = deque(maxlen=LOG_LIMIT)
        self.cancel_requested: set[str] = set()
        self.profiling: dict[str, Profiling] = {}  # submissions being profiled, by key
        self.lock = threading.RLock()
        self.events: deque[str] = deque(maxlen=200)
        self.action_log: deque[ActionRecord] = deque(maxlen=LOG_LIMIT)
        self.metrics = _Metrics()
        self.demand: deque[float] = deque(maxlen=120)  # Serve's wanted replicas, one per tick
        self.released: deque[tuple[float, tuple[tuple[str, int], ...]]] = deque(maxlen=1000)
        self.loan_state: dict[str, Any] = {}
        self.specs: dict[str, JobSpec] = {}
        self.reasons: dict[str, str] = {}  # why a queued job waits, from the last decision
        self._recover()
        self._wake = threading.Event()
        threading.Thread(target=self._loop, name="tidal-reconcile", daemon=True).start()

    # -- API -----------------------------------------------------------------------------

    def ping(self) -> str:
        return "ok"

    def submit(self, spec: JobSpec, options: tuple[Option, ...] | None = None) -> str:
        """Queue a job. `options` (its resource matrix: best plan and samples/s per GPU count, e.g.
        from `tidal plan`) skips the profiling; they are checked against the spec and cluster."""
        if not isinstance(spec, JobSpec):
            raise SpecError("spec", f"expected a tidal.JobSpec, got {type(spec).__name__}")
        if options is None:
            options, predicted_guarantee = self._plan(spec)
        else:
            options, predicted_guarantee = self._check_options(spec, tuple(options))
        job_id = f"{spec.name}-{uuid.uuid4().hex[:6]}"
        from ray import cloudpickle

        self.store.add(JobRecord(job_id=job_id, name=spec.name, spec=cloudpickle.dumps(spec),
                                 options=pickle.dumps((options, predicted_guarantee))))
        self._event(f"{job_id} submitted ({len(options)} options, "
                    f"{options[0].gpus}-{options[-1].gpus} GPUs)")
        self._wake.set()
        return job_id

    def status(self, job_id: str | None = None) -> list[dict[str, Any]]:
        recs = [self.store.get(job_id)] if job_id else self.store.all()
        out = []
        for r in recs:
            h = self.handles.get(r.job_id)
            p = h.progress() if h is not None else None
            spec = self._spec(r)
            step = int((p or {}).get("step", r.step))
            sps = float((p or {}).get("samples_per_s", r.measured_sps) or 0.0)
            running = r.state in (JobState.RUNNING, JobState.STOPPING)
            eta = (spec.total_steps - step) * spec.global_batch / sps if running and sps > 0 else None
            out.append({
                "total_steps": spec.total_steps, "eta_s": eta,
                "reason": self.reasons.get(r.job_id, "") if r.state is JobState.QUEUED else "",
                "job_id": r.job_id, "name": r.name, "state": r.state.value,
                "plan": Plan.from_dict(r.plan).short() if r.plan else "",
                "gpus": sum(g for _, g in r.allocation or []),
                "nodes": [n for n, _ in r.allocation or []],
                "predicted_sps": r.predicted_sps,
                "measured_sps": (p or {}).get("samples_per_s", r.measured_sps),
                "step": (p or {}).get("step", r.step), "restarts": r.restarts, "error": r.error,
                "checkpoint": r.checkpoint,
            })
        if job_id is None:  # submissions still being profiled: not jobs yet, but visible
            for key, prof in list(self.profiling.items()):
                res = prof.reservation
                out.append({
                    "total_steps": 0, "eta_s": None,
                    "reason": f"profiling {prof.plans} plans"
                              + ("" if res else ", waiting for free resources"),
                    "job_id": key, "name": prof.name, "state": "PROFILING", "plan": f"{prof.plans} plans",
                    "gpus": math.ceil(len(res.workers) * res.gpus_per_worker - 1e-9) if res else 0,
                    "nodes": sorted(set(res.workers)) if res else [], "predicted_sps": 0.0,
                    "measured_sps": 0.0, "step": 0, "restarts": 0, "error": None, "checkpoint": None,
                })
        return out

    def _spec(self, r: JobRecord) -> JobSpec:
        """The job's spec, unpickled once per job."""
        if r.job_id not in self.specs:
            from ray import cloudpickle

            self.specs[r.job_id] = cloudpickle.loads(r.spec)
        return self.specs[r.job_id]

    def cancel(self, job_id: str) -> None:
        with self.lock:
            r = self.store.get(job_id)
            if r.state.terminal:
                return
            h = self.handles.get(job_id)
            if h is not None:
                self.cancel_requested.add(job_id)
                h.stop()
                if r.state is JobState.RUNNING:
                    self.store.update(job_id, state=JobState.STOPPING)
            else:
                self.store.update(job_id, state=JobState.CANCELLED, finished=time.time())
        self._event(f"{job_id} cancel requested")
        self._wake.set()

    def history(self, job_id: str) -> list[dict[str, Any]]:
        """The job's per-step metrics over all its runs so far (later runs win a step)."""
        steps = {int(m["step"]): m for m in self._curve(job_id)}
        h = self.handles.get(job_id)
        for m in h.history() if h is not None else []:
            steps[int(m["step"])] = m
        return [steps[k] for k in sorted(steps)]

    def placements(self) -> list[dict[str, Any]]:
        """For every finished run: the nodes the decision named and where the workers ran."""
        return list(self.placement_checks)

    def _curve(self, job_id: str) -> list[dict[str, Any]]:
        path = self.curves_dir / f"{job_id}.json"
        return json.loads(path.read_text()) if path.exists() else []

    def _save_curve(self, job_id: str, history: list[dict[str, Any]]) -> None:
        steps = {int(m["step"]): m for m in self._curve(job_id)}
        steps.update({int(m["step"]): m for m in history})
        (self.curves_dir / f"{job_id}.json").write_text(json.dumps([steps[k] for k in sorted(steps)]))

    def recent_events(self) -> list[str]:
        return list(self.events)

    # -- the controller ------------------------------------------------------------------

    def _event(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        self.events.append(line)
        log.info(line)

    def _recover(self) -> None:
        for r in self.store.all():
            if r.state in (JobState.RUNNING, JobState.STOPPING):
                ckpt, step, metrics = _run_checkpoints(r.run_id)
                self._save_curve(r.job_id, metrics)
                self.store.update(r.job_id, state=JobState.QUEUED, allocation=None,
                                  checkpoint=ckpt or r.checkpoint, step=max(step, r.step),
                                  restarts=r.restarts + 1)
                self._event(f"{r.job_id} recovered after a scheduler restart, from step {step}")

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.cfg.tick_s)
            self._wake.clear()
            try:
                self.reconcile()
            except Exception:  # the loop must survive; the error is logged with its trace
                log.exception("reconcile failed")

    def _plan(self, spec: JobSpec) -> tuple[tuple[Option, ...], float | None]:
        from tidal.planner.fitting import fit_job, sample_plans
        from tidal.planner.planner import best_plan, packed, require_feasible, score
        from tidal.planner.profiler import profile

        nodes = self._cluster_nodes()
        if not nodes:
            raise SpecError("cluster", "the Ray cluster has no node with GPUs")
        per_node = max(n.gpus for n in nodes)
        total = sum(n.gpus for n in nodes)
        top = min(spec.max_gpus, total)
        if top < spec.min_gpus:
            raise SpecError("JobSpec.min_gpus", f"needs {spec.min_gpus} GPUs, the cluster has {total}")
        plans = sample_plans(spec, min(top, 2), self.cfg.profile_samples, per_node)
        hardware = "cuda" if self.cfg.use_cuda else "cpu"
        key, res = self._begin_profiling(spec, plans, hardware, nodes)
        try:
            records = profile(spec, plans, hardware=hardware, use_cuda=self.cfg.use_cuda,
                              steps=self.cfg.profile_steps, progress=False,
                              gpus_per_worker=self.cfg.profile_gpus,
                              node_ids=res.workers if res else None)
        finally:
            if key:
                with self.lock:
                    del self.profiling[key]
                self._event(f"{key} done" + (": reservation released" if res else ""))
                self._wake.set()
        fitted = fit_job(spec, records, gpus_per_node=per_node)
        mem = self.cfg.gpu_mem_gib * 2**30
        shapes = [packed(n, per_node, gpu_mem_bytes=mem) for n in range(spec.min_gpus, top + 1)
                  if spec.global_batch % n == 0]
        require_feasible(spec, fitted.model, shapes)  # raises NoFeasiblePlan with the reason
        options = []
        for shape in shapes:
            c = best_plan(spec, fitted.model, shape)
            if c is not None:
                options.append(Option(gpus=shape.num_gpus, plan=c.plan, samples_per_s=c.samples_per_s,
                                      cpus_per_gpu=self.cfg.cpus_per_worker))
        guarantee = None
        if spec.guaranteed and spec.plan is not None and spec.requested_gpus is not None:
            guarantee = score(spec.plan, fitted.model, packed(spec.requested_gpus, per_node,
                                                              gpu_mem_bytes=mem)).samples_per_s
        return tuple(options), guarantee

    def _begin_profiling(self, spec: JobSpec, plans: list[Plan], hardware: str,
                         nodes: list[Node]) -> tuple[str | None, Reservation | None]:
        """Register the profiles `profile` will measure (not the cached ones) under a key that
        `status` lists, and reserve their workers, so that the policy makes room for them on a
        full cluster (`tidal.platform.reservations`). (None, None) when everything is cached;
        no reservation when nothing outside guaranteed jobs and other profiles can host them."""
        from tidal.planner.profiler import PROFILE_CPUS_PER_WORKER, uncached

        todo = uncached(spec, plans, hardware=hardware, steps=self.cfg.profile_steps)
        if not todo:
            return None, None
        key = f"profile-{spec.name}-{uuid.uuid4().hex[:6]}"
        with self.lock:
            held: dict[str, tuple[float, float]] = {}
            kept: dict[str, tuple[float, float]] = {}  # guaranteed jobs' GPUs: never reserved
            for r in self.store.all():
                if r.state in (JobState.RUNNING, JobState.STOPPING):
                    guaranteed = pickle.loads(r.options)[1] is not None
                    for nid, g in r.allocation or []:
                        for into in (held, kept) if guaranteed else (held,):
                            hg, hc = into.get(nid, (0.0, 0.0))
                            into[nid] = (hg + g, hc + g * self.cfg.cpus_per_worker)
            res = reserve(nodes, held, max(p.dp for p in todo), gpus_per_worker=self.cfg.profile_gpus,
                          cpus_per_worker=PROFILE_CPUS_PER_WORKER, kept=kept,
                          reserved=[p.reservation for p in self.profiling.values() if p.reservation])
            self.profiling[key] = Profiling(name=spec.name, plans=len(todo), reservation=res)
        if res is None:
            self._event(f"{key}: {len(todo)} plans; no capacity outside guaranteed jobs and other "
                        "profiles can host its workers: they wait for free resources")
        else:
            self._event(f"{key}: {len(todo)} plans, reserved {len(res.workers)} workers "
                        f"on {sorted(set(res.workers))}")
            self._wake.set()  # the policy makes room now, not at the next tick
        return key, res

    def _check_options(self, spec: JobSpec,
                       options: tuple[Option, ...]) -> tuple[tuple[Option, ...], float | None]:
        if not options or any(not isinstance(o, Option) for o in options):
            raise SpecError("options", "must be a non-empty sequence of tidal.platform.policy.Option")
        if any(a.gpus >= b.gpus for a, b in itertools.pairwise(options)):
            raise SpecError("options", "GPU counts must increase from one option to the next")
        total = sum(n.gpus for n in self._cluster_nodes())
        for o in options:
            spec.check_plan(o.plan)  # PlanError naming the plan if the job cannot run it
            if o.plan.num_gpus != o.gpus or o.samples_per_s <= 0:
                raise SpecError("options",
                                f"option {o.plan.short()}: needs gpus == the plan's GPUs and samples/s > 0")
        if options[0].gpus > total:
            raise SpecError("options",
                            f"the smallest option needs {options[0].gpus} GPUs, the cluster has {total}")
        guarantee = None
        if spec.guaranteed:
            match = [o for o in options if o.gpus == spec.requested_gpus and o.plan == spec.plan]
            if not match:
                raise SpecError("options",
                                "a guaranteed job's options must include its own plan on requested_gpus")
            guarantee = match[0].samples_per_s
        return options, guarantee

    def _cluster_nodes(self) -> list[Node]:
        """Every alive node with GPUs at its full size: what a job may ever get (admission and
        planning; the policy's snapshot sees `_nodes`)."""
        out = []
        for n in ray.nodes():
            res = n.get("Resources", {})
            if n.get("Alive") and res.get("GPU", 0) >= 1:
                out.append(Node(node_id=n["NodeID"], gpus=int(res["GPU"]), cpus=float(res.get("CPU", 0)),
                                memory=float(res.get("memory", 1e18))))
        return sorted(out, key=lambda n: n.node_id)

    def _nodes(self, ray_nodes: list[dict[str, Any]]) -> list[Node]:
        """What each node offers Tidal now (`tidal.platform.capacity.build_nodes`): free capacity
        plus what Tidal's runs hold (and, for `release_grace_s`, what runs that just ended held:
        Ray frees a finished run's placement group a little later), inference nodes only what the
        last loan step lent."""
        from ray._private.state import available_resources_per_node

        held: dict[str, Held] = {}

        def add(nid: str, g: float) -> None:
            h = held.get(nid, Held())
            held[nid] = Held(gpus=h.gpus + g, cpus=h.cpus + g * self.cfg.cpus_per_worker)

        for r in self.store.all():
            if r.state in (JobState.RUNNING, JobState.STOPPING):
                for nid, g in r.allocation or []:
                    add(nid, float(g))
        now = time.time()
        for t, alloc in self.released:
            if now - t < self.cfg.release_grace_s:
                for nid, g in alloc:
                    add(nid, float(g))
        return build_nodes(ray_nodes, available_resources_per_node(), held, self.loan_state.get("lent", {}),
                           recall_risk=float(self.loan_state.get("risk", 1.0)))

    def _loan_step(self, recs: list[JobRecord], ray_nodes: list[dict[str, Any]]) -> None:
        """The loan manager's tick: Serve's demand → lendable inference GPUs → reclaims.

        Serve's wanted replicas (`tidal.serving.demand`) join the history; the loan decision
        (`tidal.serving.loans.decide_loan`, a forecast over the reclaim lead time) says how many
        inference GPUs training may hold. If Tidal's jobs hold more, the least-cost reclaim
        (`tidal.autoscaler.reclaim.choose_reclaim`) names the jobs to stop at their next step
        boundary with a checkpoint; the policy relaunches them on what is left. While a job is
        still stopping nothing more is reclaimed (its GPUs are on their way back)."""
        from tidal.serving.demand import current_demand

        pool = {n["NodeID"]: int(n["Resources"].get("GPU", 0)) for n in ray_nodes
                if n.get("Alive") and (n.get("Labels") or {}).get(POOL_LABEL) == "inference"
                and n["Resources"].get("GPU", 0) >= 1}
        if not pool:
            self.loan_state = {}
            return
        self.demand.append(float(current_demand()))
        total = sum(pool.values())
        decision = decide_loan(list(self.demand), total, self.cfg.loans)
        held: dict[str, int] = {}
        for r in recs:
            if r.state in (JobState.RUNNING, JobState.STOPPING):
                for nid, g in r.allocation or []:
                    if nid in pool:
                        held[nid] = held.get(nid, 0) + int(g)
        need = sum(held.values()) - decision.lendable
        stopping = any(r.state is JobState.STOPPING for r in recs)
        if need > 0 and not stopping:
            borrowers = []
            for r in recs:
                lent = tuple((nid, int(g)) for nid, g in r.allocation or [] if nid in pool)
                if r.state is not JobState.RUNNING or not lent or r.job_id not in self.handles:
                    continue
                options = pickle.loads(r.options)[0]
                gpus = sum(int(g) for _, g in r.allocation or [])
                borrowers.append(Borrower(job_id=r.job_id, gpus=gpus, lent_by_node=lent,
                                          options=tuple(o.gpus for o in options),
                                          restart_s=self.cfg.restart_cost_s or 30.0))
            by_id = {r.job_id: r for r in recs}
            for pick in choose_reclaim(borrowers, need):
                self.metrics.reclaims.inc(tags={"job": pick.job_id})
                self._stop(by_id[pick.job_id],
                           f"reclaim: Serve wants {self.demand[-1]:.0f} replicas, {decision.lendable} GPUs "
                           f"lendable; gives back {dict(pick.freed_by_node)}, "
                           f"resumes on {pick.keep_gpus or 'no'} GPUs")
        lendable = max(0, min(decision.lendable, total))
        lent_by_node = lend_by_node(pool, lendable, held)
        self.loan_state = {"lent": lent_by_node, "lendable": lendable, "pool_gpus": total,
                           "serve_replicas": self.demand[-1], "forecast": decision.forecast_rps,
                           "risk": decision.recall_risk,
                           "held": sum(held.values())}
        self.metrics.pool_gpus.set(total, tags={"pool": "inference", "kind": "total"})
        self.metrics.pool_gpus.set(lendable, tags={"pool": "inference", "kind": "lendable"})
        self.metrics.pool_gpus.set(sum(held.values()), tags={"pool": "inference", "kind": "lent"})

    def _stop(self, r: JobRecord, why: str) -> None:
        """Ask a running job to stop at its next step boundary with a checkpoint (→ STOPPING)."""
        self.handles[r.job_id].stop()
        self.store.update(r.job_id, state=JobState.STOPPING)
        self._log_action("stop", r.job_id, [(n, int(g)) for n, g in r.allocation or []], "")
        self._event(f"{r.job_id} {why}")

    def pools(self) -> dict[str, Any]:
        """The inference pool's loan state (total, lendable and lent GPUs, Serve's replicas)."""
        return dict(self.loan_state)

    def _collect(self) -> None:
        for jid, h in list(self.handles.items()):
            p = h.progress()
            if p:
                self.store.update(jid, step=int(p["step"]), measured_sps=float(p["samples_per_s"]))
            if not h.done():
                continue
            del self.handles[jid]
            rec = self.store.get(jid)
            self.released.append((time.time(), tuple((n, int(g)) for n, g in rec.allocation or [])))
            try:
                r = h.result()
            except Exception as e:
                self._run_failed(rec, e)
                continue
            self._save_curve(jid, r.history)
            named = sorted(n for n, g in rec.allocation or [] for _ in range(int(g)))
            ran = sorted(r.worker_nodes.values())
            self.placement_checks.append({"job_id": jid, "run_id": r.run_id, "decided": named, "ran": ran})
            if named != ran:
                self._event(f"{jid}: workers ran on {ran}, the decision named {named}")
            fields: dict[str, Any] = {"checkpoint": r.checkpoint, "step": r.final_step, "allocation": None}
            if r.finished:
                self.store.update(jid, state=JobState.SUCCEEDED, finished=time.time(), **fields)
                self._event(f"{jid} SUCCEEDED at step {r.final_step}")
            elif jid in self.cancel_requested:
                self.store.update(jid, state=JobState.CANCELLED, finished=time.time(), **fields)
                self._event(f"{jid} CANCELLED at step {r.final_step}")
            else:
                self.store.update(jid, state=JobState.QUEUED, restarts=rec.restarts + 1, **fields)
                self._event(f"{jid} stopped at step {r.final_step} for reconfiguration")

    def _run_failed(self, rec: JobRecord, e: Exception) -> None:
        """A run ended with an error. The cluster's fault (a dead worker or node, a broken
        collective: `infrastructure_failure`) sends the job back to QUEUED from the newest
        checkpoint in its run's storage, counted in `restarts`, up to `max_infra_restarts`; the
        job's own error (its loss or model raising, a non-finite loss) fails it alone."""
        jid = rec.job_id
        error = f"{type(e).__name__}: {e}"[-4000:]
        if infrastructure_failure(e) and rec.restarts < self.cfg.max_infra_restarts:
            ckpt, step, metrics = _run_checkpoints(rec.run_id)
            self._save_curve(jid, metrics)
            if ckpt is None:  # nothing new: back to the checkpoint it started from
                ckpt = rec.checkpoint
                step = int(read_meta(ckpt)["step"]) if ckpt else 0
            self.store.update(jid, state=JobState.QUEUED, allocation=None, checkpoint=ckpt, step=step,
                              restarts=rec.restarts + 1)
            self._event(f"{jid} run failed for an infrastructure reason ({error.splitlines()[0][:120]}); "
                        f"requeued from step {step}")
            return
        self.store.update(jid, state=JobState.FAILED, error=error, allocation=None, finished=time.time())
        self._event(f"{jid} FAILED: {type(e).__name__}")

    def _views(self, recs: list[JobRecord]) -> list[JobView]:

        views = []
        for r in recs:
            options, guarantee = pickle.loads(r.options)
            spec = self._spec(r)
            current = None
            if r.state is JobState.RUNNING and r.allocation and r.plan:
                current = Allocation(gpus_by_node=tuple((n, int(g)) for n, g in r.allocation),
                                     plan=Plan.from_dict(r.plan))
            remaining = float(max(0, spec.total_steps - r.step) * spec.global_batch)
            views.append(JobView(job_id=r.job_id, arrival=r.submitted, options=options, guarantee=guarantee,
                                 current=current, restarts=r.restarts, restart_cost_s=self.cfg.restart_cost_s,
                                 remaining_samples=remaining))
        return views

    def reconcile(self) -> None:

        with self.lock:
            self._collect()
            everything = self.store.all()
            self.metrics.update(everything)
            recs = [r for r in everything if not r.state.terminal]
            ray_nodes = ray.nodes()
            self._loan_step(recs, ray_nodes)
            recs = [r for r in self.store.all() if not r.state.terminal]
            nodes = without(self._nodes(ray_nodes),
                            [p.reservation for p in self.profiling.values() if p.reservation])
            if not recs or not nodes:
                return
            phases = {r.job_id: Phase(r.state.value) for r in recs}
            snapshot = Snapshot(now=time.time(), nodes=tuple(nodes), jobs=tuple(self._views(recs)),
                                config=self.cfg.policy)
            actions = reconcile_step(snapshot, phases)  # nothing while a job is still stopping
            decision = actions.decision
            if decision is not None:
                self.reasons = dict(decision.reasons)
            by_id = {r.job_id: r for r in recs}
            for jid in actions.stop:
                r = by_id[jid]
                self.metrics.changes.inc(tags={"job": jid})
                new = decision.allocations.get(jid) if decision else None
                self._stop(r, f"reconfigure: {Plan.from_dict(r.plan).short() if r.plan else ''}"
                              f" → {new.plan.short() if new else 'queued'}")
            for jid, a in actions.launch:
                r = by_id[jid]
                spec = self._spec(r)
                node_ids = tuple(n for n, g in a.gpus_by_node for _ in range(g))
                res = Resources(num_workers=a.plan.dp, gpus_per_worker=1,
                                cpus_per_worker=self.cfg.cpus_per_worker, node_ids=node_ids)
                run_id = f"{jid}-r{r.restarts}"
                self.handles[jid] = launch(spec, a.plan, res, r.checkpoint, run_id=run_id,
                                           max_failures=self.cfg.max_failures, job_key=jid)
                opt = next(o for o in pickle.loads(r.options)[0] if o.gpus == a.gpus)
                self.store.update(jid, state=JobState.RUNNING, plan=a.plan.to_dict(),
                                  allocation=[[n, g] for n, g in a.gpus_by_node], run_id=run_id,
                                  predicted_sps=opt.samples_per_s)
                self._log_action("launch", jid, list(a.gpus_by_node), a.plan.short())
                self._event(f"{jid} launched: {a.plan.short()} on {dict(a.gpus_by_node)}")

    def _log_action(self, kind: str, job_id: str, gpus: list[tuple[str, int]], plan: str) -> None:
        self.action_log.append((time.time(), kind, job_id, tuple(gpus), plan))

    def actions(self) -> list[ActionRecord]:
        """Every stop and launch this actor applied: (time, stop|launch, job, GPUs per node, plan),
        the same record the simulator keeps (the conformance suite compares the two)."""
        return list(self.action_log)
