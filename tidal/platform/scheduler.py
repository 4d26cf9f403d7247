"""The Tidal scheduler: a named, detached Ray actor (`tidal-scheduler` in namespace `tidal`).

It holds the jobs in SQLite (`tidal.platform.store`, the one state machine of
`tidal.core.state`) and every `tick_s`, or at once on an event, runs one reconcile step — an
explicit controller loop (`reconcile`):

    0. write first what the cluster already did that the state file refused (`recording`);
       until it is written, decide nothing;
    1. collect runs that ended (`runs.RunTracker`): SUCCEEDED, back to QUEUED with their
       checkpoint (a reconfiguration, a reclaim, or a fault of the cluster), or FAILED (the
       job's own error); abort hung runs; remove a job's earlier runs from storage;
    2. the loan step (`lending`): Serve's demand → inference GPUs lendable to training →
       reclaims;
    3. admission (`admitter`): each PROFILING job is sized and profiled by Ray tasks off this
       actor, in capacity reserved for it; it becomes QUEUED with its resource matrix or
       REJECTED with the reason;
    4. snapshot what each node offers Tidal now and the scheduled jobs (`snapshots`), and call
       the pure policy through the reconcile step both executors share
       (`tidal.core.controller.reconcile_step`): running jobs whose allocation or plan changes
       are asked to stop at their next step boundary with a checkpoint (→ STOPPING); when
       nothing is stopping, queued jobs with an allocation are launched on exactly the nodes
       the decision names (→ RUNNING); a launch its run refuses fails that job alone;
    5. ask Ray's autoscaler for the nodes waiting jobs and profiles need (`noderequest`).

`submit` validates cheaply (the spec's type, the GPUs the cluster could ever give it), stores
the job PROFILING and returns its id: nothing slow runs in the actor. The SDK's dry run has
already built the model and taken one step on the client (`tidal.jobs.dryrun`).

A restarted actor (`max_restarts=-1`), or one `tidal start` brings up after one was lost for
good, reopens the store. Runs are driven by the cluster's run host (`runhost`), not by this
actor, so they outlive it: the jobs it had RUNNING or STOPPING whose runs are still there are
adopted as they are, and the policy, whose inputs all come from the store and the cluster,
decides about them as before; a job whose run is gone (the host died, or Ray restarted) returns
to QUEUED from the newest checkpoint under its run's storage directory (`RunTracker.recover`).
PROFILING jobs start their admission again (the profile cache keeps what was measured).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
import uuid
from collections import deque
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import ray

from tidal.core.autoscale import node_request
from tidal.core.controller import ActionRecord, reconcile_step
from tidal.core.gcpause import paused_gc
from tidal.core.policy import Decision, JobView, Node, Option, Snapshot
from tidal.jobs.checkpoint import read_metrics
from tidal.jobs.codeship import keep_package
from tidal.jobs.spec import JobSpec, Plan, SpecError
from tidal.jobs.storage import check_storage, resume_point
from tidal.planner.jobplan import Cluster, check_fits
from tidal.platform import snapshots
from tidal.platform.admitter import Admitter
from tidal.platform.config import SchedulerConfig
from tidal.platform.curves import Curves
from tidal.platform.errors import error_note, error_text
from tidal.platform.executor import Executor, checkpoint_owner, run_checkpoints
from tidal.platform.lending import Lending
from tidal.platform.metrics import Metrics
from tidal.platform.noderequest import NodeRequester
from tidal.platform.outcome import infrastructure_failure
from tidal.platform.recording import Recorder
from tidal.platform.registry import record_state_path
from tidal.platform.reservations import without
from tidal.platform.runs import LOG_LIMIT, RunTracker, compute_steps
from tidal.platform.snapshots import predicted_sps
from tidal.platform.store import JobRecord, JobState, Store, state_dir
from tidal.serving.demand import ServeDemand, current_running

log = logging.getLogger("tidal.scheduler")


class Scheduler:
    """The actor's body (wrapped by `ray.remote` in `tidal.platform.sdk`): its API, and the loop
    of the module docstring over the parts that do each step."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.cfg = config or SchedulerConfig()
        path = Path(self.cfg.state_path) if self.cfg.state_path else state_dir() / "tidal.sqlite"
        self.store = Store(path)
        record_state_path(str(path.resolve()))  # the cluster's state file from now on (registry)
        self.curves = Curves(path.parent / "curves")
        self.executor = Executor(cpus_per_worker=self.cfg.cpus_per_worker, max_failures=self.cfg.max_failures,
                                 release_grace_s=self.cfg.release_grace_s)
        self.lock = threading.RLock()
        # in-memory logs of a long-lived actor: bounded (the store and the logger keep the rest)
        self.events: deque[str] = deque(maxlen=200)
        self.action_log: deque[ActionRecord] = deque(maxlen=LOG_LIMIT)
        self.metrics = Metrics()
        self.specs: dict[str, JobSpec] = {}
        self.reasons: dict[str, str] = {}  # why a queued job waits, from the last decision
        self._incarnation = uuid.uuid4().hex  # this actor's life: a restart is another
        self._wake = threading.Event()
        self.recorder = Recorder(self._event)
        self.runs = RunTracker(self.store, self.executor, self.cfg, self.curves, self.recorder,
                               self._event, self._spec)
        self.admitter = Admitter(self.store, self.cfg, self.metrics, self._incarnation, self._cluster,
                                 self._spec, self._event, self._wake.set)
        self.serve_demand = ServeDemand()
        self.lending = Lending(self.cfg.loans, self.metrics, self.store, self._event,
                               keep=self.serve_demand.publish)
        self.nodes = NodeRequester(self.cfg.autoscale, self._event)
        self.runs.recover()
        if any(not r.state.terminal for r in self.store.all()):
            self.executor.warm()  # jobs to launch: the run host starts now, not under the lock
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
        cluster = self._cluster(ray.nodes())
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
                curve = [*(self.curves.read(source) if source else []), *read_metrics(start[0])]
                self.curves.save(job_id, [m for m in curve if int(m["step"]) <= start[1]])
        self._event(f"{job_id} {note}")
        self.executor.warm()
        self._wake.set()
        return job_id

    def keep_package(self, name: str, data: bytes) -> str:
        """Keep a job's zipped code (`codeship.ship` sends it) in the runs' storage; its
        `file://` URI, which the job's runtime_env then names."""
        return keep_package(check_storage(), name, data)

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

    def job_events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's state changes, oldest first (`tidal events JOB`)."""
        return [{"t": e.t, "from": e.from_state, "to": e.to_state, "note": e.note}
                for e in self.store.events(job_id)]

    def cancel(self, job_id: str) -> None:
        """Cancel a job in any state that has not ended: a PROFILING job's admission tasks are
        stopped; a running job checkpoints and stops, then is CANCELLED. One that has ended is a
        ValueError saying how (a cancel that did nothing must not read as done)."""
        with self.lock:
            r = self.store.get(job_id)
            if r.state.terminal:
                raise ValueError(f"{job_id} has already ended ({r.state.value}): nothing to cancel")
            if r.state is JobState.PROFILING:
                self.admitter.cancel(job_id)
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
        steps = {int(m["step"]): m for m in self.curves.read(job_id)}
        for m in self.executor.history(job_id):
            steps[int(m["step"])] = m
        return [steps[k] for k in sorted(steps)]

    def placements(self) -> list[dict[str, Any]]:
        """For every run that ended (but runs aborted before their first step: no workers): the
        nodes the decision named and where the workers ran."""
        return list(self.runs.placement_checks)

    def recent_events(self) -> list[str]:
        return list(self.events)

    def restart_cost(self) -> dict[str, Any]:
        """What the policy charges a restart now, and the measurements behind it (seconds)."""
        return {"seconds": self.runs.restart_cost_s(), "pinned": self.cfg.restart_cost_s is not None,
                "measured_s": self.runs.restart.seconds, "starts": list(self.runs.restart.starts),
                "stops": list(self.runs.restart.stops)}

    def pools(self) -> dict[str, Any]:
        """The inference pool's loan state (total, lendable and lent GPUs, Serve's replicas)."""
        return dict(self.lending.state)

    def actions(self) -> list[ActionRecord]:
        """Every stop and launch this actor applied: (time, stop|launch, job, GPUs per node, plan),
        the same record the simulator keeps (the conformance suite compares the two)."""
        return list(self.action_log)

    # -- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.cfg.tick_s)
            self._wake.clear()
            try:
                self.reconcile()
            except Exception:  # the loop must survive; the error is logged with its trace
                log.exception("reconcile failed")

    def reconcile(self) -> None:
        """One step of the loop (the module docstring's 0-5)."""
        with self.lock:
            if not self.recorder.flush():  # the store still refuses what happened: decide nothing
                self.runs.watch()
                return
            self.runs.collect()
            if self.recorder.pending:
                return
            everything = self.store.all()
            self.runs.prune(everything)
            self.metrics.update(everything)
            recs = [r for r in everything if not r.state.terminal]
            ray_nodes = ray.nodes()
            scheduled = [r for r in recs if r.state.scheduled]
            for r, why in self.lending.step(scheduled, ray_nodes, self.serve_demand, self.executor.has_run,
                                            self.runs.restart_cost_s(), self._step_s, now=time.time(),
                                            serve_running=current_running):
                self._stop(r, why)
            nodes = self._nodes(ray_nodes)
            self.admitter.step(recs, without(nodes, self.admitter.reservations()), ray_nodes)
            recs = [r for r in self.store.all() if r.state.scheduled]
            nodes = without(self._nodes(ray_nodes), self.admitter.reservations())
            profiles = self.admitter.profile_bundles()
            if not recs:  # nothing to schedule: ask only for waiting profiles (or withdraw)
                self.nodes.request(profiles)
                return
            # runs Ray Train has registered with the autoscaler itself (tidal.core.autoscale)
            registered = frozenset(r.job_id for r in recs if r.state in (JobState.RUNNING, JobState.STOPPING)
                                   and self.executor.registered(r.job_id))
            snapshot = Snapshot(now=time.time(), nodes=tuple(nodes), jobs=tuple(self._views(recs)),
                                config=self.cfg.policy)
            if not nodes:  # no training capacity at all: every job waits
                nothing = Decision(allocations={}, reasons={}, recall_loss={}, changed=())
                self.nodes.request(node_request(snapshot, nothing, registered) + profiles)
                return
            with paused_gc():  # a round's garbage is freed by reference counting (`tidal.core.gcpause`)
                actions = reconcile_step(snapshot, {r.job_id: r.state for r in recs})  # waits while one stops
            decision = actions.decision
            if decision is not None:
                self.reasons = dict(decision.reasons)
                self.nodes.request(node_request(snapshot, decision, registered) + profiles)
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
                    at = self.executor.launch(jid, self._spec(r), a, r.checkpoint, run_id)
                except Exception as e:  # one job's launch must not stop the loop for every job
                    self._launch_failed(r, e)
                    continue
                self.runs.launched(jid, at)
                sps = predicted_sps(r, self._spec(r), a)
                self._log_action("launch", jid, list(a.gpus_by_node), a.plan.short())
                self._event(f"{jid} launched: {a.plan.short()} on {dict(a.gpus_by_node)}")
                if not self.recorder.write(f"{jid}'s launch", partial(
                        self.store.transition, jid, JobState.RUNNING,
                        f"launched {a.plan.short()} on {dict(a.gpus_by_node)}", plan=a.plan.to_dict(),
                        allocation=[[n, g] for n, g in a.gpus_by_node], run_id=run_id, predicted_sps=sps)):
                    break  # no more runs the store does not know of

    def _cluster(self, ray_nodes: list[dict[str, Any]]) -> Cluster:
        return snapshots.cluster(self.cfg, ray_nodes)

    def _nodes(self, ray_nodes: list[dict[str, Any]]) -> list[Node]:
        """What each node offers Tidal now (`snapshots.offered_nodes`)."""
        from ray._private.state import available_resources_per_node

        held = [*(r.allocation for r in self.store.all() if r.state in (JobState.RUNNING, JobState.STOPPING)),
                *self.executor.recently_released(time.time())]
        reserved = self.admitter.reservations()
        return snapshots.offered_nodes(ray_nodes, available_resources_per_node(), held, reserved,
                                       self.lending.state, self.cfg.cpus_per_worker)

    def _step_s(self, r: JobRecord) -> float:
        """Seconds per step of job `r`'s run as measured (0 before its first report)."""
        return self._spec(r).global_batch / r.measured_sps if r.measured_sps else 0.0

    def _views(self, recs: list[JobRecord]) -> list[JobView]:
        restart_s = self.runs.restart_cost_s()
        self.metrics.restart_s.set(restart_s)
        now = time.time()
        return [snapshots.job_view(r, self._spec(r), restart_s, self.runs.running_s(r.job_id, now),
                                   self.runs.spent) for r in recs]

    def _stop(self, r: JobRecord, why: str) -> None:
        """Ask a running job to stop at its next step boundary with a checkpoint (→ STOPPING)."""
        self.executor.stop(r.job_id)
        self.runs.stop_asked(r.job_id, time.time())
        stopping = partial(self.store.transition, r.job_id, JobState.STOPPING, why)
        self.recorder.write(f"{r.job_id}'s stop", stopping)
        self._log_action("stop", r.job_id, [(n, int(g)) for n, g in r.allocation or []], "")
        self._event(f"{r.job_id} {why}")

    def _launch_failed(self, r: JobRecord, e: Exception) -> None:
        """A launch raised before its run started: the cluster's fault leaves the job QUEUED for
        the next tick; anything else (the run's own validation refusing the spec, plan or
        checkpoint) fails this job alone, with the error, instead of raising at every tick."""
        error, first = error_text(e)
        if infrastructure_failure(e):
            self._event(f"{r.job_id} launch failed for an infrastructure reason ({first}); retried")
            return
        self.store.transition(r.job_id, JobState.FAILED, f"launch failed: {first}", error=error,
                              finished=time.time())
        self._event(f"{r.job_id} FAILED at launch: {first}")

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

    def _row(self, r: JobRecord) -> dict[str, Any]:
        p = self.executor.progress(r.job_id)
        spec = self._spec(r)
        step = int((p or {}).get("step", r.step))
        compute = compute_steps(r, p, self.runs.spent)
        sps = float((p or {}).get("samples_per_s", r.measured_sps) or 0.0)
        running = r.state in (JobState.RUNNING, JobState.STOPPING)
        eta = max(0, spec.total_steps - compute) * spec.global_batch / sps if running and sps > 0 else None
        gpus, nodes = sum(g for _, g in r.allocation or []), [n for n, _ in r.allocation or []]
        believed = snapshots.believed_sps(r, int(gpus))
        reason = self.reasons.get(r.job_id, "") if r.state is JobState.QUEUED else ""
        if r.state is JobState.PROFILING:
            reason, gpus, nodes = self.admitter.row(r.job_id)
        return {
            "total_steps": spec.total_steps, "eta_s": eta, "reason": reason,
            "job_id": r.job_id, "name": r.name, "state": r.state.value,
            "plan": Plan.from_dict(r.plan).short() if r.plan else "",
            "gpus": gpus, "nodes": nodes, "allocation": [[n, int(g)] for n, g in r.allocation or []]
            if running else [], "predicted_sps": believed, "model_sps": r.predicted_sps, "measured_sps": sps,
            "step": step, "compute_steps": compute, "restarts": r.restarts, "error": r.error,
            "error_line": error_note(r.error) if r.error else "",  # what `tidal events` notes
            "checkpoint": r.checkpoint,
            "sps_ratios": r.sps_ratios,  # the online correction: [[gpus, measured ÷ predicted], ...]
        }

    def _spec(self, r: JobRecord) -> JobSpec:
        """The job's spec, unpickled once per job."""
        if r.job_id not in self.specs:
            from ray import cloudpickle

            self.specs[r.job_id] = cloudpickle.loads(r.spec)
        return self.specs[r.job_id]

    def _event(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        self.events.append(line)
        log.info(line)

    def _log_action(self, kind: str, job_id: str, gpus: list[tuple[str, int]], plan: str) -> None:
        self.action_log.append((time.time(), kind, job_id, tuple(gpus), plan))


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
