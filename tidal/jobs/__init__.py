"""The SDK for reconfigurable jobs and the code that runs inside a job."""

from tidal.jobs.lr import Constant, LRSchedule, WarmupCosine
from tidal.jobs.spec import JobSpec, Plan, PlanError, PlanSpace, SpecError, plans_for

__all__ = [
    "Constant",
    "JobSpec",
    "LRSchedule",
    "Plan",
    "PlanError",
    "PlanSpace",
    "SpecError",
    "WarmupCosine",
    "plans_for",
]
