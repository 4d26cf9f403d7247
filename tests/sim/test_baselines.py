"""The baseline policies on hand-made snapshots (no simulator, no cluster)."""

from __future__ import annotations

from tests.core.test_policy import _job
from tidal.core.policy import Allocation, Node, PolicyConfig, Snapshot
from tidal.jobs import Plan
from tidal.sim import baselines


def test_rubick_does_not_shrink_a_job_restarted_too_often_but_grows_it() -> None:
    """The rule Tidal's policy applies (tests/core/test_policy.py has its twin): a job at
    `max_restarts` is never shrunk to admit another, and grows into GPUs nobody wants."""
    nodes = (Node(node_id="a", gpus=4),)
    cfg = PolicyConfig(max_restarts=5)
    two = Allocation(gpus_by_node=(("a", 2),), plan=Plan(dp=2, micro_batch=4))
    a = _job("A", 0, [1, 2, 4], [100, 190, 300], current=two, restarts=5, restart_cost_s=1)
    b = _job("B", 1, [1, 2, 4], [100, 190, 300])
    d = baselines.rubick(Snapshot(nodes=nodes, jobs=(a, b), config=cfg))
    assert d.allocations["A"] == two  # not shrunk for B, which takes what is free
    assert d.allocations["B"].gpus == 2
    full = Allocation(gpus_by_node=(("a", 4),), plan=Plan(dp=4, micro_batch=2))
    a_full = _job("A", 0, [1, 2, 4], [100, 190, 300], current=full, restarts=5, restart_cost_s=1)
    d = baselines.rubick(Snapshot(nodes=nodes, jobs=(a_full, b), config=cfg))
    assert d.allocations["A"] == full and "B" not in d.allocations
    # where the shrink loses less than B gains (4 → 2 GPUs: 0.1 of A's 1-GPU rate, against B's
    # 1.0), A gives B its GPUs below `max_restarts`, and not at it
    flat = [100.0, 190.0, 200.0]
    for restarts, a_gpus in ((4, 2), (5, 4)):
        a_flat = _job("A", 0, [1, 2, 4], flat, current=full, restarts=restarts, restart_cost_s=1)
        d = baselines.rubick(Snapshot(nodes=nodes, jobs=(a_flat, b), config=cfg))
        assert d.allocations["A"].gpus == a_gpus
        assert ("B" in d.allocations) == (a_gpus == 2)
    # alone on 1 GPU of 4, it grows
    one = Allocation(gpus_by_node=(("a", 1),), plan=Plan(dp=1, micro_batch=8))
    alone = _job("A", 0, [1, 2, 4], [100, 190, 300], current=one, restarts=5, restart_cost_s=1)
    assert baselines.rubick(Snapshot(nodes=nodes, jobs=(alone,), config=cfg)).allocations["A"].gpus == 4
