"""Conformance: one scenario through the live executor (the scheduler actor on a real two-node Ray
cluster, Ray Train runs on logical GPUs) and through the simulated executor (virtual clock). Both
run the same controller step and policy; they must take the same actions in the same order:
the same stops, and the same launches on the same nodes with the same plans.

Scenario: A (1, 2 or 4 GPUs) starts alone on all 4; B arrives → A is stopped, A and B start
on 2 GPUs each, one node each; B finishes → A is stopped and relaunched on 4. The policy is
set so that decisions depend on the events only, not on timing (no restart cost, no aging,
a horizon so short that every job counts by throughput): what differs between the two
executors — how long things take — must not change what they decide.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_gpt_spec
from tidal.core.policy import Option, PolicyConfig
from tidal.jobs import Plan
from tidal.sim.simulator import POLICIES, SimConfig, Simulator
from tidal.sim.workload import SimJob

POLICY = PolicyConfig(horizon_s=1e-3, aging_s=1e9)
BATCH = 8
OPTIONS = {
    "A": tuple(Option(gpus=n, plan=Plan(dp=n, zero_stage=1, micro_batch=BATCH // n), samples_per_s=s,
                      cpus_per_gpu=1.0) for n, s in ((1, 100.0), (2, 190.0), (4, 360.0))),
    "B": tuple(Option(gpus=n, plan=Plan(dp=n, zero_stage=1, micro_batch=BATCH // n), samples_per_s=s,
                      cpus_per_gpu=1.0) for n, s in ((1, 100.0), (2, 190.0))),
}
STEPS = {"A": 1000, "B": 12}  # A outlives B by far on any machine (B: a run start + 12 steps)


class ScenarioWorld:
    """Truth and views of the scenario: each job runs exactly as fast as its options say."""

    def apps(self) -> tuple[str, ...]:
        return tuple(OPTIONS)

    def global_batch(self, app: str) -> int:
        return BATCH

    def plan_time(self, app: str, plan: Plan, gpus_per_node: tuple[int, ...]) -> float:
        return BATCH / next(o.samples_per_s for o in OPTIONS[app] if o.gpus == plan.num_gpus)

    def fastest(self, app: str, max_gpus: int) -> float:
        return min(BATCH / o.samples_per_s for o in OPTIONS[app] if o.gpus <= max_gpus)

    def options(self, job: SimJob, kind: Any) -> tuple[Option, ...]:
        return OPTIONS[job.app]

    def requested_throughput(self, job: SimJob) -> float:
        return OPTIONS[job.app][-1].samples_per_s


Action = tuple[str, str, tuple[tuple[int, int], ...], str]


def _normalise(actions: list[Any], node_ids: list[str], name_of: Any) -> list[Action]:
    index = {n: i for i, n in enumerate(sorted(node_ids))}
    return [(kind, name_of(job), tuple((index[n], g) for n, g in gpus), plan)
            for _, kind, job, gpus, plan in actions]


def _simulated() -> list[Action]:
    world = ScenarioWorld()
    jobs = [SimJob(name="A", submit=0.0, app="A", num_gpus=4, num_cpus=4, exec_plan="-", steps=STEPS["A"]),
            SimJob(name="B", submit=1.0, app="B", num_gpus=2, num_cpus=2, exec_plan="-", steps=STEPS["B"])]
    cfg = SimConfig(nodes=2, gpus_per_node=2, cpus_per_node=2.0, round_s=None, restart_s=0.0, policy=POLICY,
                    correction=None)  # as the live side's (below)
    result = Simulator(jobs, world, world, POLICIES["tidal"], cfg).run()
    assert sorted(r.name for r in result.jobs) == ["A", "B"]
    return _normalise(result.actions, ["node-000", "node-001"], lambda j: j)


def test_simulated_scenario_takes_the_expected_actions() -> None:
    acts = _simulated()
    assert [(k, j, sum(g for _, g in gpus)) for k, j, gpus, _ in acts] == [
        ("launch", "A", 4), ("stop", "A", 4), ("launch", "A", 2), ("launch", "B", 2),
        ("stop", "A", 2), ("launch", "A", 4)]


@pytest.mark.integration
def test_live_and_simulated_executors_take_the_same_actions(ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    from tidal.platform import sdk
    from tidal.platform.config import SchedulerConfig

    # no online correction: the simulator's would measure its table, the live one this CPU; the
    # suite compares the decisions of the shared code on the same inputs
    cfg = SchedulerConfig(tick_s=1.0, state_path=str(tmp_path / "tidal.sqlite"), restart_cost_s=0.0,
                          policy=POLICY, correction=None)
    training = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) >= 1]
    deadline = time.time() + 60  # the scenario starts with every GPU free (A takes all 4)
    while (free := sum(ray._private.state.available_resources_per_node().get(n, {}).get("GPU", 0)
                       for n in training)) < 4:
        assert time.time() < deadline, f"only {free} of the cluster's 4 GPUs came free before the scenario"
        time.sleep(0.5)
    actor = sdk.connect(cfg)
    try:
        specs = {name: tiny_gpt_spec(name=f"conf-{name.lower()}", total_steps=STEPS[name], max_gpus=4,
                                     checkpoint_every=1000, seed=i) for i, name in enumerate(OPTIONS)}
        a = sdk.JobHandle(ray.get(actor.submit.remote(specs["A"], OPTIONS["A"])), actor)
        deadline = time.time() + 300
        while a.status()["state"] != "RUNNING":
            assert time.time() < deadline, "A did not start"
            time.sleep(0.5)
        b = sdk.JobHandle(ray.get(actor.submit.remote(specs["B"], OPTIONS["B"])), actor)
        for h in (a, b):
            assert h.wait(timeout=900, poll_s=2)["state"] == "SUCCEEDED"
        live = ray.get(actor.actions.remote())
        names = {a.job_id: "A", b.job_id: "B"}
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) >= 1]
        assert _normalise(live, nodes, names.__getitem__) == _simulated()
        for check in ray.get(actor.placements.remote()):  # and the runs really ran there
            assert check["decided"] == check["ran"], check
    finally:
        ray.kill(actor, no_restart=True)
        time.sleep(2)
