"""The scheduler actor on a real two-node Ray cluster (2 logical GPUs per node, gloo on CPU).

One scenario covers the core of the scheduler: job A starts alone; job B arrives; the
scheduler reconfigures A and starts B; the scheduler actor is killed mid-run and restarts;
both jobs finish with falling loss curves equal to uninterrupted runs; every run's workers
ran on the nodes its decision named.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import ray

from tests.conftest import tiny_gpt_spec
from tidal.jobs import Plan
from tidal.jobs.runner import Resources, launch
from tidal.platform import sdk
from tidal.platform.scheduler import NAMESPACE, SCHEDULER_NAME, SchedulerConfig

pytestmark = pytest.mark.integration


def _wait(pred: Any, what: str, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)


@pytest.fixture
def scheduler(ray_cluster: Any, tmp_path: Path) -> Any:
    cfg = SchedulerConfig(tick_s=1.0, state_path=str(tmp_path / "tidal.sqlite"), profile_samples=2,
                          profile_steps=1, profile_gpus=0.0, restart_cost_s=1.0)
    actor = sdk.connect(cfg)
    assert ray.get(actor.ping.remote()) == "ok"
    yield actor
    ray.kill(actor, no_restart=True)
    time.sleep(2)


def test_two_jobs_reconfiguration_and_scheduler_restart(scheduler: Any) -> None:
    # long enough that sharing the GPUs pays for A's restart (the policy's damping)
    spec_a = tiny_gpt_spec(name="job-a", total_steps=300, max_gpus=4, checkpoint_every=10)
    spec_b = tiny_gpt_spec(name="job-b", total_steps=120, max_gpus=4, checkpoint_every=10, seed=1)
    a = sdk.JobHandle(ray.get(scheduler.submit.remote(spec_a)), scheduler)
    _wait(lambda: a.status()["state"] == "RUNNING", "A to start")
    gpus_alone = a.status()["gpus"]
    b = sdk.JobHandle(ray.get(scheduler.submit.remote(spec_b)), scheduler)
    _wait(lambda: b.status()["state"] == "RUNNING", "B to start")
    events = ray.get(scheduler.recent_events.remote())
    assert a.status()["restarts"] >= 1, f"A was not reconfigured: alone on {gpus_alone} GPUs; {events}"
    assert a.status()["gpus"] + b.status()["gpus"] <= 4
    assert a.status()["gpus"] < gpus_alone

    _wait(lambda: b.status()["step"] >= 10, "B to train a while")
    ray.kill(scheduler, no_restart=False)  # the actor restarts and must find both jobs
    actor = ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
    _wait(lambda: ray.get(actor.ping.remote()) == "ok", "the scheduler to restart", 120)
    a, b = sdk.JobHandle(a.job_id, actor), sdk.JobHandle(b.job_id, actor)
    assert {r["job_id"] for r in sdk.list_jobs()} >= {a.job_id, b.job_id}

    final_a, final_b = a.wait(timeout=600, poll_s=2), b.wait(timeout=600, poll_s=2)
    assert final_a["state"] == final_b["state"] == "SUCCEEDED", (final_a, final_b)
    events = ray.get(actor.recent_events.remote())
    assert any("recovered" in e for e in events), events

    plan = Plan(dp=2, zero_stage=1, micro_batch=4)
    res = Resources(num_workers=2, gpus_per_worker=1)
    uninterrupted = [launch(spec, plan, res) for spec in (spec_a, spec_b)]  # both at once: 4 GPUs
    for spec, handle, ref in zip((spec_a, spec_b), (a, b), uninterrupted, strict=True):
        curve = handle.logs()
        assert [m["step"] for m in curve] == list(range(1, spec.total_steps + 1))
        assert sum(m["loss"] for m in curve[-5:]) / 5 < curve[0]["loss"] - 0.5
        whole = ref.result(timeout=600)
        rel = [abs(x - m["loss"]) / x for x, m in zip(whole.losses, curve, strict=True)]
        assert max(rel) <= 1e-3, f"{spec.name}: max relative difference {max(rel):.2e}"
    # placements are checked by the restarted actor for the runs it collected
    for check in ray.get(actor.placements.remote()):
        assert check["decided"] == check["ran"], check
