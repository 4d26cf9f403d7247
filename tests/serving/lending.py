"""What the live lending tests share: the GPUs something else holds, the scheduler's settings."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def wait(pred: Any, what: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def hold_training_gpus(ray_cluster: Any, n: int = 2) -> list[Any]:
    """Actors holding `n` GPUs of the training pool's head node, as another Ray user's work would:
    a job wider than what is left grows only onto lent GPUs. `ray.kill` them after the test."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_gpus=1, num_cpus=0)
    class Other:
        def ping(self) -> int:
            return 1

    head = ray_cluster.node_ids[0]
    others = [Other.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
              for _ in range(n)]
    ray.get([o.ping.remote() for o in others])
    return others


def lending_config(tmp_path: Path) -> Any:
    """A scheduler that lends at once and reclaims fast: 1-s ticks and demand intervals, a 5-s
    lead time, no availability floor, restarts free (the mechanism is tested, not the prices)."""
    from tidal.core.policy import PolicyConfig
    from tidal.platform.config import SchedulerConfig
    from tidal.serving.loans import LoanConfig

    return SchedulerConfig(tick_s=1.0, state_path=str(tmp_path / "tidal.sqlite"), restart_cost_s=0.0,
                           cpus_per_worker=0.25, policy=PolicyConfig(aging_s=1e6),
                           loans=LoanConfig(replica_rps=1.0, interval_s=1.0, lead_s=5.0, min_replicas=0))


def submit_borrower(scheduler: Any, spec: Any) -> tuple[Any, tuple[Any, ...]]:
    """`spec` submitted with a fixed resource matrix on 1, 2 and 4 GPUs (ZeRO-1, global batch 8:
    no profiles), then waited for until it runs on 4 GPUs, 2 of them lent. (its handle, the
    options)"""
    import ray

    from tidal.core.policy import Option
    from tidal.jobs import Plan
    from tidal.platform import sdk

    options = tuple(Option(gpus=n, plan=Plan(dp=n, zero_stage=1, micro_batch=8 // n),
                           samples_per_s=100.0 * n) for n in (1, 2, 4))
    job = sdk.JobHandle(ray.get(scheduler.submit.remote(spec, options)), scheduler)
    wait(lambda: (st := job.status())["state"] == "RUNNING" and st["gpus"] == 4,
         "the job to run on 4 GPUs, 2 of them lent", 300)
    return job, options
