"""What the simulator keeps of each job: `ActiveJob` while it runs, `JobRecord` once it ended,
and a run's `SimResult` (shared by the simulator and its inference pool, `tidal.sim.serving`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidal.core.controller import ActionRecord
from tidal.core.correction import Correction
from tidal.core.policy import Allocation, Option
from tidal.core.state import JobState
from tidal.sim.workload import SimJob


@dataclass(kw_only=True)
class ActiveJob:
    """A job of the simulated cluster from its arrival to its end: what the executor knows of it."""

    spec: SimJob
    options: tuple[Any, ...]
    guarantee: float | None  # predicted samples/s the policy must keep (guaranteed jobs)
    requested: Option | None  # its own plan on its requested GPUs (guaranteed jobs)
    true_floor: float | None  # true iterations/s of the request (violations are measured on it)
    phase: JobState = JobState.QUEUED
    alloc: Allocation | None = None
    rate: float = 0.0  # true iterations/s under `alloc`
    iters: float = 0.0
    blocked_until: float = 0.0
    started: float | None = None
    finished: float | None = None
    restarts: int = 0  # the policy's own (what its restart limit counts)
    recalls: int = 0  # restarts forced by a reclaim of lent GPUs (tidal.sim.serving)
    evicted: bool = False  # stopped by a reclaim, not relaunched yet
    attained: float = 0.0
    violation_s: float = 0.0
    violation_by: dict[str, float] = field(default_factory=dict)  # cause → seconds (`tidal.sim.simulator`)
    correction: Correction = field(default_factory=Correction)


@dataclass(frozen=True, kw_only=True)
class JobRecord:
    name: str
    app: str
    submit: float
    start: float
    finish: float
    restarts: int
    steps: int
    isolated_s: float  # a lower bound: restart_s + steps × the app's fastest measured iteration
    violation_s: float = 0.0  # time it ran below its guarantee (guaranteed jobs)
    violation_by: tuple[tuple[str, float], ...] = ()  # (cause, seconds): stopped, spread, model

    @property
    def jct(self) -> float:
        return self.finish - self.submit


@dataclass(kw_only=True)
class SimResult:
    policy: str
    jobs: list[JobRecord]
    timeline: list[tuple[float, str, int]]  # (time, job, GPUs it holds from then on)
    actions: list[ActionRecord]  # what the executor applied, as the live scheduler logs it
    round_ms: list[float]
    metrics: dict[str, float]
