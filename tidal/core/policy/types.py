"""What the policy reads and returns: frozen dataclasses, no behaviour beyond validation.

A `Snapshot` is everything one decision sees (the nodes Tidal may use now, the jobs with their
resource matrices, the settings); a `Decision` is everything it says (an `Allocation` per job
that runs, a reason per job that waits, what each borrower would lose if its lent GPUs were
recalled, and which running jobs change). Policy state that must survive a restart lives here
(current allocations, restart counts), never in the policy's modules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from tidal.jobs.spec import Plan

Pool = Literal["training", "inference"]


@dataclass(frozen=True, kw_only=True)
class Node:
    """Capacity Tidal may use on one node now (free, plus what Tidal's jobs hold there)."""

    node_id: str
    gpus: int
    cpus: float = 1e9
    memory: float = 1e18
    pool: Pool = "training"
    recallable: bool = False  # GPUs lent by inference: may be recalled
    recall_risk: float = 1.0  # chance (0-1) a lent GPU is recalled within the horizon


@dataclass(frozen=True, kw_only=True)
class Option:
    """One row of a job's resource matrix."""

    gpus: int
    plan: Plan
    samples_per_s: float
    cpus_per_gpu: float = 0.0
    memory_per_gpu: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "plan": self.plan.to_dict(), "samples_per_s": self.samples_per_s,
                "cpus_per_gpu": self.cpus_per_gpu, "memory_per_gpu": self.memory_per_gpu}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Option:
        return cls(**{**d, "plan": Plan.from_dict(d["plan"])})


@dataclass(frozen=True, kw_only=True)
class Allocation:
    gpus_by_node: tuple[tuple[str, int], ...]
    plan: Plan

    @cached_property
    def gpus(self) -> int:
        return sum(g for _, g in self.gpus_by_node)


@dataclass(frozen=True, kw_only=True)
class JobView:
    job_id: str
    arrival: float
    options: tuple[Option, ...]  # ascending GPU counts, one per count
    guarantee: float | None = None  # samples/s the job must get when it runs
    # what a guaranteed job asked for: its own plan on its requested GPUs, at the guarantee's
    # samples/s (the guarantee *is* this option's throughput; the floor falls back on it)
    requested: Option | None = None
    current: Allocation | None = None
    restarts: int = 0
    restart_cost_s: float = 30.0
    running_s: float = 0.0  # seconds it has run on its current allocation (since its last launch)
    remaining_samples: float = float("inf")
    attained_gpu_s: float = 0.0  # GPU-seconds held so far (least-attained-service baselines)
    # the job has run since it was submitted. A guaranteed job admitted once keeps its place
    # while it waits again, e.g. between the stop and the relaunch of a change of GPUs or plan
    # (`tidal.core.controller` decides again once the stop is done): phase 1 readmits it with
    # the running ones, before any waiting job
    admitted: bool = False


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """The policy's settings. Each default is chosen by the worst case over the simulator's
    workload family (`benchmarks/sim_sweep.py`, seeds 0-2), not by one workload; the figures
    behind each choice are in docs/log/policy.md."""

    # u_j counts at most this many seconds of work, at the job's fastest option (`objective`)
    horizon_s: float = 600.0
    # restarts after which a running job keeps at least what it runs (`decide`, phase 3)
    max_restarts: int = 20
    # aging: a job waiting this long (since arrival) counts double (`objective`: w_j)
    aging_s: float = 300.0
    # a floor on fewer GPUs than a guaranteed job requested must be predicted to reach
    # guarantee · (1 + this): the model errs, and the guarantee is judged against the truth
    guarantee_margin: float = 0.2
    # phase 5 (`decide.grow_into_idle`): owned GPUs no job was given go to running jobs whose
    # growth pays its restart over their real remaining work
    grow_into_idle: bool = True
    # phase 1 (`counts`): which running best-effort jobs a waiting guaranteed job's admission may
    # stop. "none" (Rubick's rule): none, it is admitted into owned GPUs they do not hold (it may
    # shrink them); "later": those that arrived after it; "any": every one
    admission_preempts: Literal["none", "later", "any"] = "none"
    # a_j = min(w_j, this): the aging weight that also multiplies what a job gains from more
    # GPUs; weight above it counts for the smallest option only (age buys a place, not width)
    aging_width_cap: float = 4.0
    # phase 5: a job past half its restart allowance may grow into idle GPUs once it has run
    # this long on its allocation, if a growth and a shrink both fit in the allowance; inf: never
    settle_s: float = math.inf

    def __post_init__(self) -> None:
        """Bad settings fail here, in one line, before any decision is made with them."""
        for name in ("horizon_s", "aging_s"):
            if not (v := getattr(self, name)) > 0 or not math.isfinite(v):
                raise ValueError(f"PolicyConfig.{name} must be a positive number of seconds, got {v!r}")
        if not (isinstance(self.max_restarts, int) and self.max_restarts >= 0):
            raise ValueError(f"PolicyConfig.max_restarts must be an integer >= 0, got {self.max_restarts!r}")
        if not (0.0 <= self.guarantee_margin < math.inf):
            raise ValueError(f"PolicyConfig.guarantee_margin must be >= 0, got {self.guarantee_margin!r}")
        if not self.aging_width_cap >= 1.0:  # NaN fails too
            raise ValueError("PolicyConfig.aging_width_cap must be >= 1 (inf: no cap), "
                             f"got {self.aging_width_cap!r}")
        if not (0.0 <= self.settle_s <= math.inf):  # NaN fails too
            raise ValueError(f"PolicyConfig.settle_s must be >= 0 seconds (inf: never), "
                             f"got {self.settle_s!r}")
        if self.admission_preempts not in ("none", "later", "any"):
            raise ValueError("PolicyConfig.admission_preempts must be 'none', 'later' or 'any', "
                             f"got {self.admission_preempts!r}")


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    now: float = 0.0
    nodes: tuple[Node, ...]
    jobs: tuple[JobView, ...]
    config: PolicyConfig = field(default_factory=PolicyConfig)


@dataclass(frozen=True, kw_only=True)
class Decision:
    allocations: Mapping[str, Allocation]  # job → allocation; a job absent here waits
    reasons: Mapping[str, str]
    recall_loss: Mapping[str, float]  # job → samples/s lost if its recallable GPUs are recalled
    changed: tuple[str, ...]  # running jobs whose allocation or plan changes (restarts)

