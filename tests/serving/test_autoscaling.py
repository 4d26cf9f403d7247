"""Tidal's Serve autoscaling policy (`tidal.serving.autoscaling`) and the scheduler's side of it
(`tidal.serving.demand.ServeDemand`), no cluster: the policy gets Ray Serve's own
`AutoscalingContext` and config, and is also run through Serve's own wrapper (its delays and
bounds); the KV is a dictionary standing in for the GCS's."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from ray.serve._private.common import DeploymentID, ReplicaState
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from tests.serving.test_demand import _status
from tidal.serving.autoscaling import (
    FLOOR_TTL_S,
    FLOORS_KEY,
    NEED_TTL_S,
    PUBLISH_S,
    decide,
    floors,
    need_key,
    replicas_needed,
    tidal_policy,
)
from tidal.serving.demand import ServeDemand


class DictKV:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.puts = 0

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.puts += 1
        self.data[key] = value


CONFIG = AutoscalingConfig(min_replicas=0, max_replicas=8, target_ongoing_requests=2.0,
                           upscale_delay_s=0.0, downscale_delay_s=0.0)


def _ctx(requests: float, *, replicas: int = 1, state: dict[str, Any] | None = None, now: float = 100.0,
         config: AutoscalingConfig = CONFIG) -> AutoscalingContext:
    return AutoscalingContext(
        deployment_id=DeploymentID(name="gpt", app_name="gpt"), deployment_name="gpt", app_name="gpt",
        current_num_replicas=replicas, target_num_replicas=replicas, running_replicas=[],
        total_num_requests=requests, total_queued_requests=0.0, aggregated_metrics={}, raw_metrics={},
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas, policy_state=state or {},
        last_scale_up_time=None, last_scale_down_time=None, current_time=now, config=config)


def _floors(kv: DictKV, at: float, **floors_: int) -> None:
    kv.put(FLOORS_KEY, json.dumps({"at": at, "floors": {f"gpt/{k}": v for k, v in floors_.items()}}).encode())


def test_the_need_is_serves_own_ratio() -> None:
    assert replicas_needed(7.0, 2.0) == 3.5 and replicas_needed(-1.0, 2.0) == 0.0
    assert decide(_ctx(7.0), None, 100.0)[0] == 3.5  # no KV: the need alone


def test_the_policy_publishes_its_need_and_rises_to_a_fresh_floor() -> None:
    kv = DictKV()
    _floors(kv, at=99.0, gpt=3)
    want, state = decide(_ctx(1.0), kv, 100.0)
    assert want == 3.0  # the need (0.5) raised to the floor
    assert json.loads(kv.data[need_key("gpt/gpt")]) == {"need": 0.5, "at": 100.0}
    want, _ = decide(_ctx(10.0, state=state), kv, 100.5)
    assert want == 5.0  # a need above the floor is the need
    # within PUBLISH_S nothing is written or read again: Serve calls the policy every 0.1 s
    puts = kv.puts
    decide(_ctx(1.0, state=state), kv, 100.0 + PUBLISH_S / 2)
    assert kv.puts == puts


@pytest.mark.parametrize("record", [
    {"at": 100.0 - FLOOR_TTL_S - 1, "floors": {"gpt/gpt": 3}},  # stale: its scheduler is gone
    {"at": 99.0, "floors": {"gpt/other": 3}},  # another deployment's
    {"at": 99.0, "floors": {"gpt/gpt": -2}}, {"at": 99.0, "floors": {"gpt/gpt": "3"}},
    {"at": "yesterday"}, ["not", "a", "record"],
])
def test_a_stale_or_foreign_or_damaged_floor_is_no_floor(record: Any) -> None:
    kv = DictKV()
    kv.put(FLOORS_KEY, json.dumps(record).encode())
    assert decide(_ctx(1.0), kv, 100.0)[0] == 0.5
    kv.put(FLOORS_KEY, b"\xff not json")
    assert decide(_ctx(1.0), kv, 100.0)[0] == 0.5


def test_through_serves_wrapper_the_state_persists_and_delays_apply() -> None:
    """Through Ray Serve's own wrapper (what its controller calls on the policy; the replica
    bounds are applied after it): the policy's state comes back in the next context, so it
    publishes once per PUBLISH_S, not per 0.1-s tick; Serve's upscale delay applies to a floor as
    to a need; without Ray's KV (not initialised here) the policy is the need alone."""
    kv = DictKV()
    _floors(kv, at=100.0, gpt=6)
    policy = _apply_autoscaling_config(lambda ctx: decide(ctx, kv, ctx.current_time or 0.0))
    want, state = policy(_ctx(0.0, replicas=1))
    assert want == 6 and state["tidal_floor"] == 6
    puts = kv.puts
    assert policy(_ctx(0.0, replicas=1, state=state, now=100.0 + PUBLISH_S / 2))[0] == 6
    assert kv.puts == puts
    slow = AutoscalingConfig(min_replicas=0, max_replicas=8, target_ongoing_requests=2.0,
                             upscale_delay_s=10.0, downscale_delay_s=0.0)
    assert policy(_ctx(0.0, replicas=1, config=slow))[0] == 1  # not yet: Serve's delay
    assert _apply_autoscaling_config(tidal_policy)(_ctx(8.0, replicas=1))[0] == 4


def test_floors_give_each_its_need_and_share_the_spare_most_needed_first() -> None:
    rng = random.Random(0)
    for _ in range(500):
        needs = {f"d{i}": rng.choice([0.0, 0.3, 1.0, 2.5, 4.0]) for i in range(rng.randint(1, 4))}
        others, kept = rng.choice([0.0, 1.0, 2.0]), rng.randint(0, 12)
        got = floors(kept, needs, others)
        assert all(got[k] >= math.ceil(n) for k, n in needs.items())
        spare = max(0, kept - math.ceil(sum(needs.values()) + others))
        assert sum(got.values()) - sum(math.ceil(n) for n in needs.values()) == spare
        order = sorted(needs, key=lambda k: (-needs[k], k))
        extra = [got[k] - math.ceil(needs[k]) for k in order]
        assert extra == sorted(extra, reverse=True)  # never more to a less needed one
    assert floors(5, {}) == {}


def test_the_scheduler_reads_fresh_needs_and_other_deployments_replicas() -> None:
    """Tidal's deployment is read by its published need, another by its replica count; a need
    older than NEED_TTL_S (its policy no longer runs) falls back to the replica count."""
    kv, now = DictKV(), [1000.0]
    demand = ServeDemand(get=kv.get, put=kv.put, clock=lambda: now[0])
    status = _status({"gpt": {"gpt": {ReplicaState.RUNNING: 1, ReplicaState.STARTING: 2}},
                      "user": {"Model": {ReplicaState.RUNNING: 2}}})
    assert demand.read(status) == 3 + 2  # nothing published: replica counts
    kv.put(need_key("gpt/gpt"), json.dumps({"need": 0.75, "at": 999.0}).encode())
    assert demand.read(status) == 0.75 + 2
    assert demand.needs == {"gpt/gpt": 0.75} and demand.others == 2
    demand.publish(4)
    rec = json.loads(kv.data[FLOORS_KEY])
    assert rec == {"at": 1000.0, "floors": {"gpt/gpt": 2}}  # 4 kept - ⌈2.75⌉ = 1 spare over ⌈0.75⌉
    demand.publish(None)  # no bound on the demand yet: no floors
    assert json.loads(kv.data[FLOORS_KEY])["floors"] == {}
    now[0] += NEED_TTL_S + 1
    assert demand.read(status) == 3 + 2
    kv.put(need_key("gpt/gpt"), b'{"need": "lots", "at": 1011}')
    assert demand.read(status) == 3 + 2
