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
