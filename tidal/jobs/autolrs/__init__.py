"""AutoLRS inside a job: the learning rate is tuned stage by stage by Bayesian optimization.

After AutoLRS (Jin et al., "Automatic Learning-Rate Schedule by Bayesian Optimization on the
Fly", ICLR 2021). A job's budget B (`JobSpec.total_steps`, in compute steps: every step below,
probes included, is paid from it) is spent in four phases:

1. **Range test** (Smith, "Cyclical Learning Rates", 2017), unless the user gives the range.
   From the initial state, R steps with the LR rising geometrically over `sweep`,

       lr_i = sweep_lo · (sweep_hi / sweep_lo)^(i / (R − 1)),   R = clamp(B/25, 20, 100)

   then the initial state is restored (the steps are losing probes; the sweep stops early once
   the loss is back above where it began). Along the sweep the loss, smoothed by a centred
   moving average, falls as the LR grows, then flattens or rises. The knee lr_k is the first LR
   at which the smoothed loss is within 10% of its whole fall of its lowest point, where more LR
   stops buying a lower loss (the lowest point itself wanders along a flat floor). The peak LR
   is lr_k itself (`peak_factor`) and the candidates' range [peak/10, 3·peak] (the 10% and the
   factor were chosen on benchmarks/autolrs_speedup.py's family against the grid's best
   cosine, by the worst member: docs/log/autolrs.md).
2. **Warm-up**: a linear ramp to the peak over 5% of B (Adam at a large LR from random weights
   does lasting damage a few probe steps cannot see).
3. **Stages**. The time up to the anneal is cut into stages of τ optimizer steps. At the start
   of a stage the tuner tries candidate LRs, each for τ′ ≪ τ steps from the *same* starting
   state (weights, Adam moments, data position; the RNG of step s is re-seeded from (seed, s)),
   fits each short loss curve with an exponential model and forecasts its loss at the stage's
   end:

       L(t) = a·e^(b·t) + c,  b < 0            t = steps since the stage started
       forecast = L(τ)

   An Optuna study proposes each candidate from the forecasts seen so far in the stage (by
   default the shortest search: the last winner against one challenger drawn within
   `max_change` of it). The best forecast wins; the job continues from the end of the winner's
   probe (identical to restoring the start and re-running it, since the steps are
   deterministic) and trains the rest of the stage with it. τ grows geometrically (τ_{n+1} =
   growth·τ_n, from B/10 up to B): the LR needs re-tuning often early on, rarely later.
4. **Anneal**: the last `anneal`·B steps (half, by default) decay the last winner w to zero
   along a half cosine,

       lr(k) = w · ½(1 + cos(π·(k + 1)/(n + 1))),   k = 0 … n − 1,  n = the anneal's steps

   or along Hägele et al.'s "1 − sqrt" cool-down, w·(1 − √((k + 1)/(n + 1))), with
   `anneal_shape="sqrt"` ("Scaling Laws and Compute-Optimal Training Beyond Fixed Training
   Durations", 2024: over a fifth of the run it matches a cosine's final loss). A greedy stage
   search never lowers the LR far enough at the end of a fixed budget on its own: a stage's
   forecast rewards the fastest fall over that stage, not the lowest loss at B. Half the
   budget on a cosine, rather than a fifth on 1 − √, ends about as low and is lower all along
   the way (docs/log/autolrs.md).

**Cost.** Every probe step is real training compute. The range test's steps and the steps of
the losing probes are overhead (with the shortest search one challenger a stage; none where
the challenger beats the previous winner, whose curve is read off the steps that trained with
it, `AutoLRS.observe_incumbent`); they are counted in `compute_steps`, which every metrics row
carries and which the job's budget is measured in. The data position `step` counts only steps
that became part of the trained model.

**Where the decisions are made.** The tuner's logic here is deterministic given its state,
and its state (`TunerState`) lives in every checkpoint's `extra`, so a job stopped in the
middle of a stage — even in the middle of a probe — resumes the same stage under any plan and
worker count. Only rank 0 asks Optuna for a candidate; the worker broadcasts it to all ranks.
The study a decision is made on is rebuilt from the checkpointed trials, with the sampler seeded
from (seed, stage, trial), so a resumed stage proposes the same candidates; each stage's study
is also written to a per-job SQLite file that `optuna-dashboard sqlite:///<file>` can open.
"""

from tidal.jobs.autolrs.forecast import fit_exponential, forecast
from tidal.jobs.autolrs.plot import plot_schedule
from tidal.jobs.autolrs.range_test import read_range_test, sweep_diverged, sweep_lrs
from tidal.jobs.autolrs.settings import AutoLRS
from tidal.jobs.autolrs.tuner import Tuner, TunerState

__all__ = ["AutoLRS", "Tuner", "TunerState", "fit_exponential", "forecast", "plot_schedule",
           "read_range_test", "sweep_diverged", "sweep_lrs"]
