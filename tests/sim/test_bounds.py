"""The makespan bound (`tidal.sim.bounds`): exact on instances worked by hand, and below every
policy's makespan on seeded workloads."""

from __future__ import annotations

import pytest

from tests.sim.test_simulator import RUBICK
from tidal.sim.bounds import makespan_bound
from tidal.sim.simulator import POLICIES, SimConfig, Simulator
from tidal.sim.tables import Truth
from tidal.sim.views import SimPlanner
from tidal.sim.workload import SimJob, synthetic

CFG = SimConfig(nodes=2, gpus_per_node=8)


@pytest.fixture(scope="module")
def world() -> tuple[Truth, SimPlanner]:
    truth = Truth(RUBICK)
    return truth, SimPlanner(truth=truth, fit_restarts=3)


def _job(name: str, submit: float, steps: int, app: str = "bert") -> SimJob:
    return SimJob(name=name, submit=submit, app=app, num_gpus=4, num_cpus=32, exec_plan="ga", steps=steps)


def test_one_job_alone_is_its_fastest_option_from_its_arrival(world: tuple[Truth, SimPlanner]) -> None:
    truth, planner = world
    job = _job("a", 100.0, 1000)
    opts = planner.options(job, "co")
    fastest = min(truth.best_time("bert", o.plan, o.gpus, 8) for o in opts)
    b = makespan_bound([job], truth, lambda j: planner.options(j, "co"), CFG)
    assert b.critical == "a"
    assert b.job_s == pytest.approx(260.0 + 1000 * fastest)  # from the first (its own) arrival
    assert b.makespan_s == pytest.approx(max(b.job_s, b.work_s))
    # one job's work bound is its fewest GPU-seconds spread over the whole cluster: never more
    assert b.work_s <= b.job_s


def test_many_jobs_at_once_are_bound_by_their_work(world: tuple[Truth, SimPlanner]) -> None:
    truth, planner = world
    jobs = [_job(f"j{i}", 0.0, 2000) for i in range(40)]
    b = makespan_bound(jobs, truth, lambda j: planner.options(j, "co"), CFG)
    one = makespan_bound(jobs[:1], truth, lambda j: planner.options(j, "co"), CFG)
    assert b.job_s == pytest.approx(one.job_s)  # the same job, at the same time
    assert b.work_s == pytest.approx(40 * one.work_s)  # 40 times the GPU-seconds on the same GPUs
    assert b.makespan_s == b.work_s > b.job_s


def test_a_late_arrival_counts_only_the_work_after_it(world: tuple[Truth, SimPlanner]) -> None:
    truth, planner = world
    early = [_job(f"e{i}", 0.0, 2000) for i in range(40)]
    late = _job("late", 1e6, 10)
    b = makespan_bound([*early, late], truth, lambda j: planner.options(j, "co"), CFG)
    assert b.critical == "late"
    assert b.makespan_s == pytest.approx(b.job_s)
    assert b.job_s > 1e6


@pytest.mark.parametrize("name", ["tidal", "rubick", "fifo_static", "tiresias"])
def test_no_policy_beats_the_bound(world: tuple[Truth, SimPlanner], name: str) -> None:
    truth, planner = world
    kind = POLICIES[name].kind
    for seed in (1, 2):
        jobs = synthetic(truth, jobs=30, jobs_per_hour=90, seed=seed,
                         mix={"bert": 1.0, "gpt2": 1.0, "t5": 1.0, "vit": 1.0}, median_s=300, sigma=1.5)
        b = makespan_bound(jobs, truth, lambda j: planner.options(j, kind), CFG)
        m = Simulator(jobs, truth, planner, POLICIES[name], CFG).run().metrics
        assert b.makespan_s <= m["makespan_s"] + 1e-6, (name, seed, b, m["makespan_s"])
        assert b.makespan_s > 0.5 * m["makespan_s"]  # and not vacuous: within 2× of a real schedule


def test_no_jobs_is_an_error(world: tuple[Truth, SimPlanner]) -> None:
    truth, planner = world
    with pytest.raises(ValueError, match="no jobs"):
        makespan_bound([], truth, lambda j: planner.options(j, "co"), CFG)
