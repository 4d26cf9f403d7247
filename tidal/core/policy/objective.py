"""The objective: what one option of one job is worth to the cluster, and a job's floor.

Option i of job j is worth its completion rate, weighted by age:

    u_j(i) = a_j · v_j(i) + (w_j − a_j) · v_j(0)
    v_j(i) = 1 / T_j(i),   T_j(i) = restart_j(i) + W_j / s_j(i)
    W_j    = min(remaining samples, horizon_s · max_i s_j(i))
    w_j    = 1 + t_waited / aging_s,   a_j = min(w_j, aging_width_cap)

s_j(i): the option's predicted samples/s; restart_j(i): the job's restart cost, 0 for the option
it runs now under its plan.

Why this shape:

- Σ 1/T_j is maximised by finishing short jobs first (SRPT, with one GPU per job), by growing a
  job while a GPU shortens its time more than it would shorten another's, and it prices every
  restart into the decision itself: a change must save more than its restart costs.
- W_j is capped at what the job could do in `horizon_s` at its *fastest* option, so long jobs
  (and jobs of unknown length) compare by throughput (u ≈ s_j(i) / (horizon · s_j,max): Rubick's
  normalised throughput) while a restart is still weighed against at least `horizon_s` of run
  time. Capping at the slowest option's rate instead counts only seconds of work for jobs whose
  smallest option is very slow (a ZeRO-Offload plan on one GPU), so their restarts never pay.
- Aging (w_j) means nobody starves: a job that waits, or is preempted again and again, gains
  weight until it wins. Age buys a place, not width: only a_j multiplies what more GPUs gain,
  the rest of the weight goes to option 0, so a job that has waited for hours outbids young
  ones to run at all without having its growth weighed many times over theirs.

A guaranteed job's floor is the smallest option predicted to reach its guarantee (the
throughput of its own plan on the GPUs it requested). The model alone vouches for an option on
fewer GPUs than requested, and it errs, so such an option must beat the guarantee by
`guarantee_margin`; at the requested count the job's own plan replaces the planner's best one
unless that is predicted to beat it by as much (`guarded`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tidal.core.policy.types import Allocation, JobView, Option, PolicyConfig


def utility(job: JobView, idx: int | None, now: float, cfg: PolicyConfig) -> float:
    """u_j(i) = w_j / (restart_j(i) + W_j / s_j(i)) (this module's docstring); 0 for waiting."""
    return 0.0 if idx is None else utilities(job, now, cfg)[idx]


def utilities(job: JobView, now: float, cfg: PolicyConfig) -> list[float]:
    """`utility` of every option of the job at once (`flat_utilities` of this one job)."""
    return [float(u) for u in flat_utilities((job,), now, cfg)[1]]


def guarantee_index(job: JobView, margin: float = 0.0) -> int | None:
    """A guaranteed job's floor: the smallest option predicted to reach its guarantee, where an
    option on fewer GPUs than it requested must reach guarantee · (1 + `margin`) (those are the
    ones the model alone vouches for; `guarded` puts the request itself at its GPU count);
    0 without a guarantee; None if no option reaches it."""
    if job.guarantee is None:
        return 0
    req = job.requested.gpus if job.requested is not None else 0
    for i, o in enumerate(job.options):
        if o.samples_per_s >= job.guarantee * ((1.0 + margin) if o.gpus < req else 1.0) * (1 - 1e-12):
            return i
    return None


def guarded(job: JobView, margin: float) -> JobView:
    """The job with its own request as the option at its requested GPU count wherever the
    planner's best plan there is not predicted to beat it by `margin`: a floor the model may
    have over-predicted is replaced by the one configuration whose throughput is the guarantee
    by definition. Jobs without a request are returned as they are."""
    r = job.requested
    if job.guarantee is None or r is None:
        return job
    at = next((i for i, o in enumerate(job.options) if o.gpus == r.gpus), None)
    if at is not None and job.options[at].samples_per_s >= job.guarantee * (1.0 + margin):
        return job
    if at is not None:
        options = (*job.options[:at], r, *job.options[at + 1:])
    else:
        options = tuple(sorted((*job.options, r), key=lambda o: o.gpus))
    return replace(job, options=options)


def predicted(options: Sequence[Option], requested: Option | None, alloc: Allocation) -> float:
    """The predicted samples/s of what `alloc` runs: the job's option with its GPUs and plan, or
    its own request (`guarded` may put it in the option's place); 0 if neither."""
    for o in (*options, *((requested,) if requested is not None else ())):
        if o.gpus == alloc.gpus and o.plan == alloc.plan:
            return o.samples_per_s
    return 0.0


def current_index(job: JobView) -> int | None:
    """The option the job runs now (by GPU count), None if it waits."""
    if job.current is None:
        return None
    for i, o in enumerate(job.options):
        if o.gpus == job.current.gpus:
            return i
    return None


def flat_utilities(jobs: Sequence[JobView], now: float, cfg: PolicyConfig) -> tuple[Any, Any, Any]:
    """u_j(i) (this module's docstring) of every option of `jobs` at once, with numpy: the options'
    GPUs and utilities flattened in (job, option) order, and where each job's options start.

        W_j = max(min(remaining samples, horizon_s · max_i s_j(i)), 0)
        v_j(i) = 1 / max(restart_j + W_j / s_j(i), 1e-6)   (restart_j = 0 for the option the
                                                            job runs now, under its plan)
        w_j = 1 + max(0, now − arrival_j) / aging_s,   a_j = min(w_j, aging_width_cap)
        u_j(i) = a_j · v_j(i) + (w_j − a_j) · v_j(0)"""
    import numpy as np

    n = len(jobs)
    lens = np.fromiter((len(j.options) for j in jobs), dtype=np.int64, count=n)
    starts = np.cumsum(lens) - lens
    opts = [o for j in jobs for o in j.options]
    gpus = np.fromiter((o.gpus for o in opts), dtype=np.int64, count=len(opts))
    sps = np.fromiter((o.samples_per_s for o in opts), dtype=np.float64, count=len(opts))
    if not len(opts):
        return gpus, sps, starts
    peak = np.maximum.reduceat(sps, starts)  # every job has options (`decide` checks)
    remaining = np.fromiter((j.remaining_samples for j in jobs), dtype=np.float64, count=n)
    work = np.maximum(np.minimum(remaining, cfg.horizon_s * peak), 0.0)
    arrival = np.fromiter((j.arrival for j in jobs), dtype=np.float64, count=n)
    weight = 1.0 + np.maximum(0.0, now - arrival) / cfg.aging_s
    restart = np.fromiter((j.restart_cost_s for j in jobs), dtype=np.float64, count=n)
    t = np.repeat(restart, lens) + np.repeat(work, lens) / sps
    v = 1.0 / np.where(t > 1e-6, t, 1e-6)
    for k, j in enumerate(jobs):  # the option a job runs now, under its plan: no restart
        cur = j.current
        if cur is not None and (i := current_index(j)) is not None and j.options[i].plan == cur.plan:
            at = int(starts[k]) + i
            v[at] = 1.0 / max(work[k] / sps[at], 1e-6)
    width = np.minimum(weight, cfg.aging_width_cap)  # a_j; the rest of w_j buys a place
    u = np.repeat(width, lens) * v + np.repeat((weight - width) * v[starts], lens)
    return gpus, u, starts
