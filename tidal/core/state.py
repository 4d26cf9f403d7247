"""The one job state machine, shared by the live scheduler's store and the simulator.

    PROFILING → QUEUED → RUNNING → (STOPPING → QUEUED) … → SUCCEEDED | FAILED
    PROFILING → REJECTED                  (no plan fits the cluster, or its profile failed)
    any non-terminal state → CANCELLED;   QUEUED | RUNNING | STOPPING → FAILED
    RUNNING → QUEUED                      (the run was lost: a fault, or a restarted scheduler)

`ALLOWED` is the whole machine; `tidal.platform.store.Store.transition` refuses any other move,
so a bug cannot silently resurrect a finished job.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    PROFILING = "PROFILING"  # stored, being profiled and planned off the scheduler actor
    QUEUED = "QUEUED"  # planned (its resource matrix is known), waiting for an allocation
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"  # asked to checkpoint and stop (reconfiguration, reclaim or cancel)
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    REJECTED = "REJECTED"  # admission said no, with the reason

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def scheduled(self) -> bool:
        """A state the policy sees (a planned job that has not ended)."""
        return self in (JobState.QUEUED, JobState.RUNNING, JobState.STOPPING)


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED})

ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.PROFILING: frozenset({JobState.QUEUED, JobState.REJECTED, JobState.CANCELLED}),
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset({JobState.STOPPING, JobState.SUCCEEDED, JobState.FAILED,
                                 JobState.CANCELLED, JobState.QUEUED}),
    JobState.STOPPING: frozenset({JobState.QUEUED, JobState.SUCCEEDED, JobState.FAILED,
                                  JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.REJECTED: frozenset(),
}
