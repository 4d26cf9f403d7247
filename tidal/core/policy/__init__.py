"""The co-optimization policy: `decide(snapshot) -> Decision`, a pure function.

    types       what a decision reads and returns (frozen dataclasses)
    objective   what an option of a job is worth (u_j), and a guaranteed job's floor
    counts      phases 1-2: floors and admission, then the knapsack over the rest
    knapsack    the multiple-choice knapsack (exact DP, LP greedy past a size)
    placement   phase 4: GPUs on nodes
    decision    the decision: phases 1-4 until everything chosen is placed, then phase 5

Each module's docstring states what it decides, the formulas and why.
"""

from tidal.core.policy.decision import decide, grow_into_idle
from tidal.core.policy.objective import (
    current_index,
    flat_utilities,
    guarantee_index,
    guarded,
    predicted,
    utilities,
    utility,
)
from tidal.core.policy.placement import CAPACITY_REASON, SPREAD_REASON, place, running_jobs
from tidal.core.policy.types import Allocation, Decision, JobView, Node, Option, PolicyConfig, Pool, Snapshot

__all__ = [
    "CAPACITY_REASON",
    "SPREAD_REASON",
    "Allocation",
    "Decision",
    "JobView",
    "Node",
    "Option",
    "PolicyConfig",
    "Pool",
    "Snapshot",
    "current_index",
    "decide",
    "flat_utilities",
    "grow_into_idle",
    "guarantee_index",
    "guarded",
    "place",
    "predicted",
    "running_jobs",
    "utilities",
    "utility",
]
