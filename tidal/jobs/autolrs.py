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
   is √2·lr_k and the candidates' range [peak/10, 3·peak]. The peak LR is
   (the factor and the 10% were chosen on benchmarks/autolrs_speedup.py's family against the
   grid's best cosine, by the worst member: docs/log/autolrs.md).
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
4. **Anneal**: the last `anneal`·B steps decay the last winner w to zero,

       lr(k) = w · (1 − √((k + 1) / (n + 1))),   k = 0 … n − 1,  n = the anneal's steps

   (the "1 − sqrt" cool-down of Hägele et al., "Scaling Laws and Compute-Optimal Training
   Beyond Fixed Training Durations", 2024, which with a fifth of the run matches a cosine to
   zero). A greedy stage search never lowers the LR far enough at the end of a fixed budget on
   its own: a stage's forecast rewards the fastest fall over that stage, not the lowest loss
   at B.

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

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True)
class AutoLRS:
    """AutoLRS settings (`JobSpec(lr=AutoLRS(...))`; `lr="autolrs"` takes these defaults, which
    need no hint: every length is a share of the job's budget B, the range is measured).

    lr_min, lr_max: the log-scale range the candidates are drawn from. None (both): measured by
                    the range test (module docstring); given, there is no range test.
    range_steps:    R, the range test's steps (None: clamp(B/25, 20, 100)).
    sweep:          the LRs the range test sweeps, low to high.
    peak_factor:    the warm-up's peak is lr_k·peak_factor (lr_k: the range test's knee).
    trials:         k, candidate LRs tried per stage at most (AutoLRS: about ten).
    startup_trials: random candidates before the Gaussian process takes over. With
                    `trials = startup_trials = 2` (the default) a stage is the last winner
                    against one challenger drawn at random within `max_change` of it: one
                    losing probe a stage at most (a GP challenger with one point in the study
                    is always the range's edge).
    first_stage:    τ of the first stage, in optimizer steps (None: max(20, B/10)).
    growth, max_stage: τ_{n+1} = min(max_stage, growth·τ_n) (max_stage None: B).
    probe_fraction: τ′ = max(min_probe, round(probe_fraction·τ)).
    warmup_steps, warmup_lr: a linear warm-up to `warmup_lr` before the first stage (steps
                    None: 5% of B; LR None: the range test's peak, or without one the
                    geometric mean of the range).
    reuse_winner:   the previous stage's winner is the next stage's first candidate (a good LR
                    rarely moves far between stages; it is the one to beat), and the warm-up's
                    LR the first stage's (`Tuner.incumbent`).
    min_trials, tolerance: an adaptive number of trials. After `min_trials` trials (after
                    `startup_trials + 1` in a stage with no previous winner to start from), the
                    search ends as soon as a trial fails to improve the stage's best forecast by
                    more than `tolerance` (relative): the search has stopped finding better LRs,
                    and every further probe would be a losing one. 0: always `trials` trials.
    max_change:     after the first stage, candidates lie within a factor `max_change` of the
                    previous winner (inside the range): a short probe forecast over a long stage
                    can favour an LR whose curve falls fast after its own spike, and one stage
                    should not jump the LR by 10× on that evidence (0: the whole range).
    search_down:    candidates may lie below the incumbent. Off by default: the stages only try
                    larger LRs, and lowering the LR is the anneal's. A short probe favours a
                    lower LR for the quick fall its lower noise buys at once (the short-horizon
                    bias), a fall the anneal collects anyway at the budget's end; on the family
                    with both directions, most stages lowered an LR that was already below the
                    grid's best (docs/log/autolrs.md).
    observe_incumbent: the incumbent (the previous stage's winner, with `reuse_winner`) is not
                    probed. The stage before trained with it, so its last τ′ trained steps,
                    which end where this stage starts, are its curve: the trial is recorded
                    from them, forecast at τ′ + τ (the stage's end on that curve's clock). Only
                    challengers are probed: a stage the incumbent keeps loses the challengers'
                    probes, a stage a challenger wins loses nothing. The first stage, after a
                    warm-up whose LR ramps, still probes its incumbent.
    anneal:         the share of B at its end over which the last winner decays to zero (0:
                    the last stage trains with its winner to the end).
    """

    lr_min: float | None = None
    lr_max: float | None = None
    range_steps: int | None = None
    sweep: tuple[float, float] = (1e-5, 1e-1)
    peak_factor: float = math.sqrt(2)
    search_down: bool = False
    trials: int = 2
    startup_trials: int = 2
    first_stage: int | None = None
    growth: float = 2.0
    max_stage: int | None = None
    probe_fraction: float = 0.05
    min_probe: int = 5
    warmup_steps: int | None = None
    warmup_lr: float | None = None
    reuse_winner: bool = True
    min_trials: int = 2
    tolerance: float = 0.002
    max_change: float = 3.0
    observe_incumbent: bool = True
    anneal: float = 0.2

    def __post_init__(self) -> None:
        if (self.lr_min is None) != (self.lr_max is None):
            raise ValueError("AutoLRS needs both lr_min and lr_max, or neither (the range test finds them)")
        if self.lr_min is not None and not 0 < self.lr_min < self.lr_max:  # type: ignore[operator]
            raise ValueError(f"AutoLRS needs 0 < lr_min < lr_max, got {self.lr_min!r}, {self.lr_max!r}")
        if len(self.sweep) != 2 or not 0 < self.sweep[0] < self.sweep[1]:
            raise ValueError(f"AutoLRS.sweep must be (low, high) with 0 < low < high, got {self.sweep!r}")
        if not self.peak_factor > 0:
            raise ValueError(f"AutoLRS.peak_factor must be > 0, got {self.peak_factor!r}")
        if self.range_steps is not None and self.range_steps < 8:
            raise ValueError(f"AutoLRS.range_steps must be >= 8, got {self.range_steps!r}")
        if not isinstance(self.trials, int) or self.trials < 2:
            raise ValueError(f"AutoLRS.trials must be an integer >= 2, got {self.trials!r}")
        if not 1 <= self.startup_trials <= self.trials:
            raise ValueError(f"AutoLRS.startup_trials must lie in [1, trials], got {self.startup_trials!r}")
        if self.min_probe < 3:
            raise ValueError(f"AutoLRS.min_probe must be >= 3 (3 points fit a, b, c), got {self.min_probe!r}")
        if self.first_stage is not None and self.first_stage < 2 * self.min_probe:
            raise ValueError(f"AutoLRS.first_stage must be >= 2·min_probe, got {self.first_stage!r}")
        if self.growth < 1 or (self.max_stage is not None and self.first_stage is not None
                               and self.max_stage < self.first_stage):
            raise ValueError("AutoLRS needs growth >= 1 and max_stage >= first_stage")
        if (self.warmup_steps is not None and self.warmup_steps < 0) or (
                self.warmup_lr is not None and not self.warmup_lr > 0):
            raise ValueError("AutoLRS needs warmup_steps >= 0 and warmup_lr > 0")
        if not 0 < self.probe_fraction < 1:
            raise ValueError(f"AutoLRS.probe_fraction must lie in (0, 1), got {self.probe_fraction!r}")
        if self.min_trials != 0 and not 2 <= self.min_trials <= self.trials:
            raise ValueError(f"AutoLRS.min_trials must be 0 or lie in [2, trials], got {self.min_trials!r}")
        if self.max_change != 0 and not self.max_change > 1:
            raise ValueError(f"AutoLRS.max_change must be 0 or > 1, got {self.max_change!r}")
        if not self.tolerance >= 0:
            raise ValueError(f"AutoLRS.tolerance must be >= 0, got {self.tolerance!r}")
        if not 0 <= self.anneal < 1:
            raise ValueError(f"AutoLRS.anneal must lie in [0, 1), got {self.anneal!r}")

    def probe_len(self, tau: int) -> int:
        return max(self.min_probe, round(self.probe_fraction * tau))

    @property
    def initial_lr(self) -> float:
        """The LR the optimizer is built with (every step's LR is set by the tuner)."""
        lo, hi = (self.lr_min, self.lr_max) if self.lr_min is not None else self.sweep
        return math.sqrt(lo * hi)  # type: ignore[operator]


# -- the range test ----------------------------------------------------------------------------


def sweep_lrs(lo: float, hi: float, steps: int) -> list[float]:
    """The range test's LRs: geometric from `lo` to `hi` in `steps` steps."""
    return [lo * (hi / lo) ** (i / (steps - 1)) for i in range(steps)]


def sweep_diverged(losses: list[float]) -> bool:
    """The sweep has passed every useful LR: its last loss is not finite, or the sweep has
    trained (its lowest loss at least 10% below its first) and then lost all of it (the last
    loss above the first). The margin keeps one noisy batch near the start from ending it."""
    if len(losses) < 2:
        return False
    first, last = losses[0], losses[-1]
    if not math.isfinite(last):
        return True
    return min(losses) < first - 0.1 * abs(first) and last > first


def read_range_test(lrs: list[float], losses: list[float], *, within: float = 0.1) -> float:
    """lr_k, the sweep's knee: the first LR at which the loss, smoothed by a centred moving
    average of w = max(3, R/8) points (odd) so that one noisy batch cannot decide it, is within
    `within` of its whole fall (its first smoothed value − its lowest) of its lowest:

        lr_k = lr[min{ j : s_j ≤ min(s) + within·(s_0 − min(s)) }]

    A sweep cut short by divergence is read over the steps it ran, the diverging one excluded."""
    n = len(losses)
    if sweep_diverged(losses):
        n -= 1
    y = np.asarray(losses[:n], dtype=float)
    if n < 3:
        return lrs[0]
    w = max(3, n // 8) | 1
    w = min(w, n if n % 2 else n - 1)
    smooth = np.convolve(y, np.ones(w) / w, mode="valid")  # smooth[j] centres on point j + w//2
    low = float(smooth.min())
    knee = int(np.argmax(smooth <= low + within * (float(smooth[0]) - low)))
    return float(lrs[knee + w // 2])


# -- the forecast ---------------------------------------------------------------------------


def fit_exponential(t: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares fit of y ≈ a·e^(b·t) + c with b < 0.

    For a fixed b the model is linear in (a, c), so the fit is a one-dimensional search over b:
    a log-spaced grid of decay rates (from 1/1000 to 3 of the curve's length per step), the
    closed-form (a, c) for each, then a bounded refinement of b around the best grid point.
    """
    from scipy.optimize import minimize_scalar

    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    if t.shape != y.shape or t.size < 3:
        raise ValueError("fit_exponential needs at least 3 points of equal-length t and y")
    span = max(float(t.max() - t.min()), 1.0)

    def solve(b: float) -> tuple[float, float, float]:
        x = np.exp(b * (t - t[0]))
        design = np.stack([x, np.ones_like(x)], axis=1)
        (a0, c), *_ = np.linalg.lstsq(design, y, rcond=None)
        sse = float(np.sum((design @ np.array([a0, c]) - y) ** 2))
        return sse, float(a0), float(c)

    grid = -np.geomspace(1e-3 / span, 3.0, 60)
    sses = [solve(float(b))[0] for b in grid]
    i = int(np.argmin(sses))
    lo, hi = grid[min(i + 1, len(grid) - 1)], grid[max(i - 1, 0)]
    b = float(minimize_scalar(lambda b: solve(b)[0], bounds=(min(lo, hi), max(lo, hi)),
                              method="bounded").x) if lo != hi else float(grid[i])
    _, a0, c = solve(b)
    a = a0 * math.exp(-b * float(t[0]))  # refer a to t = 0: a·e^(b·t) = a0·e^(b·(t − t0))
    return a, b, c


def forecast(losses: list[float], horizon: int) -> float:
    """The loss a probe's curve (losses at t = 1..τ′) predicts at t = horizon.

    A curve that is not finite (diverged) forecasts +inf; the caller maps it to a penalty.
    """
    y = np.asarray(losses, dtype=float)
    if not np.all(np.isfinite(y)):
        return math.inf
    t = np.arange(1, len(y) + 1, dtype=float)
    a, b, c = fit_exponential(t, y)
    value = a * math.exp(b * horizon) + c
    # A rising curve extrapolates without bound: cap it at its own range above its maximum (it
    # ranks last either way). A loss is never negative.
    hi = float(y.max()) + abs(float(y[-1] - y[0]))
    return float(min(max(value, 0.0), hi))


# -- the tuner's state and decisions ---------------------------------------------------------


@dataclass(kw_only=True)
class TunerState:
    """Everything the tuner knows; saved in each checkpoint as `extra["autolrs"]`."""

    ranging: bool = False  # the range test is still to run
    sweep: list[list[float]] = field(default_factory=list)  # the range test's [lr, loss] steps
    lr_range: list[float] | None = None  # [lo, hi] the range test measured
    peak: float | None = None  # the warm-up's LR the range test measured
    stage: int = 0
    stage_start: int = 0  # data position where the stage began
    tau: int = 0  # steps in this stage (probe of the winner included)
    probe_len: int = 0  # τ′ (0: this stage does not search)
    searching: bool = True
    annealing: bool = False  # this stage is the anneal: the LR decays from `lr` to zero
    trials: list[dict[str, Any]] = field(default_factory=list)  # this stage: lr, forecast, losses
    lr: float | None = None  # the stage's winner, once chosen
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per finished search
    # the last trained steps outside probes, [lr, loss] each (at most the longest probe): the
    # observed incumbent's curve (`AutoLRS.observe_incumbent`)
    recent: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TunerState:
        return cls(**d)


class Tuner:
    """The AutoLRS controller: what to try, what won, and where phases and stages begin and end.

    The worker drives it (`tidal.jobs.worker`): with `state.ranging`, the range test
    (`sweep()` from the initial state, then `tell_range(losses)`); the warm-up
    (`warmup_lr(step)` for the first `warmup_steps` steps); then at a stage start with
    `state.searching`, probes, each `ask()` → τ′ steps → `tell(lr, losses)`, then `choose()`; it
    then trains with `lr_at(step)` up to `stage_end`, and calls `next_stage(position, compute)`.
    Every length is fixed by the settings and the budget, so every rank and every resume
    computes the same ones.
    """

    def __init__(self, cfg: AutoLRS, *, seed: int, budget: int, state: TunerState | None = None,
                 study_path: str | Path | None = None) -> None:
        self.cfg = cfg
        self.seed = seed
        self.budget = budget
        self.study_path = Path(study_path) if study_path else None
        # the range test may take at most a quarter of the budget; below 8 steps there is none
        r = cfg.range_steps if cfg.range_steps is not None else min(100, max(20, round(budget / 25)))
        r = min(r, budget // 4)
        self.range_steps = r if cfg.lr_min is None and r >= 8 else 0
        self.warmup_steps = cfg.warmup_steps if cfg.warmup_steps is not None else round(0.05 * budget)
        self.first_stage = cfg.first_stage or max(20, 2 * cfg.min_probe, budget // 10)
        self.max_stage = max(cfg.max_stage or budget, self.first_stage)
        self.anneal_steps = round(cfg.anneal * budget)
        if state is not None:
            self.state = state
        elif self.range_steps:
            self.state = TunerState(ranging=True, searching=False)
        else:
            self.state = TunerState()
            self._begin(self.warmup_steps, self.first_stage, compute=self.warmup_steps)

    @property
    def lr(self) -> float:
        """The stage's LR: its winner, or before any search the warm-up's."""
        return self.state.lr if self.state.lr is not None else self.warmup_peak

    def lr_at(self, position: int) -> float:
        """The LR of the trained step at data position `position` outside a search: the stage's
        winner, or in the anneal w·(1 − √((k + 1)/(n + 1))) for its k-th of n steps."""
        s = self.state
        if not s.annealing:
            return self.lr
        k = position - s.stage_start
        return self.lr * (1.0 - math.sqrt((k + 1) / (s.tau + 1)))

    @property
    def stage_end(self) -> int:
        return self.state.stage_start + self.state.tau

    @property
    def warmup_peak(self) -> float:
        """The LR the warm-up ends at: `warmup_lr`, the range test's peak, or the initial LR."""
        if self.cfg.warmup_lr is not None:
            return self.cfg.warmup_lr
        return self.state.peak if self.state.peak is not None else self.cfg.initial_lr

    def warmup_lr(self, step: int) -> float:
        """The LR of warm-up step `step` (< warmup_steps): linear to `warmup_peak`."""
        return self.warmup_peak * (step + 1) / self.warmup_steps

    def probe_len(self, tau: int) -> int:
        return self.cfg.probe_len(tau)

    # -- the range test

    def sweep(self) -> list[float]:
        """The range test's LRs (the worker stops early once `sweep_diverged`)."""
        return sweep_lrs(*self.cfg.sweep, self.range_steps)

    def tell_range(self, losses: list[float]) -> None:
        """The range test's losses (one per swept LR, from the initial state): the warm-up's peak
        is the knee's LR × `peak_factor`, the candidates' range [peak/10, 3·peak].
        The first stage starts after the warm-up, planned on the budget the test left."""
        s = self.state
        lrs = self.sweep()[: len(losses)]
        knee = read_range_test(lrs, losses)
        s.sweep = [[lr, float(x)] for lr, x in zip(lrs, losses, strict=True)]
        peak = knee * self.cfg.peak_factor
        s.peak, s.lr_range, s.ranging, s.searching = peak, [peak / 10, 3 * peak], False, True
        self._begin(self.warmup_steps, self.first_stage, compute=len(losses) + self.warmup_steps)

    # -- the stages

    def previous_winner(self) -> float | None:
        """The winning LR of the last stage before this one (None in the first stage)."""
        before = [h for h in self.state.history if h["stage"] < self.state.stage]
        return float(before[-1]["lr"]) if before else None

    def incumbent(self) -> float | None:
        """The stage's first candidate, the one to beat (`AutoLRS.reuse_winner`): the previous
        stage's winner, or in the first stage the LR the warm-up has just reached (the model is
        trained at it now; None without a warm-up). A first stage that drew all its candidates
        at random could settle on one near the range's floor and keep the run there."""
        if not self.cfg.reuse_winner:
            return None
        prev = self.previous_winner()
        if prev is not None or self.warmup_steps == 0:
            return prev
        return self.warmup_peak

    def bounds(self) -> tuple[float, float]:
        """This stage's candidate range: the measured or configured one, within `max_change`
        of the previous winner (`AutoLRS.max_change`), and not below the incumbent unless
        `AutoLRS.search_down`."""
        if self.state.lr_range is not None:
            lo, hi = self.state.lr_range
        elif self.cfg.lr_min is not None and self.cfg.lr_max is not None:
            lo, hi = self.cfg.lr_min, self.cfg.lr_max
        else:
            lo, hi = self.cfg.sweep
        prev = self.previous_winner()
        if self.cfg.max_change and prev is not None:
            lo, hi = max(lo, prev / self.cfg.max_change), min(hi, prev * self.cfg.max_change)
        inc = self.incumbent()
        if not self.cfg.search_down and inc is not None:
            lo = max(lo, min(inc, hi))
        return lo, hi

    def _distribution(self) -> Any:
        from optuna.distributions import FloatDistribution

        return FloatDistribution(*self.bounds(), log=True)

    def _trial(self, tr: dict[str, Any], **user_attrs: Any) -> Any:
        """A finished Optuna trial of one probe of this stage."""
        from optuna.trial import create_trial

        return create_trial(params={"lr": tr["lr"]}, distributions={"lr": self._distribution()},
                            value=tr["value"], user_attrs=user_attrs or None)

    def ask(self) -> float:
        """The next candidate LR of this stage (rank 0 only; the worker broadcasts it).

        The study is rebuilt from the stage's trials, so the proposal is a function of the
        checkpointed state only: a resumed stage asks for the same candidates."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        n = len(self.state.trials)
        first = self.incumbent()
        if n == 0 and first is not None:
            return first
        sampler = optuna.samplers.GPSampler(
            seed=(self.seed * 1_000_003 + self.state.stage * 1009 + n) % (2**31),
            n_startup_trials=self.cfg.startup_trials,
        )
        study = optuna.create_study(direction="minimize", sampler=sampler)
        for tr in self.state.trials:
            study.add_trial(self._trial(tr))
        trial = study.ask({"lr": self._distribution()})
        return float(trial.params["lr"])

    def tell(self, lr: float, losses: list[float]) -> bool:
        """Record a finished probe; True if its forecast is the best of the stage so far."""
        return self._record(lr, losses, self.state.tau, observed=False)

    def _record(self, lr: float, losses: list[float], horizon: int, *, observed: bool) -> bool:
        f = forecast(losses, horizon)
        # A diverged probe gets a finite penalty (the GP needs numbers): worse than any curve.
        value = f if math.isfinite(f) else (max(losses[0], 0.0) + 10.0 if math.isfinite(losses[0]) else 1e6)
        best = min((tr["value"] for tr in self.state.trials), default=math.inf)
        self.state.trials.append({"lr": lr, "value": value, "losses": [float(x) for x in losses],
                                  "observed": observed})
        return value < best

    def observe(self, lr: float, loss: float) -> None:
        """A trained step outside the probes (the worker calls it for every one): the observed
        incumbent's curve is the last of them (`AutoLRS.observe_incumbent`)."""
        self.state.recent.append([float(lr), float(loss)])
        del self.state.recent[:-self.probe_len(self.max_stage)]

    def search_done(self) -> bool:
        """All `trials` tried, or (adaptive, `AutoLRS.min_trials`) the last trial, after enough
        of them, did not improve the stage's best forecast by more than the tolerance."""
        cfg, values = self.cfg, [tr["value"] for tr in self.state.trials]
        if len(values) >= cfg.trials:
            return True
        if cfg.min_trials == 0:
            return False
        fresh = self.incumbent() is None
        if len(values) < (max(cfg.min_trials, cfg.startup_trials + 1) if fresh else cfg.min_trials):
            return False
        best_before = min(values[:-1])
        return values[-1] > best_before - cfg.tolerance * abs(best_before)

    def choose(self) -> float:
        """End the search: the winner's probe steps become this stage's first steps."""
        s = self.state
        win = min(s.trials, key=lambda tr: tr["value"])
        s.lr, s.searching = float(win["lr"]), False
        s.history.append({"stage": s.stage, "start": s.stage_start, "tau": s.tau,
                          "probe_len": s.probe_len, "lr": s.lr,
                          "trials": [(tr["lr"], tr["value"]) for tr in s.trials],
                          "observed": [bool(tr.get("observed")) for tr in s.trials]})
        self._mirror_study()
        return s.lr

    def next_stage(self, position: int, compute: int) -> None:
        """The stage after the current one, starting at data position `position` with `compute`
        optimizer steps (probes included) spent: τ_{n+1} = min(max_stage, growth·τ_n)."""
        self.state.stage += 1
        self._begin(position, min(self.max_stage, round(self.cfg.growth * self.state.tau)), compute)

    def _begin(self, position: int, tau: int, compute: int) -> None:
        """A stage of (up to) τ steps at `position`, shrunk to what the stable phase (the budget,
        in compute steps, less the anneal) has left after the search; when the rest cannot pay
        for a search, the stage trains on with the previous winner; once the stable phase is
        spent, the anneal takes the rest of the budget.

        The probe is sized for the stage that will run: τ′ = probe_len(min(τ, left)). A stage
        cut below `first_stage`, the shortest stage the settings think worth a search, trains
        on without one: its probes (at least `min_probe` each) would cost as much as the stage
        itself."""
        s, cfg = self.state, self.cfg
        used = max(compute, position)
        left = self.budget - self.anneal_steps - used
        s.stage_start = position
        s.trials = []
        if left <= 0:  # the anneal (or, without one, the budget's last steps)
            s.tau, s.probe_len, s.searching = max(1, self.budget - used), 0, False
            s.annealing = self.anneal_steps > 0
            return
        probe = self.probe_len(min(tau, left))
        overhead = (cfg.trials - 1) * probe
        stage = min(tau, left - overhead)
        inc = self.incumbent()
        room = self.cfg.search_down or inc is None or inc < self.bounds()[1] * (1 - 1e-9)
        if stage >= max(2 * probe, self.first_stage) and room:
            s.tau, s.probe_len, s.searching = stage, probe, True
        else:  # no room for a search, or (upward only) the incumbent is at the range's top
            s.tau, s.probe_len, s.searching = left, 0, False
            return
        inc = self.previous_winner()
        tail = s.recent[-probe:]
        if (cfg.observe_incumbent and cfg.reuse_winner and inc is not None and len(tail) == probe
                and all(lr == inc for lr, _ in tail)):
            # its curve's points are the states stage_start − τ′ … stage_start − 1; a probe's
            # t = 1 is stage_start: the stage ends at t = τ′ + τ on the tail's clock
            self._record(inc, [loss for _, loss in tail], probe + s.tau, observed=True)

    def _mirror_study(self) -> None:
        """Write the finished stage's trials as an Optuna study in the job's SQLite file."""
        if self.study_path is None:
            return
        import optuna

        self.study_path.parent.mkdir(parents=True, exist_ok=True)
        s = self.state
        study = optuna.create_study(storage=f"sqlite:///{self.study_path}",
                                    study_name=f"stage-{s.stage:03d}-at-step-{s.stage_start}",
                                    direction="minimize", load_if_exists=True)
        if study.trials:  # already written (a stage finished, then the run resumed before it)
            return
        for i, tr in enumerate(s.trials):
            study.add_trial(self._trial(tr, trial=i, probe_losses=tr["losses"], stage_start=s.stage_start,
                                        tau=s.tau))
        study.set_user_attr("winner_lr", s.lr)


def plot_schedule(rows_by_method: dict[str, list[dict[str, Any]]], path: str | Path, *,
                  x: str = "compute_steps", target: float | None = None) -> None:
    """Loss (top) and learning rate (bottom, log scale) per method against compute steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_lr) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name, rows in rows_by_method.items():
        xs = [r.get(x, r["step"]) for r in rows]
        ax_loss.plot(xs, [r["loss"] for r in rows], lw=0.8, alpha=0.5, label=f"{name} (train)")
        ev = [(r.get(x, r["step"]), r["val_loss"]) for r in rows if r.get("val_loss") is not None]
        if ev:
            ax_loss.plot(*zip(*ev, strict=True), marker="o", ms=3, label=f"{name} (validation)")
        ax_lr.plot(xs, [r["lr"] for r in rows], label=name)
    if target is not None:
        ax_loss.axhline(target, color="k", ls="--", lw=0.8, label="target")
    ax_loss.set_ylabel("loss")
    ax_loss.legend(fontsize=7)
    ax_lr.set_yscale("log")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel(x.replace("_", " "))
    ax_lr.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
