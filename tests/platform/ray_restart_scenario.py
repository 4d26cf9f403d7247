"""`ray stop` then `ray start` with the same $TIDAL_STATE, as a script of its own (its Ray cluster
must die whole, which the test session's cannot): run by `test_faults.test_ray_stop_and_start`.

    python -m tests.platform.ray_restart_scenario STATE_DIR OUT.json

A Ray cluster (one node, 2 logical GPUs) runs a scheduler; job R trains, job P is still
PROFILING; then the whole cluster is shut down (every Ray process dies: the scheduler actor, the
Train runs, the profile tasks) and a new one starts. The new scheduler, on the same state
directory, must finish both. Writes both jobs' final status, loss curves and events to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster

from tests.conftest import tiny_gpt_spec
from tidal.core.policy import PolicyConfig
from tidal.platform import sdk
from tidal.platform.config import SchedulerConfig

RUN = dict(name="restart-r", total_steps=80, max_gpus=1, checkpoint_every=10)  # job R's spec


def start() -> Cluster:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "num_gpus": 2, "include_dashboard": False, "labels": {"tidal.io/pool": "training"}})
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def wait(pred: Any, what: str, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while not pred():
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(1.0)


def main(state: Path, out: Path) -> None:
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    cfg = SchedulerConfig(tick_s=1.0, state_path=str(state / "tidal.sqlite"), profile_samples=2,
                          profile_steps=1, profile_gpus=0.0, restart_cost_s=0.0,
                          policy=PolicyConfig(aging_s=1e6))
    cluster = start()
    actor = sdk.connect(cfg)
    run = sdk.JobHandle(ray.get(actor.submit.remote(tiny_gpt_spec(**RUN))), actor)
    wait(lambda: run.status()["state"] == "RUNNING" and run.status()["step"] >= 25, "R to train")
    prof = sdk.JobHandle(ray.get(actor.submit.remote(tiny_gpt_spec(
        name=f"restart-p-{os.getpid()}", total_steps=30, max_gpus=1, seed=3, d_model=56))), actor)
    stopped_at = run.status()["step"]
    assert prof.status()["state"] == "PROFILING"
    ray.shutdown()
    cluster.shutdown()  # `ray stop`: every Ray process of the cluster dies
    print(f"cluster stopped: R at step {stopped_at}, P PROFILING", flush=True)

    cluster = start()  # `ray start`: a new cluster, the same $TIDAL_STATE and storage
    actor = sdk.connect(cfg)
    run, prof = sdk.JobHandle(run.job_id, actor), sdk.JobHandle(prof.job_id, actor)
    result: dict[str, Any] = {"stopped_at": stopped_at}
    for key, h in (("run", run), ("profiling", prof)):
        result[key] = {"final": h.wait(timeout=900, poll_s=2), "curve": h.logs(),
                       "events": ray.get(actor.job_events.remote(h.job_id))}
    result["placement_groups"] = [pg["state"] for pg in ray.util.placement_group_table().values()]
    out.write_text(json.dumps(result))
    ray.kill(actor, no_restart=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
