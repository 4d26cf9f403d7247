"""A lower bound on the makespan any policy can reach on a workload, in the simulator's world.

`benchmarks/sim_sweep.py` judges Tidal by its makespan against the Rubick re-implementation's.
A ratio near 1.0 means little by itself: both may be at what the workload allows. The bound
says how much any policy could still gain. For job j (arrival a_j, steps n_j), on the options
a policy is offered (GPU count g and plan p each; `tidal.sim.views`), with τ_j(o) the fastest
the truth runs o (`Truth.best_time`: packed, or a measured placement if one is faster) and R
the restart cost every start pays (`SimConfig.restart_s`: no progress, GPUs held):

    d_j = R + n_j · min_o τ_j(o)                       the job alone, on its fastest option
    e_j = R · min_o g_o + n_j · min_o g_o · τ_j(o)     its fewest GPU-seconds (one start, the
                                                       most efficient option all along)
    job bound  = max_j (a_j + d_j)
    work bound = max_k (a_k + Σ_{j: a_j ≥ a_k} e_j / C)   every job that arrives at a_k or
                                                       later runs after a_k, on C GPUs
    makespan ≥ max(job bound, work bound) − min_j a_j   (the simulator's makespan counts from
                                                       the first arrival)

Both terms leave out what only makes schedules longer (rounds, queueing behind each other,
restarts after the first, fragmentation), so the bound is loose where jobs contend, and tight
where one long job that arrives late sets the end (then a policy at the bound runs that job on
its fastest option from its arrival). It assumes no placement the tables never measured runs
faster than packed (`Truth.best_time`); tests/sim/test_bounds.py checks it below every policy's
makespan on seeded workloads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidal.core.policy import Option
from tidal.sim.simulator import SimConfig
from tidal.sim.tables import Truth
from tidal.sim.workload import SimJob


@dataclass(frozen=True, kw_only=True)
class MakespanBound:
    makespan_s: float  # max(job_s, work_s)
    job_s: float  # the job bound, from the first arrival
    work_s: float  # the work bound, from the first arrival
    critical: str  # the job that sets the job bound

    @property
    def set_by(self) -> str:
        """What sets the bound: the critical job, or the work."""
        return f"job {self.critical}" if self.job_s >= self.work_s else "the work"


def makespan_bound(jobs: Sequence[SimJob], truth: Truth, options: Callable[[SimJob], Sequence[Option]],
                   cfg: SimConfig) -> MakespanBound:
    """The bound of the module docstring for `jobs` on `cfg`'s cluster (its GPUs, GPUs per node
    and restart cost); `options(job)`: what a policy is offered for it (those above the cluster's
    GPUs are left out, as the simulator does)."""
    capacity, gpus_per_node, restart_s = cfg.gpus, cfg.gpus_per_node, cfg.restart_s
    if not jobs:
        raise ValueError("makespan_bound: no jobs")
    first = min(j.submit for j in jobs)
    job_end, critical = -math.inf, ""
    work: list[tuple[float, float]] = []  # (arrival, e_j)
    for j in jobs:
        opts = [o for o in options(j) if o.gpus <= capacity]
        if not opts:
            raise ValueError(f"makespan_bound: job {j.name} has no option within {capacity} GPUs")
        tau = [truth.best_time(j.app, o.plan, o.gpus, gpus_per_node) for o in opts]
        end = j.submit + restart_s + j.steps * min(tau)
        if end > job_end:
            job_end, critical = end, j.name
        e = restart_s * min(o.gpus for o in opts) + j.steps * min(
            o.gpus * t for o, t in zip(opts, tau, strict=True))
        work.append((j.submit, e))
    work.sort()
    work_end, suffix = -math.inf, 0.0
    for a, e in reversed(work):  # the latest arrivals first: Σ over j with a_j ≥ a
        suffix += e
        work_end = max(work_end, a + suffix / capacity)
    return MakespanBound(makespan_s=max(job_end, work_end) - first, job_s=job_end - first,
                         work_s=work_end - first, critical=critical)
