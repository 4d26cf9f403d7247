"""AutoLRS's settings: what `JobSpec(lr=AutoLRS(...))` or `lr="autolrs"` asks for (the phases
and their lengths: `tidal.jobs.autolrs`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class AutoLRS:
    """AutoLRS settings (`JobSpec(lr=AutoLRS(...))`; `lr="autolrs"` takes these defaults, which
    need no hint: every length is a share of the job's budget B, the range is measured).

    lr_min, lr_max: the log-scale range the candidates are drawn from. None (both): measured by
                    the range test (`tidal.jobs.autolrs`); given, there is no range test.
    range_steps:    R, the range test's steps (None: clamp(B/25, 20, 100)).
    sweep:          the LRs the range test sweeps, low to high.
    peak_factor:    the warm-up's peak is lr_k·peak_factor (lr_k: the range test's knee). 1 by
                    default: an LR above the best costs more than one below it (on the family's
                    grids, 2× above the best cosine ended up to 0.53 nats worse, 2× below at
                    most 0.12), and the stages can still raise it.
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
                    the last stage trains with its winner to the end). Half by default: a decay
                    that starts earlier is ahead of a constant LR all along it, not only at B.
    anneal_shape:   how it decays over the anneal's n steps, at its k-th: "sqrt",
                    w·(1 − √((k+1)/(n+1))) (Hägele et al. 2024's cooldown), or "cosine",
                    w·½(1 + cos(π(k+1)/(n+1))).
    """

    lr_min: float | None = None
    lr_max: float | None = None
    range_steps: int | None = None
    sweep: tuple[float, float] = (1e-5, 1e-1)
    peak_factor: float = 1.0
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
    anneal: float = 0.5
    anneal_shape: Literal["sqrt", "cosine"] = "cosine"

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
        if self.anneal_shape not in ("sqrt", "cosine"):
            raise ValueError(f"AutoLRS.anneal_shape must be 'sqrt' or 'cosine', got {self.anneal_shape!r}")

    def probe_len(self, tau: int) -> int:
        return max(self.min_probe, round(self.probe_fraction * tau))

    @property
    def initial_lr(self) -> float:
        """The LR the optimizer is built with (every step's LR is set by the tuner)."""
        lo, hi = (self.lr_min, self.lr_max) if self.lr_min is not None else self.sweep
        return math.sqrt(lo * hi)  # type: ignore[operator]
