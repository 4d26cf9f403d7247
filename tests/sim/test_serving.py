"""The inference pool in the simulator: every arm finishes every job, and no GPU is ever held by
Serve and training at once (ServingSim checks it every round and raises ServingError)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tidal.serving.loans import LoanConfig
from tidal.sim.serving import InferencePool
from tidal.sim.simulator import POLICIES, SimConfig, Simulator
from tidal.sim.tables import Truth
from tidal.sim.views import SimPlanner
from tidal.sim.workload import synthetic

RUBICK = Path(__file__).resolve().parents[3] / "shared" / "traces" / "rubick"


@pytest.fixture(scope="module")
def world() -> tuple[Truth, SimPlanner, list]:
    truth = Truth(RUBICK)
    planner = SimPlanner(truth=truth, fit_restarts=3)
    jobs = synthetic(truth, jobs=40, jobs_per_hour=40, seed=5, mix={"bert": 1.0, "gpt2": 1.0, "t5": 1.0},
                     median_s=900, sigma=1.0, sla_fraction=0.25)
    return truth, planner, jobs


def _rates(seed: int, n: int = 400) -> tuple[float, ...]:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    base = 0.2 + 0.8 * 0.5 * (1 - np.cos(2 * np.pi * t / n))
    return tuple(float(x) for x in np.clip(base * 160 * rng.lognormal(0, 0.3, n), 0, 160))


@pytest.mark.parametrize("mode", ["none", "evict", "shrink", "oracle"])
def test_arms_keep_serve_and_training_apart(world: tuple, mode: str) -> None:
    truth, planner, jobs = world
    pool = InferencePool(rates=_rates(1), loan=LoanConfig(replica_rps=10.0, predictive=mode == "shrink"),
                         mode=mode, nodes=2)  # type: ignore[arg-type]
    cfg = SimConfig(nodes=1, gpus_per_node=8)
    sim = Simulator(jobs, truth, planner, POLICIES["tidal"], cfg, serving=pool)
    r = sim.run()  # raises ServingError / CapacityError if an invariant breaks
    assert sorted(j.name for j in r.jobs) == sorted(j.name for j in jobs)
    m = r.metrics
    assert 0.0 <= m["slo_violation_rate"] < 1.0 and 0.0 < m["gpu_util_all"] <= 1.0
    assert sim.serving is not None
    for _, up, lent, _ in sim.serving.stats.timeline:
        assert up + lent <= 16 and lent >= 0
    if mode == "oracle":  # it knows the demand until a reclaim could answer: never a shortfall
        assert m["slo_violation_rate"] == 0
    if mode == "none":
        assert m["lent_gpu_s"] == 0 and m["slo_violation_rate"] == 0
    else:
        assert m["lent_gpu_s"] > 0  # the pool's idle GPUs were used
    # guaranteed jobs never ran on lent GPUs
    sla = {j.name for j in jobs if j.is_sla}
    assert not [a for a in r.actions
                if a[1] == "launch" and a[2] in sla and any(n.startswith("inf-") for n, _ in a[3])]


def test_loans_help_a_loaded_training_pool(world: tuple) -> None:
    truth, planner, jobs = world
    cfg = SimConfig(nodes=1, gpus_per_node=8)
    out = {}
    for mode in ("none", "shrink"):
        pool = InferencePool(rates=_rates(1), loan=LoanConfig(replica_rps=10.0), mode=mode, nodes=2)  # type: ignore[arg-type]
        out[mode] = Simulator(jobs, truth, planner, POLICIES["tidal"], cfg, serving=pool).run().metrics
    assert out["shrink"]["avg_jct_s"] < out["none"]["avg_jct_s"]
    assert out["shrink"]["gpu_util_all"] > out["none"]["gpu_util_all"]
