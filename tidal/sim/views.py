"""What a simulated scheduler knows about a job: the planner's *fitted* model, never the truth.

For each application the simulated planner does what the live one does at submission
(`tidal.planner.fitting`): it profiles a few plans — here, ≤ `fit_rows` rows of the measured
tables chosen by the same sample selection (`tidal.planner.selection`), each with multiplicative
log-normal measurement noise — and fits the performance model (`tidal.planner.perfmodel`). Its
predictions then build what each policy chooses from (`Option`s, one per GPU count):

* `co`       every plan measured on n GPUs, the best predicted one per n (Tidal, Rubick);
* `elastic`  the user's plan kept, only the GPU count changes (Pollux/AFS-like);
* `tuned`    the requested GPU count with the best predicted plan, chosen once;
* `static`   the requested GPU count with the user's plan (a black box to the scheduler).

Model error therefore costs the simulated policies what it would cost the live one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Literal

import numpy as np

from tidal.core.policy import Option
from tidal.planner import traces
from tidal.planner.perfmodel import Fit, Hardware, Workload, fit
from tidal.planner.selection import select
from tidal.sim.tables import DP_CODES, Truth, packed, plan_of
from tidal.sim.workload import SimJob

Kind = Literal["co", "elastic", "tuned", "static"]


@dataclass(frozen=True, kw_only=True)
class AppModel:
    app: str
    work: Workload
    fit: Fit
    profiled: int  # rows the fit saw


@dataclass(kw_only=True)
class SimPlanner:
    truth: Truth
    noise: float = 0.05  # log-sd of the profiles' measurement noise
    fit_rows: int = 8
    seed: int = 0
    gpus_per_node: int = 8
    fit_restarts: int = 10  # the planner's own setting; tests use fewer
    hw: Hardware = field(default_factory=Hardware)

    def __post_init__(self) -> None:
        self._models: dict[str, AppModel] = {}
        self._options = lru_cache(maxsize=None)(self._options_uncached)

    def model(self, app: str) -> AppModel:
        if app not in self._models:
            root = self.truth.root
            work = traces.workload(root, app)
            pool = traces.profile_rows(root, app) + traces.placements(root, app)
            chosen = select(pool, lambda r: r.sample.point, self.fit_rows)
            rng = np.random.default_rng([self.seed, sorted(traces.MODELS).index(app)])
            samples = []
            for r in chosen:
                e = float(math.exp(rng.normal(0.0, self.noise)))
                s = r.sample
                samples.append(replace(s, iter_s=s.iter_s * e,
                                       fwd_s=None if s.fwd_s is None else s.fwd_s * e,
                                       sync_s=None if s.sync_s is None else s.sync_s * e,
                                       opt_s=None if s.opt_s is None else s.opt_s * e))
            fitted = fit(samples, work, self.hw, restarts=self.fit_restarts)
            self._models[app] = AppModel(app=app, work=work, fit=fitted, profiled=len(samples))
        return self._models[app]

    def predict(self, app: str, code: str, n: int) -> float:
        """Predicted seconds per iteration of `code` on n GPUs packed on the fewest nodes."""
        m = self.model(app)
        point = traces.decode_plan(code, packed(n, self.gpus_per_node))
        return m.fit.predict(m.work, point, self.hw).iter

    def best_code(self, app: str, n: int, allowed: tuple[str, ...] | None = None) -> str | None:
        codes = [c for c in self.truth.plans_at(app, n) if allowed is None or c in allowed]
        return min(codes, key=lambda c: (self.predict(app, c, n), c)) if codes else None

    def options(self, job: SimJob, kind: Kind) -> tuple[Option, ...]:
        return self._options(job.app, job.num_gpus, job.exec_plan, job.num_cpus / job.num_gpus, kind)

    def _option(self, app: str, code: str, n: int, cpus_per_gpu: float) -> Option:
        b = self.truth.global_batch(app)
        return Option(gpus=n, plan=plan_of(code, n, b), samples_per_s=b / self.predict(app, code, n),
                      cpus_per_gpu=cpus_per_gpu)

    def _options_uncached(self, app: str, gpus: int, code: str, cpus_per_gpu: float,
                          kind: Kind) -> tuple[Option, ...]:
        if kind == "static":
            return (self._option(app, code, gpus, cpus_per_gpu),)
        if kind == "tuned":
            tuned = self.best_code(app, gpus) or code
            return (self._option(app, tuned, gpus, cpus_per_gpu),)
        out = []
        for n in self.truth.gpu_counts(app):
            allowed: tuple[str, ...] | None
            if kind == "co":
                allowed = None
            elif code in DP_CODES:
                allowed = (code,)
            else:  # a 3D plan keeps its pipeline and tensor degrees; only data parallelism scales
                allowed = tuple(c for c in self.truth.plans_at(app, n)
                                if c not in DP_CODES and c[:2] == code[:2])
            best = self.best_code(app, n, allowed)
            if best is not None:
                out.append(self._option(app, best, n, cpus_per_gpu))
        if not out:
            out.append(self._option(app, code, gpus, cpus_per_gpu))
        return tuple(out)

    def requested_throughput(self, job: SimJob) -> float:
        """Predicted samples/s of the job's own request (its guarantee when `is_sla`)."""
        return self.truth.global_batch(job.app) / self.predict(job.app, job.exec_plan, job.num_gpus)


@dataclass(kw_only=True)
class PerfectPlanner(SimPlanner):
    """A diagnostic, not a planner: predictions *are* the truth table's times (packed placements,
    no profiling noise, no fit). A policy run with it shows what it does with a perfect model, so
    a benchmark can tell what a policy loses to the model's error from what it loses to its own
    decisions (`benchmarks/sim_sweep.py`'s rows "truth as Tidal's model" and "truth as both
    models"). Its seed and profiling settings go unused."""

    def model(self, app: str) -> AppModel:
        raise TypeError("PerfectPlanner fits no model: it predicts the truth table itself")

    def predict(self, app: str, code: str, n: int) -> float:
        return self.truth.iter_time(app, code, packed(n, self.gpus_per_node))
