"""Tidal: reconfigurable DeepSpeed training beside Ray Serve inference, on Ray.

The public SDK (re-exports only). `submit`, `resume`, `list_jobs` and `JobHandle` talk to the
scheduler actor (`tidal.platform.sdk`) and load Ray's client only when first used, so that
`import tidal` stays light for job files; `launch` and `run` start one run directly on Ray
Train, without the scheduler (tests, notebooks).
"""

from typing import TYPE_CHECKING, Any

from tidal.jobs import Constant, JobSpec, LRSchedule, Plan, PlanError, PlanSpace, SpecError, WarmupCosine
from tidal.jobs.runner import Resources, RunHandle, RunResult, launch, run

if TYPE_CHECKING:
    from tidal.platform.sdk import JobHandle, list_jobs, resume, submit

_SDK = ("JobHandle", "list_jobs", "resume", "submit")


def __getattr__(name: str) -> Any:
    """PEP 562: the scheduler's SDK, imported on first use."""
    if name in _SDK:
        from tidal.platform import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'tidal' has no attribute {name!r}")


__all__ = [
    "Constant",
    "JobHandle",
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
    "list_jobs",
    "resume",
    "run",
    "submit",
]
