"""The reconcile step both executors run: the live scheduler (`tidal.platform.scheduler`, Ray
Train runs) and the simulator (`tidal.sim.simulator`, a virtual clock).

The controller sees the jobs the policy schedules: QUEUED, RUNNING or STOPPING (`tidal.core.state`). One step:

    1. a job is STOPPING (its GPUs are not free yet)  →  wait, decide nothing;
    2. decision = policy(snapshot);
    3. running jobs the decision changes (new GPUs, new plan, or preempted)  →  stop them
       (checkpoint at the next step boundary); they come back QUEUED once stopped, and the
       next step decides again with their GPUs free (a guaranteed job keeps its admission
       meanwhile: `JobView.admitted`);
    4. nothing to stop  →  launch every queued job the decision allocates, on exactly the
       GPUs it names.

Keeping this in one pure function is what makes the simulator's decisions those of the live
system (the conformance suite, tests/sim/test_conformance.py, checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tidal.core.policy import Allocation, Decision, Snapshot, decide
from tidal.core.state import JobState

Policy = Callable[[Snapshot], Decision]
# what an executor applied: (time, "stop" | "launch", job, GPUs per node, plan); the live
# scheduler and the simulator keep the same log, which the conformance suite compares
ActionRecord = tuple[float, str, str, tuple[tuple[str, int], ...], str]


@dataclass(frozen=True, kw_only=True)
class Actions:
    decision: Decision | None  # None: a job was stopping, nothing was decided
    stop: tuple[str, ...] = ()
    launch: tuple[tuple[str, Allocation], ...] = ()


def reconcile_step(snapshot: Snapshot, phases: Mapping[str, JobState], policy: Policy = decide) -> Actions:
    """Steps 1-4 above. `snapshot.jobs` are the jobs not yet finished; a RUNNING job's view carries
    its current allocation, a QUEUED one's none."""
    if any(p is JobState.STOPPING for p in phases.values()):
        return Actions(decision=None)
    decision = policy(snapshot)
    stop = tuple(j.job_id for j in snapshot.jobs
                 if phases.get(j.job_id) is JobState.RUNNING and j.job_id in decision.changed)
    if stop:
        return Actions(decision=decision, stop=stop)
    order = sorted(snapshot.jobs, key=lambda j: (j.arrival, j.job_id))
    launch = tuple((j.job_id, decision.allocations[j.job_id]) for j in order
                   if phases.get(j.job_id) is JobState.QUEUED and j.job_id in decision.allocations)
    return Actions(decision=decision, launch=launch)
