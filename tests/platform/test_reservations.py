"""Profile reservations: which nodes they take, and that the policy leaves them alone."""

from __future__ import annotations

import random

import pytest

from tidal.core.policy import Allocation, JobView, Node, Option, Snapshot, decide
from tidal.jobs.spec import Plan
from tidal.platform.reservations import Reservation, reserve, without

NODES = [Node(node_id="a", gpus=2, cpus=2), Node(node_id="b", gpus=2, cpus=2)]


def test_free_node_first_then_packed_then_by_id() -> None:
    # b is free, a is full: both workers go to b (nobody has to shrink)
    r = reserve(NODES, {"a": (2, 2)}, 2, gpus_per_worker=1, cpus_per_worker=1)
    assert r is not None and r.workers == ("b", "b")
    # everything is held: packed on one node, the first by id
    r = reserve(NODES, {"a": (2, 2), "b": (2, 2)}, 2, gpus_per_worker=1, cpus_per_worker=1)
    assert r is not None and r.workers == ("a", "a")
    # one free worker slot on b, none on a: b first, then a
    r = reserve(NODES, {"a": (2, 2), "b": (1, 1)}, 1, gpus_per_worker=1, cpus_per_worker=1)
    assert r is not None and r.workers == ("b",)


def test_cpu_only_profiles_and_spanning_nodes() -> None:
    r = reserve(NODES, {}, 2, gpus_per_worker=0.0, cpus_per_worker=1)
    assert r is not None and r.workers == ("a", "a") and r.on("a") == (0.0, 2.0)
    small = [Node(node_id="x", gpus=1, cpus=4), Node(node_id="y", gpus=1, cpus=4)]
    r = reserve(small, {}, 2, gpus_per_worker=1, cpus_per_worker=1)
    assert r is not None and sorted(r.workers) == ["x", "y"]


def test_too_big_or_already_reserved_is_none() -> None:
    assert reserve(NODES, {}, 5, gpus_per_worker=1, cpus_per_worker=1) is None
    first = reserve(NODES, {}, 2, gpus_per_worker=1, cpus_per_worker=1)
    assert first is not None
    second = reserve(NODES, {}, 2, gpus_per_worker=1, cpus_per_worker=1, reserved=[first])
    assert second is not None and set(second.workers).isdisjoint(first.workers)
    assert reserve(NODES, {}, 1, gpus_per_worker=1, cpus_per_worker=1, reserved=[first, second]) is None
    with pytest.raises(ValueError, match="at least one worker"):
        reserve(NODES, {}, 0, gpus_per_worker=1, cpus_per_worker=1)


def test_without_takes_whole_gpus_and_cpus() -> None:
    r = Reservation(workers=("a",), gpus_per_worker=0.5, cpus_per_worker=1.0)
    a, b = without(NODES, [r])
    assert (a.gpus, a.cpus) == (1, 1.0)  # half a GPU is a whole GPU to the policy
    assert (b.gpus, b.cpus) == (2, 2.0)


def _job(jid: str, arrival: float, current: Allocation | None = None) -> JobView:
    options = tuple(Option(gpus=g, plan=Plan(dp=g, micro_batch=8 // g), samples_per_s=10.0 * g ** 0.9,
                           cpus_per_gpu=1.0) for g in (1, 2, 4))
    return JobView(job_id=jid, arrival=arrival, options=options, current=current, restart_cost_s=0.0)


def test_policy_makes_room_for_a_reservation_on_a_full_cluster() -> None:
    """Job A holds all 4 GPUs and CPUs. With 2 profile workers reserved the policy moves A off
    the reserved node, and never places anything on reserved capacity."""
    full = Allocation(gpus_by_node=(("a", 2), ("b", 2)), plan=Plan(dp=4, micro_batch=2))
    jobs = (_job("A", 0.0, full),)
    held = {"a": (2.0, 2.0), "b": (2.0, 2.0)}
    r = reserve(NODES, held, 2, gpus_per_worker=0.0, cpus_per_worker=1.0)
    assert r is not None
    d = decide(Snapshot(nodes=tuple(without(NODES, [r])), jobs=jobs))
    assert "A" in d.changed
    used_cpus = {n: 0.0 for n in ("a", "b")}
    for alloc in d.allocations.values():
        for nid, g in alloc.gpus_by_node:
            used_cpus[nid] += g
    for n in NODES:
        assert used_cpus[n.node_id] + r.on(n.node_id)[1] <= n.cpus


def test_reserved_capacity_is_never_allocated_random() -> None:
    rng = random.Random(7)
    for _ in range(200):
        nodes = [Node(node_id=f"n{i}", gpus=rng.randint(1, 8), cpus=float(rng.randint(1, 16)))
                 for i in range(rng.randint(1, 4))]
        jobs = tuple(_job(f"j{k}", float(k)) for k in range(rng.randint(1, 4)))
        workers = rng.randint(1, 2)
        r = reserve(nodes, {}, workers, gpus_per_worker=rng.choice([0.0, 0.5, 1.0]),
                    cpus_per_worker=1.0)
        if r is None:
            continue
        d = decide(Snapshot(nodes=tuple(without(nodes, [r])), jobs=jobs))
        gpus = {n.node_id: 0 for n in nodes}
        cpus = {n.node_id: 0.0 for n in nodes}
        for alloc in d.allocations.values():
            for nid, g in alloc.gpus_by_node:
                gpus[nid] += g
                cpus[nid] += g * 1.0
        for n in nodes:
            rg, rc = r.on(n.node_id)
            assert gpus[n.node_id] + rg <= n.gpus + 1e-9
            assert cpus[n.node_id] + rc <= n.cpus + 1e-9


def test_guaranteed_jobs_capacity_is_kept() -> None:
    everything = {"a": (2.0, 2.0), "b": (2.0, 2.0)}
    # a guaranteed job holds node a, a best-effort job node b: the profile takes b
    r = reserve(NODES, everything, 2, gpus_per_worker=1, cpus_per_worker=1, kept={"a": (2.0, 2.0)})
    assert r is not None and r.workers == ("b", "b")
    # guaranteed jobs hold everything: no reservation (the profile waits; nobody is preempted)
    assert reserve(NODES, everything, 1, gpus_per_worker=1, cpus_per_worker=1, kept=everything) is None
