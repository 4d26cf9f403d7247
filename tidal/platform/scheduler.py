"""The Tidal scheduler: a named, detached Ray actor (`tidal-scheduler` in namespace `tidal`).

It holds the jobs in SQLite (`tidal.platform.store`, the one state machine of
`tidal.core.state`) and every `tick_s`, or at once on an event, runs one reconcile step — an
explicit controller loop:

    1. collect runs that ended (`tidal.platform.executor`): SUCCEEDED, back to QUEUED with
       their checkpoint (a reconfiguration, a reclaim, or a fault of the cluster), or FAILED
       (the job's own error); a job that moved on has its earlier runs removed from storage;
    2. the loan step: Serve's demand → inference GPUs lendable to training → reclaims;
    3. admission (`tidal.platform.admission`): each PROFILING job is sized and profiled by Ray
       tasks off this actor, in capacity reserved for it; it becomes QUEUED with its resource
       matrix or REJECTED with the reason;
    4. snapshot what each node offers Tidal now (`tidal.platform.capacity`, less the profiles'
       reservations) and the scheduled jobs, and call the pure policy through the reconcile
       step both executors share (`tidal.core.controller.reconcile_step`): running jobs whose
       allocation or plan changes are asked to stop at their next step boundary with a
       checkpoint (→ STOPPING); when nothing is stopping, queued jobs with an allocation are
       launched on exactly the nodes the decision names (→ RUNNING); a launch its run refuses
       (a checkpoint since deleted) fails that job alone.

`submit` validates cheaply (the spec's type, the GPUs the cluster could ever give it), stores
the job PROFILING and returns its id: nothing slow runs in the actor. The SDK's dry run has
already built the model and taken one step on the client (`tidal.jobs.dryrun`).

A restarted actor (`max_restarts=-1`) reopens the store: jobs it had RUNNING or STOPPING lost
their runs with the old actor (Ray Train's controller and workers are owned by it; Train's
placement-group cleaner removes their placement groups), so they return to QUEUED from the
newest checkpoint found under their run's storage directory (SUCCEEDED if that checkpoint is
the whole job); PROFILING jobs start their
admission again (the profile cache keeps what was measured). Until the old placement groups
are gone their GPUs are not free, and the snapshot, built from what Ray reports free, does not
offer them: nothing is launched into capacity a predecessor still holds.

What the cluster already did is recorded before anything new is decided. A launch, a stop
asked for, or a run's end whose write the state file refuses (`StoreWriteError`: its disk full,
a lock someone else holds) is kept and written first at the next tick; until it is, a tick
decides nothing (`_recorded`, `_flush`). Before, a launch whose record failed left the job
QUEUED beside its live run, and the next tick launched it a second time into the same run
directory; a run whose end failed to record was dropped, and its job stayed RUNNING for good.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import ray

from tidal.autoscaler.reclaim import Borrower, choose_reclaim
from tidal.core.autoscale import node_request
from tidal.core.controller import ActionRecord, reconcile_step
from tidal.core.correction import Correction, CorrectionConfig, corrected, observe
from tidal.core.fields import require_int, require_number
from tidal.core.policy import Allocation, Decision, JobView, Node, Option, PolicyConfig, Snapshot, predicted
from tidal.core.restarts import RestartCost
from tidal.jobs.checkpoint import CheckpointError, read_meta, read_metrics
from tidal.jobs.runner import RunResult, check_storage, checkpoint_done, resume_point
from tidal.jobs.spec import JobSpec, Plan, SpecError
from tidal.planner.jobplan import Cluster, ProfileConfig, check_fits
from tidal.platform import admission
from tidal.platform.admission import Admission, Stage
from tidal.platform.capacity import TRAINING_SELECTOR, Held, build_nodes, launchable_gpus, pool_of
from tidal.platform.executor import (
    Ended,
    Executor,
    checkpoint_owner,
    infrastructure_failure,
    prune_runs,
    run_checkpoints,
)
from tidal.platform.metrics import Metrics
from tidal.platform.reservations import Reservation, reserve, without
from tidal.platform.store import JobRecord, JobState, Store, StoreWriteError, state_dir
from tidal.serving.loans import LoanConfig, decide_loan, lend_by_node

log = logging.getLogger("tidal.scheduler")
_RESTART_SAMPLES = "restart_cost"  # the store's key for `RestartCost.samples()`
LOG_LIMIT = 10_000  # entries kept of the actor's action and placement logs

SCHEDULER_NAME = "tidal-scheduler"
NODE_REQUESTER = "tidal-scheduler"  # Tidal's requester id with Ray's AutoscalingCoordinator
NODE_REQUEST_TTL_S = 300.0  # a node request outlives a dead scheduler this long
NODE_REQUEST_REFRESH_S = 20.0  # resent this often while it stands: as often as Ray Train refreshes its own
# (a restarted coordinator starts empty; the request is back within this long)
NODE_REQUEST_RETRY_S = 10.0  # after a failed send, the next try waits this long
NAMESPACE = "tidal"


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
    # what the policy charges a restart or start: None measures it from this scheduler's own runs
    # (`tidal.core.restarts`: median stop + median launch → first step; 30 s until measured); a
    # number pins it
    restart_cost_s: float | None = None
    # Ray Train's own restarts of a crashed worker group; 0: every fault comes back to the
    # scheduler, which requeues the job from its newest checkpoint (counted in `restarts`) and
    # may place it elsewhere (the node may be gone)
    max_failures: int = 0
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # the loan manager, in Serve replicas (one GPU each) per tick: replica_rps=1 makes its rates
    # replica counts; lead_s: checkpoint + stop + a replica's start
    loans: LoanConfig = field(default_factory=lambda: LoanConfig(replica_rps=1.0, interval_s=2.0, lead_s=15.0,
                                                                 window=15, min_replicas=0))
    max_infra_restarts: int = 10  # requeues after infrastructure failures before a job FAILS
    # a run that executes no step for this long (from its launch before its first) is hung: its
    # workers are killed and the job resumes from its newest checkpoint, an infrastructure failure
    # (`_watch`). Longer than a checkpoint's write and a run's start-up (a large model's load).
    # An admission's sizing that takes longer, or its profiles longer than this per plan plus
    # one, is hung too: killed, and the admission starts again (`Admission.overdue`)
    stall_s: float = 900.0
    max_admission_attempts: int = 3  # admission tasks lost to the cluster before a job is REJECTED
    release_grace_s: float = 20.0  # a stopped run's GPUs count as Tidal's this long (Ray frees them late)
    # each job's predictions corrected by its measured samples/s (None: the model as fitted)
    correction: CorrectionConfig | None = field(default_factory=CorrectionConfig)
    # ask Ray's autoscaler for the nodes waiting jobs need (tidal.core.autoscale.node_request)
    autoscale: bool = True
    # the autoscaler's config (a cluster-launcher YAML, parsed: `tidal start --autoscaling-config`):
    # admission sizes jobs against the alive nodes plus the training nodes it may still launch
    # (`capacity.launchable_gpus`); None: the alive nodes only
    autoscaling_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        """Settings the scheduler cannot run with fail here, in one line naming the setting,
        before an actor starts with them (a negative tick spins the loop; a negative pinned
        restart cost makes every restart look like a gain to the policy)."""
        r = self.restart_cost_s
        if r is not None and not (0.0 <= r < math.inf):
            raise ValueError(f"SchedulerConfig.restart_cost_s must be None (measured) or seconds >= 0, "
                             f"got {r!r}")
        for name, lo, strict in (("tick_s", 0.0, True), ("gpu_mem_gib", 0.0, True),
                                 ("cpus_per_worker", 0.0, True), ("profile_gpus", 0.0, False),
                                 ("release_grace_s", 0.0, False), ("stall_s", 0.0, True)):
            require_number(f"SchedulerConfig.{name}", getattr(self, name), lo, strict=strict)
        for name, lo, hi in (("profile_samples", 1, 8), ("profile_steps", 1, None), ("max_failures", 0, None),
                             ("max_infra_restarts", 0, None), ("max_admission_attempts", 1, None)):
            require_int(f"SchedulerConfig.{name}", getattr(self, name), lo, hi)

    def profiling(self) -> ProfileConfig:
        return ProfileConfig(samples=self.profile_samples, steps=self.profile_steps,
                             gpus_per_worker=self.profile_gpus, use_cuda=self.use_cuda,
                             cpus_per_gpu=self.cpus_per_worker)


class Scheduler:
    """The actor's body (wrapped by `ray.remote` in `tidal.platform.sdk`)."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.cfg = config or SchedulerConfig()
        path = Path(self.cfg.state_path) if self.cfg.state_path else state_dir() / "tidal.sqlite"
        self.store = Store(path)
        self.curves_dir = path.parent / "curves"
        self.curves_dir.mkdir(parents=True, exist_ok=True)
        self.executor = Executor(cpus_per_worker=self.cfg.cpus_per_worker, max_failures=self.cfg.max_failures,
                                 release_grace_s=self.cfg.release_grace_s)
        # in-memory logs of a long-lived actor: bounded (the store and the logger keep the rest)
        self.placement_checks: deque[dict[str, Any]] = deque(maxlen=LOG_LIMIT)
        self.admissions: dict[str, Admission] = {}  # PROFILING jobs' admission stage, by job
        self.lock = threading.RLock()
        self.events: deque[str] = deque(maxlen=200)
        self.action_log: deque[ActionRecord] = deque(maxlen=LOG_LIMIT)
        self.metrics = Metrics()
        self.demand: deque[float] = deque(maxlen=120)  # Serve's wanted replicas, one per tick
        self.loan_state: dict[str, Any] = {}
        self.specs: dict[str, JobSpec] = {}
        self.reasons: dict[str, str] = {}  # why a queued job waits, from the last decision
        # the last node request sent (None: none yet, so the first decision replaces whatever a
        # predecessor asked for)
        self.node_request: tuple[dict[str, float], ...] | None = None
        self.node_request_at = float("-inf")  # when it was last sent (time.monotonic)
        self.node_request_failed_at = float("-inf")  # when sending it last failed
        self.observed: dict[str, float] = {}  # job → when its run's throughput was last observed
        self.spent: dict[str, tuple[str, int, bool]] = {}  # `compute_steps`' memory
        # the restart cost measured from this actor's runs and its predecessors' (kept in the
        # store), and when each run was launched (also `JobView.running_s`) and each stop asked
        # for (a restarted actor measures its runs again: its jobs are QUEUED until it launches them)
        self.restart = RestartCost().restored(self.store.measured(_RESTART_SAMPLES))
        self.launched: dict[str, float] = {}
        self.hung: set[str] = set()  # jobs whose run `_watch` aborted, until it ends
        self.stopping: dict[str, float] = {}
        # writes recording what the cluster already did that the state file refused, oldest first
        # (`_recorded`): each tick writes them before it decides anything
        self.unrecorded: list[tuple[str, Callable[[], object]]] = []
        self._incarnation = uuid.uuid4().hex  # this actor's life: a restart is another
        # each job's (latest run, checkpoint) its storage was last pruned at (`_prune`); the
        # pruning runs off the loop: a checkpoint of a large model on a network filesystem is GBs
        self.pruned: dict[str, tuple[str | None, str | None]] = {}
        self.pruner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidal-prune")
        self._recover()
        self._wake = threading.Event()
        threading.Thread(target=self._loop, name="tidal-reconcile", daemon=True).start()

    # -- API -----------------------------------------------------------------------------

    def ping(self) -> str:
        return "ok"

    def incarnation(self) -> str:
        """Which life of the actor this is (admission tasks end themselves when it changes)."""
        return self._incarnation

    def submit(self, spec: JobSpec, options: tuple[Option, ...] | None = None) -> str:
        """Store a job and return its id at once. Without `options` it is PROFILING: admission
        plans it off the actor. `options` (its resource matrix: best plan and samples/s per GPU
        count, e.g. from `tidal plan`) are checked against the spec and cluster and queue it."""
        if not isinstance(spec, JobSpec):
            raise SpecError("spec", f"expected a tidal.JobSpec, got {type(spec).__name__}")
        from ray import cloudpickle

        check_storage()  # StorageError naming it: nothing stored, nothing launched
        start = resume_point(spec)  # SpecError naming JobSpec.resume_from, likewise
        source = resume_source(self.store, start[0]) if start else None
        cluster = self._cluster()
        job_id = f"{spec.name}-{uuid.uuid4().hex[:6]}"
        begin: dict[str, Any] = dict(checkpoint=start[0], step=start[1]) if start else {}
        if options is None:
            check_fits(spec, cluster)  # SpecError naming the field: nothing stored, nothing reserved
            rec = JobRecord(job_id=job_id, name=spec.name, spec=cloudpickle.dumps(spec), **begin)
            note = "submitted; admission profiles it off the scheduler"
        else:
            opts, guarantee = self._check_options(spec, tuple(options), cluster)
            rec = JobRecord(job_id=job_id, name=spec.name, spec=cloudpickle.dumps(spec),
                            state=JobState.QUEUED, options=opts, guarantee=guarantee, **begin)
            note = f"submitted with {len(opts)} options, {opts[0].gpus}-{opts[-1].gpus} GPUs"
        if start:
            note += f"; resumes from step {start[1]} of {source or start[0]}"
        with self.lock:
            self.store.add(rec, note)
            self.specs[job_id] = spec
            if start:  # its curve so far: the source job's, and what the checkpoint carries
                curve = [*(self._curve(source) if source else []), *read_metrics(start[0])]
                self._save_curve(job_id, [m for m in curve if int(m["step"]) <= start[1]])
        self._event(f"{job_id} {note}")
        self._wake.set()
        return job_id

    def resume(self, job_id: str, spec: JobSpec | None = None) -> str:
        """Submit ended job `job_id` again, as a new job, from its newest complete checkpoint
        (`JobSpec.resume_from`), with its own spec or `spec` (a lower LR after a non-finite loss,
        more `total_steps`): a job FAILED by its error or by `max_infra_restarts`, a CANCELLED
        one, a SUCCEEDED one given more steps. The new job's id; a ValueError naming why not."""
        r = self.store.get(job_id)
        if not r.state.terminal:
            raise ValueError(f"job {job_id} is {r.state.value}: only a job that has ended can be resumed")
        # what its latest run left, else where that run began (a run's checkpoints come after)
        newest = run_checkpoints(r.run_id)[0] or r.checkpoint
        if newest is None:
            raise ValueError(f"job {job_id} ({r.state.value}) left no checkpoint to resume from")
        return self.submit(replace(spec or self._spec(r), resume_from=newest))

    def status(self, job_id: str | None = None) -> list[dict[str, Any]]:
        recs = [self.store.get(job_id)] if job_id else self.store.all()
        return [self._row(r) for r in recs]

    def _row(self, r: JobRecord) -> dict[str, Any]:
        p = self.executor.progress(r.job_id)
        spec = self._spec(r)
        step = int((p or {}).get("step", r.step))
        compute = compute_steps(r, p, self.spent)
        sps = float((p or {}).get("samples_per_s", r.measured_sps) or 0.0)
        running = r.state in (JobState.RUNNING, JobState.STOPPING)
        eta = max(0, spec.total_steps - compute) * spec.global_batch / sps if running and sps > 0 else None
        gpus, nodes = sum(g for _, g in r.allocation or []), [n for n, _ in r.allocation or []]
        reason = self.reasons.get(r.job_id, "") if r.state is JobState.QUEUED else ""
        adm = self.admissions.get(r.job_id)
        if r.state is JobState.PROFILING:
            reason = adm.reason() if adm else "waiting for the scheduler's next step"
            res = adm.reservation if adm else None
            gpus = math.ceil(len(res.workers) * res.gpus_per_worker - 1e-9) if res else 0
            nodes = sorted(set(res.workers)) if res else []
        return {
            "total_steps": spec.total_steps, "eta_s": eta, "reason": reason,
            "job_id": r.job_id, "name": r.name, "state": r.state.value,
            "plan": Plan.from_dict(r.plan).short() if r.plan else "",
            "gpus": gpus, "nodes": nodes, "allocation": [[n, int(g)] for n, g in r.allocation or []]
            if running else [], "predicted_sps": r.predicted_sps, "measured_sps": sps,
            "step": step, "compute_steps": compute, "restarts": r.restarts, "error": r.error,
            "error_line": error_note(r.error) if r.error else "",  # what `tidal events` notes
            "checkpoint": r.checkpoint,
            "sps_ratios": r.sps_ratios,  # the online correction: [[gpus, measured ÷ predicted], ...]
        }

    def job_events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's state changes, oldest first (`tidal events JOB`)."""
        return [{"t": e.t, "from": e.from_state, "to": e.to_state, "note": e.note}
                for e in self.store.events(job_id)]

    def _spec(self, r: JobRecord) -> JobSpec:
        """The job's spec, unpickled once per job."""
        if r.job_id not in self.specs:
            from ray import cloudpickle

            self.specs[r.job_id] = cloudpickle.loads(r.spec)
        return self.specs[r.job_id]

    def cancel(self, job_id: str) -> None:
        """Cancel a job in any state that has not ended: a PROFILING job's admission tasks are
        stopped; a running job checkpoints and stops, then is CANCELLED."""
        with self.lock:
            r = self.store.get(job_id)
            if r.state.terminal:
                return
            if r.state is JobState.PROFILING:
                adm = self.admissions.pop(job_id, None)
                if adm is not None and adm.ref is not None:
                    admission.cancel(adm)
                self.store.transition(job_id, JobState.CANCELLED, "cancelled while profiling",
                                      finished=time.time())
            elif self.executor.has_run(job_id):  # written first: a refused write cancels nothing
                self.store.update(job_id, cancel_requested=True)  # durable: a restarted actor honours it
                if r.state is JobState.RUNNING:
                    self.store.transition(job_id, JobState.STOPPING, "cancel requested")
                self.executor.stop(job_id)
            else:
                self.store.transition(job_id, JobState.CANCELLED, "cancelled while queued",
                                      finished=time.time())
        self._event(f"{job_id} cancel requested")
        self._wake.set()

    def history(self, job_id: str) -> list[dict[str, Any]]:
        """The job's per-step metrics over all its runs so far (later runs win a step)."""
        steps = {int(m["step"]): m for m in self._curve(job_id)}
        for m in self.executor.history(job_id):
            steps[int(m["step"])] = m
        return [steps[k] for k in sorted(steps)]

    def placements(self) -> list[dict[str, Any]]:
        """For every run that ended (but runs aborted before their first step: no workers): the
        nodes the decision named and where the workers ran."""
        return list(self.placement_checks)

    def recent_events(self) -> list[str]:
        return list(self.events)

    def restart_cost(self) -> dict[str, Any]:
        """What the policy charges a restart now, and the measurements behind it (seconds)."""
        return {"seconds": self._restart_cost_s(), "pinned": self.cfg.restart_cost_s is not None,
                "measured_s": self.restart.seconds, "starts": list(self.restart.starts),
                "stops": list(self.restart.stops)}

    def _observe_restart(self, **sample: float) -> None:
        """One more measured start or stop (`RestartCost.observe`), kept in the store."""
        self.restart = self.restart.observe(**sample)
        try:
            self.store.set_measured(_RESTART_SAMPLES, self.restart.samples())
        except StoreWriteError as e:  # the next sample stores them all
            log.warning("restart cost not stored: %s", e)

    def _restart_cost_s(self) -> float:
        return self.cfg.restart_cost_s if self.cfg.restart_cost_s is not None else self.restart.seconds

    def pools(self) -> dict[str, Any]:
        """The inference pool's loan state (total, lendable and lent GPUs, Serve's replicas)."""
        return dict(self.loan_state)

    def actions(self) -> list[ActionRecord]:
        """Every stop and launch this actor applied: (time, stop|launch, job, GPUs per node, plan),
        the same record the simulator keeps (the conformance suite compares the two)."""
        return list(self.action_log)

    def _curve(self, job_id: str) -> list[dict[str, Any]]:
        path = self.curves_dir / f"{job_id}.json"
        return json.loads(path.read_text()) if path.exists() else []

    def _save_curve(self, job_id: str, history: list[dict[str, Any]]) -> None:
        steps = {int(m["step"]): m for m in self._curve(job_id)}
        steps.update({int(m["step"]): m for m in history})
        (self.curves_dir / f"{job_id}.json").write_text(json.dumps([steps[k] for k in sorted(steps)]))

    # -- the controller ------------------------------------------------------------------

    def _event(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        self.events.append(line)
        log.info(line)

    def _recover(self) -> None:
        for r in self.store.all():
            if r.state in (JobState.RUNNING, JobState.STOPPING):
                ckpt, step, metrics = run_checkpoints(r.run_id)
                self._save_curve(r.job_id, metrics)
                if r.cancel_requested:
                    self.store.transition(r.job_id, JobState.CANCELLED, "cancelled; the scheduler restarted "
                                          "while it stopped", allocation=None, finished=time.time(),
                                          checkpoint=ckpt or r.checkpoint, step=max(step, r.step))
                    continue
                self._requeue(r, ckpt or r.checkpoint, max(step, r.step),
                              f"scheduler restarted: run {r.run_id} lost")
            elif r.state is JobState.PROFILING:
                self._event(f"{r.job_id} admission starts again after a scheduler restart")

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.cfg.tick_s)
            self._wake.clear()
            try:
                self.reconcile()
            except Exception:  # the loop must survive; the error is logged with its trace
                log.exception("reconcile failed")

    def _cluster(self, ray_nodes: list[dict[str, Any]] | None = None) -> Cluster:
        """Every alive GPU node at its full size (`ray_nodes`: `ray.nodes()` if already read),
        plus the training nodes Ray's autoscaler may still launch (`SchedulerConfig.autoscaling_config`)."""
        ray_nodes = ray.nodes() if ray_nodes is None else ray_nodes
        more = (launchable_gpus(self.cfg.autoscaling_config, ray_nodes)
                if self.cfg.autoscale and self.cfg.autoscaling_config else [])
        return Cluster(node_gpus=tuple(n.gpus for n in self._cluster_nodes(ray_nodes)) + tuple(more),
                       gpu_mem_gib=self.cfg.gpu_mem_gib)

    def _profile_bundles(self) -> tuple[dict[str, float], ...]:
        """One bundle per worker of every profile that waits for capacity (admission's WAITING
        stage): added to the node request, so that a job's profiles can bring a node too."""
        from tidal.planner.profiler import PROFILE_CPUS_PER_WORKER

        b = {"CPU": PROFILE_CPUS_PER_WORKER}
        if self.cfg.profile_gpus:
            b["GPU"] = self.cfg.profile_gpus
        out: list[dict[str, float]] = []
        asked: set[str] = set()  # jobs of one workload wait for one set of profiles (SHARING)
        for a in self.admissions.values():
            if a.stage is Stage.WAITING and not a.keys & asked:
                out += [dict(b) for _ in range(a.workers)]
                asked |= a.keys
        return tuple(out)

    def _admit(self, recs: list[JobRecord], nodes: list[Node], ray_nodes: list[dict[str, Any]]) -> None:
        """Step 3: move every PROFILING job one stage on (`tidal.platform.admission`)."""
        cluster: Cluster | None = None
        for r in recs:
            if r.state is not JobState.PROFILING:
                continue
            jid, spec = r.job_id, self._spec(r)
            adm = self.admissions.get(jid)
            cluster = cluster or self._cluster(ray_nodes)
            if adm is None:
                self.admissions[jid] = admission.start_sizing(spec, cluster, self.cfg.profiling())
                continue
            if adm.stage is Stage.WAITING:  # profiles known, capacity not yet: try again
                self._start_profiles(r, spec, cluster, nodes, adm.keys, adm.workers, adm.attempts)
                continue
            if adm.stage is Stage.SHARING:  # another job measures its profiles: once none does, look again
                other = admission.measuring(self.admissions, adm.keys, but=jid)
                if other is None:
                    self.admissions[jid] = admission.start_sizing(spec, cluster, self.cfg.profiling(),
                                                                  adm.attempts)
                    self._event(f"{jid}: {adm.after}'s admission has ended; looks its profiles up")
                elif other != adm.after:
                    self.admissions[jid] = dataclasses.replace(adm, after=other)
                continue
            if not admission.done(adm):
                if (why := adm.overdue(time.time(), self.cfg.stall_s)) is not None:
                    admission.cancel(adm)  # its process, and the profile it runs, are killed
                    self._admission_failed(r, adm, admission.AdmissionHung(why))
                continue
            try:
                value = ray.get(adm.ref)
            except Exception as e:
                self._admission_failed(r, adm, e)
                continue
            if adm.stage is Stage.SIZING:  # value: the plans to measure, with their cache entries
                workers = max((p.dp for p, _ in value), default=0)
                self._start_profiles(r, spec, cluster, nodes, frozenset(k for _, k in value), workers,
                                     adm.attempts)
                continue
            options, guarantee = value
            del self.admissions[jid]
            took = time.time() - r.submitted
            self.store.transition(jid, JobState.QUEUED,
                                  f"planned in {took:.1f} s: {len(options)} options, "
                                  f"{options[0].gpus}-{options[-1].gpus} GPUs",
                                  options=tuple(options), guarantee=guarantee)
            self.metrics.admission_s.set(took, tags={"job": jid})
            self._event(f"{jid} QUEUED after {took:.1f} s of admission")
            self._wake.set()

    def _start_profiles(self, r: JobRecord, spec: JobSpec, cluster: Cluster, nodes: list[Node],
                        keys: frozenset[str], workers: int, attempts: int) -> None:
        """Reserve capacity for the job's profiles (`keys`: their cache entries) and start them;
        with nothing to measure, plan from the cache at once; while another job's admission
        measures some of them, wait for its cache entries (SHARING) instead of measuring them
        twice; with no capacity outside guaranteed jobs and other profiles, wait (the job stays
        PROFILING, its reason says so) instead of queueing tasks in Ray."""
        res: Reservation | None = None
        was = self.admissions.get(r.job_id)
        plans = len(keys)
        if plans and (other := admission.measuring(self.admissions, keys, but=r.job_id)) is not None:
            self.admissions[r.job_id] = Admission(stage=Stage.SHARING, ref=None, workers=workers,
                                                  attempts=attempts, keys=keys, after=other)
            self._event(f"{r.job_id}: {other} is measuring {len(keys & self.admissions[other].keys)} of its "
                        f"{plans} profiles (the same workload); waits for them")
            return
        if plans:
            res = self._reserve(nodes, workers)
            if res is None:
                self.admissions[r.job_id] = Admission(stage=Stage.WAITING, ref=None, workers=workers,
                                                      attempts=attempts, keys=keys)
                if was is None or was.stage is not Stage.WAITING:
                    self._event(f"{r.job_id}: {plans} profiles wait for capacity outside guaranteed jobs "
                                "and other profiles")
                return
        self.admissions[r.job_id] = admission.start_planning(spec, cluster, self.cfg.profiling(), keys, res,
                                                             attempts, owner=self._incarnation)
        self._event(f"{r.job_id}: profiling {plans} plans"
                    + (f", reserved {len(res.workers)} workers on {sorted(set(res.workers))}" if res else ""))
        self._wake.set()  # the policy makes room now, not at the next tick

    def _reserve(self, nodes: list[Node], workers: int) -> Reservation | None:
        """Capacity for `workers` profile workers (`tidal.platform.reservations.reserve`): free
        capacity first; never a guaranteed job's GPUs or another profile's."""
        from tidal.planner.profiler import PROFILE_CPUS_PER_WORKER

        held: dict[str, tuple[float, float]] = {}
        kept: dict[str, tuple[float, float]] = {}  # guaranteed jobs' GPUs: never reserved
        for r in self.store.all():
            if r.state in (JobState.RUNNING, JobState.STOPPING):
                for nid, g in r.allocation or []:
                    for into in (held, kept) if r.guarantee is not None else (held,):
                        hg, hc = into.get(nid, (0.0, 0.0))
                        into[nid] = (hg + g, hc + g * self.cfg.cpus_per_worker)
        return reserve(nodes, held, workers, gpus_per_worker=self.cfg.profile_gpus,
                       cpus_per_worker=PROFILE_CPUS_PER_WORKER, kept=kept, reserved=self._reservations())

    def _reservations(self) -> list[Reservation]:
        return [a.reservation for a in self.admissions.values() if a.reservation is not None]

    def _admission_failed(self, r: JobRecord, adm: Admission, e: Exception) -> None:
        """The job's own answer (a SpecError: it fits no plan, every profile failed) rejects it;
        a fault of the cluster starts its admission again, up to `max_admission_attempts`."""
        del self.admissions[r.job_id]
        why = admission.user_error(e)
        if why is None and adm.attempts < self.cfg.max_admission_attempts:
            self.admissions[r.job_id] = admission.start_sizing(self._spec(r), self._cluster(),
                                                               self.cfg.profiling(), adm.attempts + 1)
            what = f": {e}" if isinstance(e, admission.AdmissionHung) else ""  # else a trace
            self._event(f"{r.job_id}: admission lost to the cluster ({type(e).__name__}{what}); attempt "
                        f"{adm.attempts + 1}")
            return
        reason = why or f"admission failed {adm.attempts} times: {type(e).__name__}: {e}"
        reason = reason.splitlines()[0][:500]
        self.store.transition(r.job_id, JobState.REJECTED, reason, error=reason, finished=time.time())
        self._event(f"{r.job_id} REJECTED: {reason}")

    def _check_options(self, spec: JobSpec, options: tuple[Option, ...],
                       cluster: Cluster) -> tuple[tuple[Option, ...], float | None]:
        if not options or any(not isinstance(o, Option) for o in options):
            raise SpecError("options", "must be a non-empty sequence of tidal.core.policy.Option")
        if any(a.gpus >= b.gpus for a, b in itertools.pairwise(options)):
            raise SpecError("options", "GPU counts must increase from one option to the next")
        for o in options:
            spec.check_plan(o.plan)  # PlanError naming the plan if the job cannot run it
            if o.plan.num_gpus != o.gpus or not 0.0 < o.samples_per_s < math.inf:
                raise SpecError("options", f"option {o.plan.short()}: needs gpus == the plan's GPUs "
                                           f"and finite samples/s > 0 (got {o.samples_per_s})")
        if options[0].gpus > cluster.total:
            raise SpecError("options",
                            f"the smallest option needs {options[0].gpus} GPUs, "
                            f"the cluster has {cluster.total}")
        guarantee = None
        if spec.guaranteed:
            match = [o for o in options if o.gpus == spec.requested_gpus and o.plan == spec.plan]
            if not match:
                raise SpecError("options",
                                "a guaranteed job's options must include its own plan on requested_gpus")
            guarantee = match[0].samples_per_s
        return options, guarantee

    def _cluster_nodes(self, ray_nodes: list[dict[str, Any]] | None = None) -> list[Node]:
        """Every alive node with GPUs at its full size: what a job may ever get (admission and
        planning; the policy's snapshot sees `_nodes`)."""
        out = []
        for n in ray.nodes() if ray_nodes is None else ray_nodes:
            res = n.get("Resources", {})
            if n.get("Alive") and res.get("GPU", 0) >= 1:
                out.append(Node(node_id=n["NodeID"], gpus=int(res["GPU"]), cpus=float(res.get("CPU", 0)),
                                memory=float(res.get("memory", 1e18))))
        return sorted(out, key=lambda n: n.node_id)

    def _nodes(self, ray_nodes: list[dict[str, Any]]) -> list[Node]:
        """What each node offers Tidal now (`tidal.platform.capacity.build_nodes`): free capacity
        plus what Tidal holds — its runs, its profiles' reservations, and for `release_grace_s`
        what runs that just ended held (Ray frees a finished run's placement group a little
        later) — inference nodes only what the last loan step lent. The reservations are taken
        off again by the caller (`reservations.without`): the policy never offers them."""
        from ray._private.state import available_resources_per_node

        held: dict[str, Held] = {}

        def add(nid: str, g: float, c: float) -> None:
            h = held.get(nid, Held())
            held[nid] = Held(gpus=h.gpus + g, cpus=h.cpus + c)

        for r in self.store.all():
            if r.state in (JobState.RUNNING, JobState.STOPPING):
                for nid, g in r.allocation or []:
                    add(nid, float(g), float(g) * self.cfg.cpus_per_worker)
        for alloc in self.executor.recently_released(time.time()):
            for nid, g in alloc:
                add(nid, float(g), float(g) * self.cfg.cpus_per_worker)
        for res in self._reservations():
            for nid in set(res.workers):
                add(nid, *res.on(nid))
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
                if n.get("Alive") and pool_of(n) == "inference" and n["Resources"].get("GPU", 0) >= 1}
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
                if r.state is not JobState.RUNNING or not lent or not self.executor.has_run(r.job_id):
                    continue
                gpus = sum(int(g) for _, g in r.allocation or [])
                borrowers.append(Borrower(job_id=r.job_id, gpus=gpus, lent_by_node=lent,
                                          options=tuple(o.gpus for o in r.options),
                                          restart_s=self._restart_cost_s() or 30.0))
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
        self.executor.stop(r.job_id)
        self.stopping.setdefault(r.job_id, time.time())
        self._recorded(f"{r.job_id}'s stop", partial(self.store.transition, r.job_id, JobState.STOPPING, why))
        self._log_action("stop", r.job_id, [(n, int(g)) for n, g in r.allocation or []], "")
        self._event(f"{r.job_id} {why}")

    def _collect(self) -> None:
        """Step 1: progress of the live runs into the store; the runs that ended into states."""
        now = time.time()
        recs = {r.job_id: r for r in self.store.all()}
        for jid in list(self.executor.handles):
            p = self.executor.progress(jid)
            if not p:
                continue
            upd: dict[str, Any] = {"step": int(p["step"]), "measured_sps": float(p["samples_per_s"])}
            compute_steps(recs[jid], p, self.spent)  # remembered for `_views`, without asking the run again
            last = self.observed.get(jid)
            self.observed[jid] = now
            if last is None and (launched := self.launched.get(jid)) is not None:  # the run's first step
                self._observe_restart(start_s=now - launched)
            if self.cfg.correction is not None and last is not None:  # a run's first report: start-up
                rec = recs[jid]
                c = observe(_correction(rec), gpus=sum(int(g) for _, g in rec.allocation or []),
                            predicted=rec.predicted_sps, measured=upd["measured_sps"], dt=now - last,
                            cfg=self.cfg.correction)
                upd["sps_ratios"] = [[n, r] for n, r in c.ratios]
            try:
                self.store.update(jid, **upd)
            except StoreWriteError as e:  # progress only: the run reports again at the next tick
                log.warning("progress of %s not stored: %s", jid, e)
        self._watch()
        recs = {r.job_id: r for r in self.store.all()}
        for ended in self.executor.collect({jid: r.allocation for jid, r in recs.items()}):
            self._recorded(f"the end of {ended.job_id}'s run", partial(self._record_end, ended, time.time()))

    def _record_end(self, ended: Ended, at: float) -> None:
        """The job of a run that ended (`at`, when it was collected) goes to its next state.
        Retried whole while the state file refuses it (`_recorded`), so it writes the store before
        it changes anything else."""
        jid, rec = ended.job_id, self.store.get(ended.job_id)
        if ended.result is None:
            assert ended.error is not None
            self._run_failed(rec, ended.error, ended.history)
        else:
            self._record_result(rec, ended.result)
        self.hung.discard(jid)
        self.observed.pop(jid, None)
        self.launched.pop(jid, None)
        asked = self.stopping.pop(jid, None)
        if asked is not None and ended.result is not None and not ended.result.finished:
            self._observe_restart(stop_s=at - asked)  # stopped as asked
        r = ended.result
        if r is not None and r.aborted:  # stopped before its first step: no worker group to check
            self._event(f"{jid}: run {r.run_id} stopped before its first step (aborted)")
        elif r is not None:
            named = sorted(n for n, g in rec.allocation or [] for _ in range(int(g)))
            ran = sorted(r.worker_nodes.values())
            self.placement_checks.append({"job_id": jid, "run_id": r.run_id, "decided": named, "ran": ran})
            if named != ran:
                self._event(f"{jid}: workers ran on {ran}, the decision named {named}")

    def _record_result(self, rec: JobRecord, r: RunResult) -> None:
        """A run that returned: its job SUCCEEDED, CANCELLED (asked for), or QUEUED from the
        checkpoint it stopped with."""
        jid = rec.job_id
        self._save_curve(jid, r.history)
        fields: dict[str, Any] = {"checkpoint": r.checkpoint, "step": r.final_step, "allocation": None}
        if r.finished:
            self.store.transition(jid, JobState.SUCCEEDED, f"finished at step {r.final_step}",
                                  finished=time.time(), **fields)
            self._event(f"{jid} SUCCEEDED at step {r.final_step}")
        elif rec.cancel_requested:
            self.store.transition(jid, JobState.CANCELLED, f"cancelled at step {r.final_step}",
                                  finished=time.time(), **fields)
            self._event(f"{jid} CANCELLED at step {r.final_step}")
        else:
            self.store.transition(jid, JobState.QUEUED,
                                  f"stopped at step {r.final_step} with a checkpoint",
                                  restarts=rec.restarts + 1, **fields)
            self._event(f"{jid} stopped at step {r.final_step} for reconfiguration")

    def _watch(self) -> None:
        """Step 1: a run with no step for `stall_s` (rank 0 calls in once per step it executes;
        before its first, counted from its launch) is hung, and is aborted: `collect` then hands
        it back ended with `RunHung`, and the job resumes from its newest checkpoint. Measured
        before: one worker stopped (SIGSTOP) left its job RUNNING at the same step for good, a
        cancel left it STOPPING for good, and as a STOPPING job holds every decision back, a job
        submitted beside it sat QUEUED beside a free GPU."""
        for jid in list(self.executor.handles):
            quiet = self.executor.quiet_s(jid)  # None: not known this tick
            if quiet is not None and quiet > self.cfg.stall_s and jid not in self.hung:
                self.hung.add(jid)
                why = f"no step for {quiet:.0f} s (SchedulerConfig.stall_s {self.cfg.stall_s:g} s)"
                self.executor.abort_hung(jid, why)
                self._event(f"{jid}: its run is hung, {why}: aborted")

    def _prune(self, recs: list[JobRecord]) -> None:
        """Step 1's end: a job whose latest run or checkpoint changed has its earlier runs
        removed from storage (`executor.prune_runs`), in the background. With each run keeping
        its newest `JobSpec.keep_checkpoints`, a job holds at most its latest run's and the
        one its checkpoint is in."""
        for r in recs:
            key = (r.run_id, r.checkpoint)
            if self.pruned.get(r.job_id) != key:
                self.pruned[r.job_id] = key
                self.pruner.submit(self._prune_job, r.job_id, r.run_id, r.checkpoint)

    def _prune_job(self, job_id: str, run_id: str | None, checkpoint: str | None) -> None:
        try:
            removed = prune_runs(job_id, run_id, checkpoint)
        except Exception as e:  # storage trouble: the runs stay; a later change tries again
            log.warning("pruning %s's earlier runs failed: %s", job_id, e)
            return
        if removed:
            self._event(f"{job_id}: removed its earlier runs from storage ({', '.join(removed)})")

    def _run_failed(self, rec: JobRecord, e: Exception, history: list[dict[str, Any]]) -> None:
        """A run ended with an error. The cluster's fault (a dead worker or node, a broken
        collective: `executor.infrastructure_failure`) sends the job back to QUEUED from the
        newest checkpoint in its run's storage, counted in `restarts`, up to
        `max_infra_restarts` (`_requeue`: SUCCEEDED if that checkpoint is the whole job); the
        job's own error (its loss or model raising, a non-finite
        loss) fails it alone. A job whose cancel was asked for is CANCELLED either way.

        `history` is what the run reported up to its error. A job that ends here keeps it as its
        curve (`history()`: the loss up to the step that raised), and its record the newest
        complete checkpoint its run left, with that step (what `tidal resume` starts from); a
        requeued one keeps only the steps up to its checkpoint, since the next run computes the
        later ones again."""
        jid = rec.job_id
        error, first = _error_text(e)
        newest, at, metrics = run_checkpoints(rec.run_id)  # what the run left, if anything
        ended: dict[str, Any] = {"checkpoint": newest, "step": at} if newest is not None else {}
        if rec.cancel_requested:
            self._save_curve(jid, history)
            self.store.transition(jid, JobState.CANCELLED, f"cancelled; its run ended with {first}",
                                  allocation=None, finished=time.time(), **ended)
            return
        if infrastructure_failure(e):
            ckpt, step = newest, at
            self._save_curve(jid, metrics)
            if ckpt is None:  # nothing new: back to the checkpoint it started from
                ckpt = rec.checkpoint
                step = int(read_meta(ckpt)["step"]) if ckpt else 0
            if self._requeue(rec, ckpt, step, f"run failed for an infrastructure reason ({first})",
                             requeue=rec.restarts < self.cfg.max_infra_restarts):
                return
        self._save_curve(jid, history)
        self.store.transition(jid, JobState.FAILED, first, error=error, allocation=None, finished=time.time(),
                              **ended)
        self._event(f"{jid} FAILED: {first}")

    def _requeue(self, r: JobRecord, ckpt: str | None, step: int, why: str, *, requeue: bool = True) -> bool:
        """A running or stopping job whose run was lost (`why`) goes back to QUEUED from `ckpt`,
        counted in `restarts` (if `requeue`: else nothing happens and this returns False) -- or
        ends SUCCEEDED when `ckpt` already holds the whole job (a run killed after its last
        checkpoint, before it reported: measured, relaunching it from there raised at every tick
        and the job sat QUEUED for good)."""
        jid = r.job_id
        if checkpoint_done(self._spec(r), ckpt):
            self.store.transition(jid, JobState.SUCCEEDED, f"{why}; its checkpoint at step {step} is the "
                                  f"whole job", allocation=None, checkpoint=ckpt, step=step,
                                  restarts=r.restarts + 1, finished=time.time())
            self._event(f"{jid} SUCCEEDED at step {step} ({why} after its last checkpoint)")
            return True
        if not requeue:
            return False
        self.store.transition(jid, JobState.QUEUED, f"{why}; resumes from step {step}", allocation=None,
                              checkpoint=ckpt, step=step, restarts=r.restarts + 1)
        self._event(f"{jid} {why}; requeued from step {step}")
        return True

    def _predicted(self, r: JobRecord, a: Allocation) -> float:
        """The model's samples/s for what `a` runs, uncorrected (the correction's denominator):
        its option, or the job's own request (the policy may run a guaranteed job on it)."""
        return predicted(r.options, self._requested(r), a)

    def _requested(self, r: JobRecord) -> Option | None:
        """A guaranteed job's own request as an option: its plan on its requested GPUs, at the
        guarantee (the model's samples/s for exactly that)."""
        spec = self._spec(r)
        if r.guarantee is None or spec.plan is None or spec.requested_gpus is None:
            return None
        return Option(gpus=spec.requested_gpus, plan=spec.plan, samples_per_s=r.guarantee,
                      cpus_per_gpu=r.options[0].cpus_per_gpu if r.options else 0.0)

    def _views(self, recs: list[JobRecord]) -> list[JobView]:
        views = []
        restart_s = self._restart_cost_s()
        self.metrics.restart_s.set(restart_s)
        now = time.time()
        for r in recs:
            spec = self._spec(r)
            current = None
            running_s = 0.0
            if r.state is JobState.RUNNING and r.allocation and r.plan:
                current = Allocation(gpus_by_node=tuple((n, int(g)) for n, g in r.allocation),
                                     plan=Plan.from_dict(r.plan))
                running_s = max(0.0, now - self.launched.get(r.job_id, now))
            # the work left, in the budget's steps (an AutoLRS job's probes spend it too; a running
            # job's figure is the one `_collect` read from its run this tick)
            spent = compute_steps(r, None, self.spent)
            remaining = float(max(0, spec.total_steps - spent) * spec.global_batch)
            view = JobView(job_id=r.job_id, arrival=r.submitted, options=r.options, guarantee=r.guarantee,
                           requested=self._requested(r), current=current, restarts=r.restarts,
                           restart_cost_s=restart_s, running_s=running_s, remaining_samples=remaining,
                           admitted=r.run_id is not None)  # launched at least once
            views.append(corrected(view, _correction(r)))
        return views

    def reconcile(self) -> None:
        """One step of the loop (the module docstring's 1-4)."""
        with self.lock:
            if not self._flush():  # the store still refuses what happened: decide nothing
                self._watch()
                return
            self._collect()
            if self.unrecorded:
                return
            everything = self.store.all()
            self._prune(everything)
            self.metrics.update(everything)
            recs = [r for r in everything if not r.state.terminal]
            ray_nodes = ray.nodes()
            self._loan_step([r for r in recs if r.state.scheduled], ray_nodes)
            nodes = self._nodes(ray_nodes)
            self._admit(recs, without(nodes, self._reservations()), ray_nodes)
            recs = [r for r in self.store.all() if r.state.scheduled]
            nodes = without(self._nodes(ray_nodes), self._reservations())
            profiles = self._profile_bundles()
            if not recs:  # nothing to schedule: ask only for waiting profiles (or withdraw)
                self._request_nodes(profiles)
                return
            # runs Ray Train has registered with the autoscaler itself (tidal.core.autoscale)
            registered = frozenset(r.job_id for r in recs if r.state in (JobState.RUNNING, JobState.STOPPING)
                                   and self.executor.registered(r.job_id))
            snapshot = Snapshot(now=time.time(), nodes=tuple(nodes), jobs=tuple(self._views(recs)),
                                config=self.cfg.policy)
            if not nodes:  # no training capacity at all: every job waits
                nothing = Decision(allocations={}, reasons={}, recall_loss={}, changed=())
                self._request_nodes(node_request(snapshot, nothing, registered) + profiles)
                return
            actions = reconcile_step(snapshot, {r.job_id: r.state for r in recs})  # waits while one stops
            decision = actions.decision
            if decision is not None:
                self.reasons = dict(decision.reasons)
                self._request_nodes(node_request(snapshot, decision, registered) + profiles)
            by_id = {r.job_id: r for r in recs}
            for jid in actions.stop:
                r = by_id[jid]
                self.metrics.changes.inc(tags={"job": jid})
                new = decision.allocations.get(jid) if decision else None
                self._stop(r, f"reconfigure: {Plan.from_dict(r.plan).short() if r.plan else ''}"
                              f" → {new.plan.short() if new else 'queued'}")
            for jid, a in actions.launch:
                r = by_id[jid]
                run_id = f"{jid}-r{r.restarts}"
                try:
                    self.executor.launch(jid, self._spec(r), a, r.checkpoint, run_id)
                except Exception as e:  # one job's launch must not stop the loop for every job
                    self._launch_failed(r, e)
                    continue
                self.launched[jid] = time.time()
                sps = self._predicted(r, a)
                self._log_action("launch", jid, list(a.gpus_by_node), a.plan.short())
                self._event(f"{jid} launched: {a.plan.short()} on {dict(a.gpus_by_node)}")
                if not self._recorded(f"{jid}'s launch", partial(
                        self.store.transition, jid, JobState.RUNNING,
                        f"launched {a.plan.short()} on {dict(a.gpus_by_node)}", plan=a.plan.to_dict(),
                        allocation=[[n, g] for n, g in a.gpus_by_node], run_id=run_id, predicted_sps=sps)):
                    break  # no more runs the store does not know of

    def _recorded(self, what: str, write: Callable[[], object]) -> bool:
        """Write what the cluster already did (a run launched, a stop asked for, a run's end).
        If the state file refuses it (`StoreWriteError`, or `OSError` writing a curve: a full
        disk, a lock held elsewhere), keep it, in order, for `_flush` to write first at each
        tick, and return False; until then no tick decides anything (module docstring)."""
        if not self.unrecorded:
            try:
                write()
                return True
            except OSError as e:
                self._event(f"could not record {what} ({e}); written at a later tick, and nothing new "
                            "is decided until it is")
        self.unrecorded.append((what, write))
        return False

    def _flush(self) -> bool:
        """Write what `_recorded` kept, oldest first; False while the state file still refuses."""
        while self.unrecorded:
            what, write = self.unrecorded[0]
            try:
                write()
            except OSError:
                return False
            except Exception:  # not the storage: a bug must not hold every later decision back
                log.exception("recording %s failed; dropped", what)
            self.unrecorded.pop(0)
            self._event(f"recorded {what}")
        return True

    def _launch_failed(self, r: JobRecord, e: Exception) -> None:
        """A launch raised before its run started: the cluster's fault leaves the job QUEUED for
        the next tick; anything else (the run's own validation refusing the spec, plan or
        checkpoint) fails this job alone, with the error, instead of raising at every tick."""
        error, first = _error_text(e)
        if infrastructure_failure(e):
            self._event(f"{r.job_id} launch failed for an infrastructure reason ({first}); retried")
            return
        self.store.transition(r.job_id, JobState.FAILED, f"launch failed: {first}", error=error,
                              finished=time.time())
        self._event(f"{r.job_id} FAILED at launch: {first}")

    def _request_nodes(self, bundles: tuple[dict[str, float], ...]) -> None:
        """Register the node request with Ray's `AutoscalingCoordinator` (`()` withdraws it).

        Not `ray.autoscaler.sdk.request_resources` directly: that call replaces the cluster's one
        request, and the coordinator, which Ray Train V2 registers every run's workers with,
        resends its merge every 20 s, so a direct request lasted at most 20 s (the autoscaling
        test saw a job wait 7 minutes for nodes never launched). Sent when it changes, and again
        every `NODE_REQUEST_REFRESH_S` to keep it from expiring (`NODE_REQUEST_TTL_S` after the
        scheduler dies).

        Each send withdraws the request first, so that it is the *last* requester in the
        coordinator's merge. The autoscaler v2 checks the merged bundles as one all-or-nothing
        constraint, bin-packed in the merge's order where bundles sort alike (`_try_schedule`:
        ours and a Train run's each carry one label selector); a running job's Train registration
        is pinned by `ray.io/node-id`. With ours first, our training-pool bundles took the GPUs of
        the nodes those pinned bundles need, the whole constraint was infeasible and no node was
        ever launched: measured, a job larger than the cluster waited forever (the autoscaling
        test, whenever the running job's Train run registered after our request). Last, ours
        ask exactly for what the registered runs leave. A run registering after our send is
        ahead of us from our next refresh on.
        """
        now = time.monotonic()
        if not self.cfg.autoscale or (bundles == self.node_request
                                      and now - self.node_request_at < NODE_REQUEST_REFRESH_S):
            return
        if now - self.node_request_failed_at < NODE_REQUEST_RETRY_S:  # one event per failure, not per tick
            return
        try:  # each bundle on the training pool: Ray's autoscaler v2 honours the selector, v1 ignores it
            # the module Ray Train V2 takes it from (internal to Ray: an import error is an event)
            from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
                ResourceRequestPriority,
                get_or_create_autoscaling_coordinator,
            )

            coordinator = get_or_create_autoscaling_coordinator()
            if bundles:  # withdrawn and sent again: last in the merge (docstring)
                ray.get(coordinator.cancel_request.remote(NODE_REQUESTER), timeout=10)
                done = coordinator.request_resources.remote(
                    requester_id=NODE_REQUESTER, resources=[dict(b) for b in bundles],
                    label_selectors=[dict(TRAINING_SELECTOR) for _ in bundles],
                    expire_after_s=NODE_REQUEST_TTL_S, priority=ResourceRequestPriority.HIGH)
            else:
                done = coordinator.cancel_request.remote(NODE_REQUESTER)
            ray.get(done, timeout=10)
        except Exception as e:  # no autoscaler to take it: tried again after NODE_REQUEST_RETRY_S
            self.node_request_failed_at = now
            self._event(f"autoscaler request failed: {e}")
            return
        changed, self.node_request, self.node_request_at = bundles != self.node_request, bundles, now
        if changed:
            gpus = sum(b.get("GPU", 0.0) for b in bundles)
            self._event(f"asked the autoscaler for {gpus:g} GPUs in {len(bundles)} bundles" if bundles
                        else "withdrew the autoscaler request: nothing waits")

    def _log_action(self, kind: str, job_id: str, gpus: list[tuple[str, int]], plan: str) -> None:
        self.action_log.append((time.time(), kind, job_id, tuple(gpus), plan))


def _error_text(e: Exception) -> tuple[str, str]:
    """A run's or launch's error as stored (at most 4,000 characters) and as its one-line note
    (`error_note`). A longer text keeps its note, then its end: the note of what is stored is
    the same line (`tidal status` and `tidal events` say the same)."""
    text = f"{type(e).__name__}: {e}"
    note = error_note(text)
    if len(text) > 4000:
        text = f"{note}\n[...]\n{text[-(4000 - len(note) - 7):]}"
    return text, note


def error_note(text: str) -> str:
    """An error text's one line: its first line; when it carries a traceback, the traceback's
    last line, which names the exception raised; when its first line announces more (ends with
    ':'), that line and the text's last. Ray Train's `WorkerGroupError` starts "Training failed
    due to worker errors:" and ends with the worker's traceback (e.g. `...NonFiniteLoss:
    non-finite loss at step 30: nan`); its `ControllerError` is "Training failed due to
    controller error:" and the controller's error, without a traceback."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    if "Traceback (most recent call last):" in text:
        note = lines[-1]
    elif len(lines) > 1 and lines[0].endswith(":"):
        note = f"{lines[0]} {lines[-1]}"
    else:
        note = lines[0]
    return note[:160]


def resume_source(store: Store, checkpoint: str) -> str | None:
    """The job that wrote `checkpoint` (`executor.checkpoint_owner`), if `store` knows it; a
    SpecError naming `JobSpec.resume_from` if that job has not ended: its run keeps only its
    newest checkpoints and the scheduler removes its earlier runs, so the checkpoint may go."""
    owner = checkpoint_owner(checkpoint)
    try:
        r = store.get(owner) if owner else None
    except KeyError:
        return None
    if r is not None and not r.state.terminal:
        raise SpecError("JobSpec.resume_from", f"{checkpoint} is job {owner}'s, which is "
                                               f"{r.state.value}: resume from it once it has ended")
    return owner


def compute_steps(r: JobRecord, progress: dict[str, Any] | None,
                  seen: dict[str, tuple[str, int, bool]]) -> int:
    """The steps job `r`'s budget has spent (`JobSpec.total_steps` counts these): its data
    position `step`, plus, for an AutoLRS job, its losing probes' steps (`tidal.jobs.autolrs`).
    From its live run's `progress`, else from its last checkpoint's meta, else the data
    position. `seen` (job → (checkpoint, steps, from a live run)) reads each checkpoint once and
    keeps a running job's last figure for the moment between its run's end and the store
    catching up (else the status would fall back to the data position for a tick)."""
    key = r.checkpoint or ""
    if progress and "compute_steps" in progress:
        spent = max(int(progress["compute_steps"]), int(progress["step"]), r.step)
        seen[r.job_id] = (key, spent, True)
        return spent
    known = seen.get(r.job_id)
    live = r.state in (JobState.RUNNING, JobState.STOPPING)
    if known is None or known[0] != key or (known[2] and not live):
        spent = r.step
        if r.checkpoint is not None:
            try:
                spent = int(read_meta(r.checkpoint).get("compute_steps", r.step))
            except (OSError, ValueError, CheckpointError):  # gone or unreadable: the position
                spent = r.step
        known = seen[r.job_id] = (key, spent, False)
    return max(r.step, known[1])


def _correction(r: JobRecord) -> Correction:
    """The job's online correction as the store keeps it (`JobRecord.sps_ratios`)."""
    return Correction(ratios=tuple((int(n), float(x)) for n, x in r.sps_ratios))
