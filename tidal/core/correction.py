"""Online correction of a job's predicted throughput from what its runs measure. Pure.

The planner's model is fitted on a few short profiles; on some hardware it is biased for a whole
job (on a CPU the live model overestimated throughput several-fold), and its scaling curve can be
off too (on the Rubick tables under the simulator's `flat` truth LLaMA-30B runs as fast on 24
GPUs as on 32, 1.45 samples/s; the model says 0.81 and 1.54). While a job runs, its measured
samples/s and the prediction for the option it runs under give a ratio; the correction keeps a
smoothed ratio per GPU count the job has run on and scales each option by the ratio at its count:

    r_obs      = measured / predicted                    (the option the run is under, n GPUs)
    log r_n   ← log r_n + a · (log r_obs − log r_n),  a = 1 − 2^(−dt / half_life_s)
                (a count run for the first time starts from r(n) below: what the others said)
    r(n)       = r_n                     where n was measured
               = log-linear in log n     between measured counts n0 < n < n1
               = r_min                   below the smallest measured count
               = min(1, r_max)           above the largest measured count
    option'    = option · r(option's GPUs)
    guarantee' = guarantee · r(requested GPUs)           (the same model predicted it: the
                                                          request's option, whose throughput it is)

in log space, so a 3× over- and a 3× under-estimate weigh alike. A job measured on one count gets
that count's ratio on every count at or below it; a job measured on several also gets the shape
of its curve, so a count the model flattered stops looking better than a smaller one that runs
as fast. Above the largest count measured a slowdown is carried up but a speed-up is not: a run
faster than predicted says the job computes faster than modelled, and on more GPUs the
communication it says nothing about weighs more. (Carrying the speed-up up as well, the flat
truth's LLaMA-30B jobs measured on 24 GPUs looked 1.8× faster than modelled on 32-64 and grew
into them: `benchmarks/sim_sweep.py`, seeds 0-2, worst JCT case 0.766 against 0.867.) The
ratios survive plan changes (a count's ratio is for whatever plan runs there) and restarts of
the scheduler (the caller stores them). Scaling the guarantee with the options keeps a
guaranteed job's choice of option what the model said; what changes is how the job weighs
against others — a job the model flattered no longer looks seconds from done. (The live
scheduler skips a run's first report: start-up and warm-up.)

The live scheduler calls `observe` with the run's measured samples/s; the simulator calls it
with the truth table's.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

from tidal.core.policy import JobView


@dataclass(frozen=True, kw_only=True)
class Correction:
    # (GPU count, smoothed measured ÷ predicted samples/s), ascending counts
    ratios: tuple[tuple[int, float], ...] = ()
    seconds: float = 0.0  # measurement time behind it

    def ratio(self, gpus: int) -> float:
        """r(gpus) of the module docstring: the measured count's ratio, else interpolated below
        the largest measured count and no more than 1 above it; 1 before any measurement."""
        if not self.ratios:
            return 1.0
        counts = [n for n, _ in self.ratios]
        i = bisect.bisect_left(counts, gpus)
        if i < len(counts) and counts[i] == gpus:
            return self.ratios[i][1]
        if i == 0:
            return self.ratios[0][1]
        if i == len(counts):
            return min(1.0, self.ratios[-1][1])
        (n0, r0), (n1, r1) = self.ratios[i - 1], self.ratios[i]
        x = (math.log(gpus) - math.log(n0)) / (math.log(n1) - math.log(n0))
        return math.exp(math.log(r0) + x * (math.log(r1) - math.log(r0)))


@dataclass(frozen=True, kw_only=True)
class CorrectionConfig:
    half_life_s: float = 120.0  # seconds after which a measurement weighs half as much
    bounds: tuple[float, float] = (0.05, 20.0)  # a ratio outside is a broken measurement, clipped

    def __post_init__(self) -> None:
        if not (self.half_life_s > 0 and math.isfinite(self.half_life_s)):
            raise ValueError("CorrectionConfig.half_life_s must be a positive number of seconds, "
                             f"got {self.half_life_s!r}")
        lo, hi = self.bounds
        if not 0 < lo <= 1 <= hi < math.inf:
            raise ValueError(f"CorrectionConfig.bounds must be (lo, hi) with 0 < lo <= 1 <= hi, "
                             f"got {self.bounds!r}")


def observe(c: Correction, *, gpus: int, predicted: float, measured: float, dt: float,
            cfg: CorrectionConfig | None = None) -> Correction:
    """The correction after `dt` seconds of running on `gpus` GPUs at `measured` samples/s where
    the model said `predicted` (formula in the module docstring). Non-positive inputs change
    nothing."""
    cfg = cfg or CorrectionConfig()
    if not (predicted > 0 and measured > 0 and dt >= 0 and gpus > 0) or not math.isfinite(measured):
        return c
    lo, hi = cfg.bounds
    obs = min(hi, max(lo, measured / predicted))
    a = 1.0 - 2.0 ** (-dt / cfg.half_life_s)
    prior = c.ratio(gpus)
    r = math.exp(math.log(prior) + a * (math.log(obs) - math.log(prior)))
    ratios = tuple(sorted({**dict(c.ratios), gpus: r}.items()))
    return Correction(ratios=ratios, seconds=c.seconds + dt)


def corrected(job: JobView, c: Correction) -> JobView:
    """The job as the policy should see it: each option and the guarantee scaled by r(GPUs)."""
    if all(r == 1.0 for _, r in c.ratios):
        return job
    options = tuple(replace(o, samples_per_s=o.samples_per_s * c.ratio(o.gpus)) for o in job.options)
    # the guarantee is the request's throughput: its count's ratio (no request: the smallest option's)
    r = c.ratio(job.requested.gpus if job.requested is not None else job.options[0].gpus)
    guarantee = None if job.guarantee is None else job.guarantee * r
    requested = None if job.requested is None else replace(
        job.requested, samples_per_s=job.requested.samples_per_s * r)
    return replace(job, options=options, guarantee=guarantee, requested=requested)
