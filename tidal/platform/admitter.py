"""The admission driver: moves each PROFILING job through its admission stages, one per tick.

The stages and their allowed moves are `tidal.platform.admission.ALLOWED`: every change of a
job's stage is checked against it (`_Stages`), as `Store.transition` checks a job's state. The
tasks each stage runs (off the actor) are in `tidal.platform.admission`; this module decides
when to start them, with what capacity reserved (`tidal.platform.reservations`), and what their
answers mean: QUEUED with the resource matrix, REJECTED with the reason, or another attempt
after a fault of the cluster (up to `SchedulerConfig.max_admission_attempts`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import ray

from tidal.core.policy import Node
from tidal.jobs.spec import JobSpec
from tidal.planner.jobplan import Cluster
from tidal.platform import admission
from tidal.platform.admission import Admission, Stage
from tidal.platform.capacity import held_by_node
from tidal.platform.config import SchedulerConfig
from tidal.platform.metrics import Metrics
from tidal.platform.reservations import Reservation, reserve
from tidal.platform.store import JobRecord, JobState, Store


class Admitter:
    """Every PROFILING job's admission stage (`stages`, by job: in memory, so a restarted actor
    starts them again from SIZING; the profile cache keeps what was measured)."""

    def __init__(self, store: Store, cfg: SchedulerConfig, metrics: Metrics, incarnation: str,
                 cluster: Callable[[list[dict[str, Any]]], Cluster], spec_of: Callable[[JobRecord], JobSpec],
                 note: Callable[[str], None], wake: Callable[[], None]) -> None:
        self.store, self.cfg, self.metrics, self.incarnation = store, cfg, metrics, incarnation
        self.cluster, self.spec_of, self.note, self.wake = cluster, spec_of, note, wake
        self.stages = _Stages()

    def cancel(self, job_id: str) -> None:
        """A cancelled PROFILING job: its stage ends, and its task (and the profile it runs) is
        killed."""
        adm = self.stages.pop(job_id, None)
        if adm is not None and adm.ref is not None:
            admission.cancel(adm)

    def row(self, job_id: str) -> tuple[str, int, list[str]]:
        """What `tidal status` shows of a PROFILING job: its reason, and the GPUs and nodes its
        profiles hold."""
        adm = self.stages.get(job_id)
        reason = adm.reason() if adm else "waiting for the scheduler's next step"
        res = adm.reservation if adm else None
        gpus = math.ceil(len(res.workers) * res.gpus_per_worker - 1e-9) if res else 0
        return reason, gpus, sorted(set(res.workers)) if res else []

    def step(self, recs: list[JobRecord], nodes: list[Node], ray_nodes: list[dict[str, Any]]) -> None:
        """Move every PROFILING job one stage on (the loop's step 3)."""
        cluster: Cluster | None = None
        for r in recs:
            if r.state is not JobState.PROFILING:
                continue
            jid, spec = r.job_id, self.spec_of(r)
            adm = self.stages.get(jid)
            cluster = cluster or self.cluster(ray_nodes)
            if adm is None:
                self.stages[jid] = admission.start_sizing(spec, cluster, self.cfg.profiling())
                continue
            if adm.stage is Stage.WAITING:  # profiles known, capacity not yet: try again
                self.start_profiles(r, spec, cluster, nodes, adm.keys, adm.workers, adm.attempts)
                continue
            if adm.stage is Stage.SHARING:  # another job measures its profiles: once none does, look again
                other = admission.measuring(self.stages, adm.keys, but=jid)
                if other is None:
                    self.stages[jid] = admission.start_sizing(spec, cluster, self.cfg.profiling(),
                                                                  adm.attempts)
                    self.note(f"{jid}: {adm.after}'s admission has ended; looks its profiles up")
                elif other != adm.after:
                    self.stages[jid] = dataclasses.replace(adm, after=other)
                continue
            if not admission.done(adm):
                if (why := adm.overdue(time.time(), self.cfg.stall_s)) is not None:
                    admission.cancel(adm)  # its process, and the profile it runs, are killed
                    self.failed(r, adm, admission.AdmissionHung(why))
                continue
            try:
                value = ray.get(adm.ref)
            except Exception as e:
                self.failed(r, adm, e)
                continue
            if adm.stage is Stage.SIZING:  # value: the plans to measure, with their cache entries
                workers = max((p.dp for p, _ in value), default=0)
                self.start_profiles(r, spec, cluster, nodes, frozenset(k for _, k in value), workers,
                                     adm.attempts)
                continue
            options, guarantee = value
            del self.stages[jid]
            took = time.time() - r.submitted
            self.store.transition(jid, JobState.QUEUED,
                                  f"planned in {took:.1f} s: {len(options)} options, "
                                  f"{options[0].gpus}-{options[-1].gpus} GPUs",
                                  options=tuple(options), guarantee=guarantee)
            self.metrics.admission_s.set(took, tags={"job": jid})
            self.note(f"{jid} QUEUED after {took:.1f} s of admission")
            self.wake()

    def start_profiles(self, r: JobRecord, spec: JobSpec, cluster: Cluster, nodes: list[Node],
                        keys: frozenset[str], workers: int, attempts: int) -> None:
        """Reserve capacity for the job's profiles (`keys`: their cache entries) and start them;
        with nothing to measure, plan from the cache at once; while another job's admission
        measures some of them, wait for its cache entries (SHARING) instead of measuring them
        twice; with no capacity outside guaranteed jobs and other profiles, wait (the job stays
        PROFILING, its reason says so) instead of queueing tasks in Ray."""
        res: Reservation | None = None
        was = self.stages.get(r.job_id)
        plans = len(keys)
        if plans and (other := admission.measuring(self.stages, keys, but=r.job_id)) is not None:
            self.stages[r.job_id] = Admission(stage=Stage.SHARING, ref=None, workers=workers,
                                                  attempts=attempts, keys=keys, after=other)
            self.note(f"{r.job_id}: {other} is measuring {len(keys & self.stages[other].keys)} of its "
                        f"{plans} profiles (the same workload); waits for them")
            return
        if plans:
            res = self.reserve(nodes, workers)
            if res is None:
                self.stages[r.job_id] = Admission(stage=Stage.WAITING, ref=None, workers=workers,
                                                      attempts=attempts, keys=keys)
                if was is None or was.stage is not Stage.WAITING:
                    self.note(f"{r.job_id}: {plans} profiles wait for capacity outside guaranteed jobs "
                                "and other profiles")
                return
        self.stages[r.job_id] = admission.start_planning(spec, cluster, self.cfg.profiling(), keys, res,
                                                             attempts, owner=self.incarnation)
        self.note(f"{r.job_id}: profiling {plans} plans"
                    + (f", reserved {len(res.workers)} workers on {sorted(set(res.workers))}" if res else ""))
        self.wake()  # the policy makes room now, not at the next tick

    def reserve(self, nodes: list[Node], workers: int) -> Reservation | None:
        """Capacity for `workers` profile workers (`tidal.platform.reservations.reserve`): free
        capacity first; never a guaranteed job's GPUs or another profile's."""
        from tidal.planner.profiler import PROFILE_CPUS_PER_WORKER

        live = [r for r in self.store.all() if r.state in (JobState.RUNNING, JobState.STOPPING)]
        cpus = self.cfg.cpus_per_worker
        held = {n: (h.gpus, h.cpus) for n, h in held_by_node((r.allocation for r in live), cpus).items()}
        kept = {n: (h.gpus, h.cpus) for n, h in  # guaranteed jobs' GPUs: never reserved
                held_by_node((r.allocation for r in live if r.guarantee is not None), cpus).items()}
        return reserve(nodes, held, workers, gpus_per_worker=self.cfg.profile_gpus,
                       cpus_per_worker=PROFILE_CPUS_PER_WORKER, kept=kept, reserved=self.reservations())

    def reservations(self) -> list[Reservation]:
        return [a.reservation for a in self.stages.values() if a.reservation is not None]

    def failed(self, r: JobRecord, adm: Admission, e: Exception) -> None:
        """The job's own answer (a SpecError: it fits no plan, every profile failed) rejects it;
        a fault of the cluster starts its admission again, up to `max_admission_attempts`."""
        del self.stages[r.job_id]
        why = admission.user_error(e)
        if why is None and adm.attempts < self.cfg.max_admission_attempts:
            self.stages[r.job_id] = admission.start_sizing(self.spec_of(r), self.cluster(ray.nodes()),
                                                               self.cfg.profiling(), adm.attempts + 1)
            what = f": {e}" if isinstance(e, admission.AdmissionHung) else ""  # else a trace
            self.note(f"{r.job_id}: admission lost to the cluster ({type(e).__name__}{what}); attempt "
                        f"{adm.attempts + 1}")
            return
        reason = why or f"admission failed {adm.attempts} times: {type(e).__name__}: {e}"
        reason = reason.splitlines()[0][:500]
        self.store.transition(r.job_id, JobState.REJECTED, reason, error=reason, finished=time.time())
        self.note(f"{r.job_id} REJECTED: {reason}")

    def profile_bundles(self) -> tuple[dict[str, float], ...]:
        """One bundle per worker of every profile that waits for capacity (admission's WAITING
        stage): added to the node request, so that a job's profiles can bring a node too."""
        from tidal.planner.profiler import PROFILE_CPUS_PER_WORKER

        b = {"CPU": PROFILE_CPUS_PER_WORKER}
        if self.cfg.profile_gpus:
            b["GPU"] = self.cfg.profile_gpus
        out: list[dict[str, float]] = []
        asked: set[str] = set()  # jobs of one workload wait for one set of profiles (SHARING)
        for a in self.stages.values():
            if a.stage is Stage.WAITING and not a.keys & asked:
                out += [dict(b) for _ in range(a.workers)]
                asked |= a.keys
        return tuple(out)


class StageError(RuntimeError):
    """A move between admission stages that `admission.ALLOWED` does not allow: a bug."""


class _Stages(dict[str, Admission]):
    """Each PROFILING job's admission, by job; setting one checks the move (`admission.ALLOWED`),
    removing one ends it."""

    def __setitem__(self, job_id: str, adm: Admission) -> None:
        old = self.get(job_id)
        if adm.stage not in admission.ALLOWED[old.stage if old is not None else None]:
            raise StageError(f"admission of {job_id}: {old.stage.value if old else 'none'} → "
                             f"{adm.stage.value} is not an allowed move")
        super().__setitem__(job_id, adm)
