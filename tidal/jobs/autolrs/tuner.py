"""The AutoLRS controller's state and decisions: phases, stages, candidates, winners."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tidal.jobs.autolrs.forecast import forecast
from tidal.jobs.autolrs.range_test import read_range_test, sweep_lrs
from tidal.jobs.autolrs.settings import AutoLRS


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
        winner, or in the anneal, at its k-th of n steps with x = (k + 1)/(n + 1), w·(1 − √x)
        or w·½(1 + cos πx) (`AutoLRS.anneal_shape`)."""
        s = self.state
        if not s.annealing:
            return self.lr
        x = (position - s.stage_start + 1) / (s.tau + 1)
        if self.cfg.anneal_shape == "cosine":
            return self.lr * 0.5 * (1.0 + math.cos(math.pi * x))
        return self.lr * (1.0 - math.sqrt(x))

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
