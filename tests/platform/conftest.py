"""The platform's integration fixture: a scheduler actor on the session's real Ray cluster."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidal.core.policy import PolicyConfig
from tidal.platform.config import SchedulerConfig


def wait(pred: Callable[[], Any], what: str, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)


def _start(tmp_path: Path, **overrides: Any) -> Iterator[Any]:
    # This tests the mechanism, not the damping (unit-tested in test_policy.py): with 4 logical
    # GPUs on 2 cores the model fitted from 1-2 worker profiles overestimates throughput several
    # times, so jobs look seconds from done and any restart cost would keep A as it is.
    # A whole CPU per worker: A's four workers hold every logical CPU of the cluster, so B's
    # profiles (on CPUs) can run only in capacity the scheduler reserves for them.
    fields: dict[str, Any] = dict(tick_s=1.0, state_path=str(tmp_path / "tidal.sqlite"), profile_samples=2,
                                  profile_steps=1, profile_gpus=0.0, restart_cost_s=0.0, cpus_per_worker=1.0,
                                  policy=PolicyConfig(aging_s=1e6))
    cfg = SchedulerConfig(**{**fields, **overrides})
    import ray

    from tidal.platform import sdk

    actor = sdk.connect(cfg)
    assert ray.get(actor.ping.remote()) == "ok"
    yield actor
    ray.kill(actor, no_restart=True)
    time.sleep(2)


@pytest.fixture
def scheduler(ray_cluster: Any, tmp_path: Path) -> Iterator[Any]:
    yield from _start(tmp_path)


@pytest.fixture
def scheduler_one_profile(ray_cluster: Any, tmp_path: Path) -> Iterator[Any]:
    """The same, profiling one plan per job (the admission tests' many jobs: half the profiles)."""
    yield from _start(tmp_path, profile_samples=1)
