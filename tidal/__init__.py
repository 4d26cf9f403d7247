"""Tidal: reconfigurable DeepSpeed training beside Ray Serve inference, on Ray.

The public SDK (re-exports only). See DESIGN.md for the architecture.
"""

from tidal.jobs import Constant, JobSpec, LRSchedule, Plan, PlanError, PlanSpace, SpecError, WarmupCosine
from tidal.jobs.runner import Resources, RunHandle, RunResult, launch, run

__all__ = [
    "Constant",
    "JobSpec",
    "LRSchedule",
    "Plan",
    "PlanError",
    "PlanSpace",
    "Resources",
    "RunHandle",
    "RunResult",
    "SpecError",
    "WarmupCosine",
    "launch",
    "run",
]
