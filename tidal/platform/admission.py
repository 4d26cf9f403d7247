"""Admission off the scheduler actor: each PROFILING job is planned by Ray tasks of its own.

`submit` only stores the job (PROFILING) and returns its id. The scheduler's loop then moves
every PROFILING job through two stages, each a Ray task, so that nothing a user's code does —
build a large model, profile for minutes, raise — runs in the actor or blocks its API:

    SIZING     task `to_measure`: builds the model once, returns the profiles not yet cached
    SHARING    (only while another job's admission measures some of the same profiles: a
               sweep's jobs share a workload; then SIZING again, which finds them cached)
    WAITING    (only while nothing outside guaranteed jobs and other profiles can host them)
    PROFILING  the scheduler reserves capacity for the largest of them (if any;
               `tidal.platform.reservations`) and starts task `plan`
               (`tidal.planner.jobplan.plan_job` pinned to the reserved nodes)
    done       → QUEUED with the resource matrix, or REJECTED with the reason

Independent submissions profile at once, each in capacity of its own; a reservation takes free
capacity first, so a profile preempts a running job only when nothing free can host it. Both
tasks take no CPU of their own (they orchestrate: the profiles' workers ask for theirs), so a
full cluster cannot starve them. The stage lives in memory: a restarted actor finds the job
PROFILING in the store and starts again from SIZING, and the profile cache keeps what was
already measured.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RuntimeEnvSetupError

from tidal.core.policy import Option
from tidal.jobs.codeship import env_setup_line
from tidal.jobs.spec import JobSpec, Plan, SpecError
from tidal.planner.jobplan import Cluster, ProfileConfig, plan_job, to_measure
from tidal.platform.reservations import Reservation


class Stage(enum.Enum):
    SIZING = "sizing"
    SHARING = "sharing"  # another job measures its profiles (no task runs)
    WAITING = "waiting"  # profiles known, no capacity to reserve for them yet (no task runs)
    PROFILING = "profiling"


# The moves `tidal.platform.admitter.Admitter` may make between stages (None: no admission yet).
# An admission may end from any stage (QUEUED, REJECTED, cancelled, or lost with the actor); a
# fault of the cluster ends it and starts a new one at SIZING.
ALLOWED: dict[Stage | None, frozenset[Stage]] = {
    None: frozenset({Stage.SIZING}),
    Stage.SIZING: frozenset({Stage.SHARING, Stage.WAITING, Stage.PROFILING}),
    Stage.SHARING: frozenset({Stage.SHARING, Stage.SIZING}),
    Stage.WAITING: frozenset({Stage.WAITING, Stage.SHARING, Stage.PROFILING}),
    Stage.PROFILING: frozenset(),
}


@dataclass(frozen=True, kw_only=True)
class Admission:
    """Where one PROFILING job's admission is: its stage, the task running it, its reservation."""

    stage: Stage
    ref: Any  # ray.ObjectRef of the stage's task (None while WAITING)
    workers: int = 0  # workers the largest of them takes at once
    reservation: Reservation | None = None
    attempts: int = 1
    keys: frozenset[str] = frozenset()  # the cache entries of the profiles to measure
    after: str = ""  # SHARING: the job whose admission measures them
    started: float = 0.0  # when the stage's task started (time.time())

    @property
    def plans(self) -> int:
        """Profiles to measure (SHARING, WAITING and PROFILING stages): one cache entry each."""
        return len(self.keys)

    def overdue(self, now: float, stall_s: float) -> str | None:
        """Why the stage's task counts as hung at `now`, or None: sizing for longer than
        `stall_s`, profiling for longer than `stall_s` per plan it measures, plus one for the
        fit (a dataset on a mount that hangs, a profile worker that stops or deadlocks in a
        collective never answer; the job would stay PROFILING, holding its reservation)."""
        if self.ref is None or self.stage not in (Stage.SIZING, Stage.PROFILING):
            return None
        limit = stall_s * (1 + self.plans) if self.stage is Stage.PROFILING else stall_s
        if now - self.started <= limit:
            return None
        what = f"profiling {self.plans} plans" if self.stage is Stage.PROFILING else "sizing"
        return (f"{what} took more than {limit:.0f} s (SchedulerConfig.stall_s {stall_s:g} s"
                + (" per plan, plus one)" if self.stage is Stage.PROFILING else ")"))

    def reason(self) -> str:
        if self.stage is Stage.SIZING:
            return "sizing: building the model, looking up cached profiles"
        if self.stage is Stage.SHARING:
            return f"waits for {self.after}'s profiles of the same workload"
        if self.stage is Stage.WAITING:
            return (f"{self.plans} profiles wait for capacity outside guaranteed jobs and other "
                    "profiles")
        if self.plans == 0:
            return "planning from cached profiles"
        where = f" on {sorted(set(self.reservation.workers))}" if self.reservation else ""
        return f"profiling {self.plans} plans{where}"


def _to_measure(spec: JobSpec, cluster: Cluster, cfg: ProfileConfig) -> list[tuple[Plan, str]]:
    return to_measure(spec, cluster, cfg)


def _watch_owner(incarnation: str, every_s: float = 2.0) -> None:
    """End this task's process once the scheduler that started it is gone or restarted.

    A task outlives its owner's death here: the worker stays, and so does the Ray Train
    controller a dp > 1 profile created in it, holding its placement group for good (seen after
    the scheduler actor was killed mid-profile). The process exiting takes the controller, and
    with it the placement group, along (both are owned by it)."""
    import os

    from tidal.platform.config import NAMESPACE, SCHEDULER_NAME

    def loop() -> None:
        while True:
            time.sleep(every_s)
            try:
                actor = ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
                alive = ray.get(actor.incarnation.remote(), timeout=30) == incarnation
            except ValueError:  # no scheduler any more
                alive = False
            except Exception:  # restarting, or busy: ask again
                continue
            if not alive:
                os._exit(1)

    threading.Thread(target=loop, name="tidal-owner-watch", daemon=True).start()


def _plan(spec: JobSpec, cluster: Cluster, cfg: ProfileConfig, node_ids: tuple[str, ...] | None,
          owner: str | None = None) -> tuple[tuple[Option, ...], float | None]:
    if owner is not None:
        _watch_owner(owner)
    jp = plan_job(spec, cluster, cfg, node_ids=node_ids)
    return jp.options, jp.guarantee


# num_cpus=0: orchestration only (see the module docstring). Ray retries a task whose worker
# died (a system failure), not one that raised: a SpecError is an answer, not a fault.
_sizing = ray.remote(num_cpus=0, max_retries=2, retry_exceptions=False)(_to_measure)
_planning = ray.remote(num_cpus=0, max_retries=2, retry_exceptions=False)(_plan)


def start_sizing(spec: JobSpec, cluster: Cluster, cfg: ProfileConfig, attempts: int = 1) -> Admission:
    ref = _sizing.options(name=f"tidal-size-{spec.name}", runtime_env=spec.runtime_env).remote(
        spec, cluster, cfg)
    return Admission(stage=Stage.SIZING, ref=ref, attempts=attempts, started=time.time())


def start_planning(spec: JobSpec, cluster: Cluster, cfg: ProfileConfig, keys: frozenset[str],
                   reservation: Reservation | None, attempts: int = 1, owner: str | None = None) -> Admission:
    """`keys`: the cache entries of the profiles it measures (none: it plans from the cache);
    `owner`: the scheduler's incarnation (`Scheduler.incarnation`); the task ends itself when
    that scheduler is gone (`_watch_owner`)."""
    pin = reservation.workers if reservation else None
    ref = _planning.options(name=f"tidal-plan-{spec.name}", runtime_env=spec.runtime_env).remote(  # type: ignore[call-arg]
        spec, cluster, cfg, pin, owner)
    return Admission(stage=Stage.PROFILING, ref=ref, reservation=reservation, attempts=attempts, keys=keys,
                     started=time.time())


def measuring(admissions: dict[str, Admission], keys: frozenset[str], but: str) -> str | None:
    """The job (not `but`) whose running admission measures any of the profiles `keys`, if one
    does: the first of them, in the dict's order."""
    return next((jid for jid, a in admissions.items()
                 if jid != but and a.stage is Stage.PROFILING and a.keys & keys), None)


def done(adm: Admission) -> bool:
    ready, _ = ray.wait([adm.ref], timeout=0)
    return bool(ready)


class AdmissionHung(TimeoutError):
    """An admission stage's task ran past its time (`Admission.overdue`): a fault of the
    cluster, so the admission starts again, up to `SchedulerConfig.max_admission_attempts`."""


def user_error(e: BaseException) -> str | None:
    """The one-line reason of an admission task's error if it is the job's, else None (a fault of
    the cluster: try again). The job's: a SpecError (it fits no plan, its profiles all failed, its
    code cannot be loaded where it runs), or a runtime_env Ray cannot build (a pip requirement
    that does not resolve: trying again builds it again)."""
    if isinstance(e, RuntimeEnvSetupError):
        return f"JobSpec.runtime_env: Ray could not set it up: {env_setup_line(e)}"
    cause = getattr(e, "cause", None) or e
    return str(cause).splitlines()[0][:500] if isinstance(cause, SpecError) else None


def cancel(adm: Admission) -> None:
    """Stop the stage's task and what it started (a profile's Train run dies with its owner)."""
    ray.cancel(adm.ref, force=True, recursive=True)
