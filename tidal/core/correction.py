"""Online correction of a job's predicted throughput from what its runs measure. Pure.

The planner's model is fitted on a few short profiles; on some hardware it is biased for a whole
job (on a CPU the live model overestimated throughput several-fold). While a job runs, its
measured samples/s and the prediction for the option it runs under give a ratio; the correction
keeps a smoothed ratio per job and scales every option of the job by it:

    r_obs   = measured / predicted                      (the option the run is under)
    log r  ← log r + a · (log r_obs − log r),   a = 1 − 2^(−dt / half_life_s)
    option' = option · r     for every GPU count (the bias is the job's: model, data, kernels)
    guarantee' = guarantee · r                           (the same model predicted it; and the
                                                          request's option, whose throughput it is)

in log space, so a 3× over- and a 3× under-estimate weigh alike. The ratio survives plan and
GPU-count changes (it is the job's, not the plan's) and restarts of the scheduler (the caller
stores it). Scaling the guarantee with the options keeps a guaranteed job's choice of option
what the model said; what changes is how the job weighs against others — a job the model
flattered no longer looks seconds from done. (The live scheduler skips a run's first report:
start-up and warm-up.)

The live scheduler calls `observe` with the run's measured samples/s; the simulator calls it
with the truth table's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tidal.core.policy import JobView


@dataclass(frozen=True, kw_only=True)
class Correction:
    ratio: float = 1.0  # smoothed measured ÷ predicted samples/s
    seconds: float = 0.0  # measurement time behind it


@dataclass(frozen=True, kw_only=True)
class CorrectionConfig:
    half_life_s: float = 120.0
    bounds: tuple[float, float] = (0.05, 20.0)  # a ratio outside is a broken measurement, clipped


def observe(c: Correction, *, predicted: float, measured: float, dt: float,
            cfg: CorrectionConfig | None = None) -> Correction:
    """The correction after `dt` seconds of running at `measured` samples/s where the model said
    `predicted` (formula in the module docstring). Non-positive inputs change nothing."""
    cfg = cfg or CorrectionConfig()
    if not (predicted > 0 and measured > 0 and dt >= 0) or not math.isfinite(measured):
        return c
    lo, hi = cfg.bounds
    obs = min(hi, max(lo, measured / predicted))
    a = 1.0 - 2.0 ** (-dt / cfg.half_life_s)
    log_r = math.log(c.ratio) + a * (math.log(obs) - math.log(c.ratio))
    return Correction(ratio=math.exp(log_r), seconds=c.seconds + dt)


def corrected(job: JobView, c: Correction) -> JobView:
    """The job as the policy should see it: options and guarantee scaled by the ratio."""
    if c.ratio == 1.0:
        return job
    options = tuple(replace(o, samples_per_s=o.samples_per_s * c.ratio) for o in job.options)
    guarantee = None if job.guarantee is None else job.guarantee * c.ratio
    requested = None if job.requested is None else replace(
        job.requested, samples_per_s=job.requested.samples_per_s * c.ratio)
    return replace(job, options=options, guarantee=guarantee, requested=requested)
