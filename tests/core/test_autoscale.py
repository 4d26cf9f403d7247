"""The node request (tidal.core.autoscale): what runs plus what waits, nothing when nothing waits
and every run has registered itself."""

from __future__ import annotations

from tidal.core.autoscale import node_request
from tidal.core.policy import JobView, Node, Option, Snapshot, decide
from tidal.jobs import Plan


def _job(jid: str, arrival: float, counts: list[int], cpus: float = 4.0, **kw: object) -> JobView:
    opts = tuple(Option(gpus=n, plan=Plan(dp=n, micro_batch=16 // n), samples_per_s=100.0 * n**0.9,
                        cpus_per_gpu=cpus) for n in counts)
    return JobView(job_id=jid, arrival=arrival, options=opts, **kw)  # type: ignore[arg-type]


def test_nothing_waits_nothing_is_asked_for_once_every_run_registered() -> None:
    snap = Snapshot(nodes=(Node(node_id="a", gpus=8, cpus=64),), jobs=(_job("A", 0, [1, 2, 4]),))
    d = decide(snap)
    assert node_request(snap, d, registered=frozenset({"A"})) == ()
    # A just launched, its run not registered yet: its GPUs stay asked for (module docstring)
    assert len(node_request(snap, d)) == d.allocations["A"].gpus > 0


def test_waiting_jobs_ask_for_their_smallest_option_on_top_of_what_runs() -> None:
    # 4 GPUs: guaranteed C (floor 4) runs on all of them; A (min 4) and B (min 2) wait
    jobs = (_job("A", 0, [4]), _job("B", 1, [2, 4], cpus=2.0),
            _job("C", 2, [2, 4], guarantee=300.0))
    snap = Snapshot(nodes=(Node(node_id="a", gpus=4, cpus=64),), jobs=jobs)
    d = decide(snap)
    assert set(d.allocations) == {"C"}
    req = node_request(snap, d)
    assert len(req) == 4 + 2 + 4
    assert req.count({"GPU": 1.0, "CPU": 2.0}) == 2  # B's CPUs per GPU
    assert all(b["GPU"] == 1.0 for b in req)


def test_lent_gpus_are_not_asked_for() -> None:
    nodes = (Node(node_id="own", gpus=2, cpus=64), Node(node_id="lent", gpus=2, cpus=64, recallable=True))
    jobs = (_job("A", 0, [4]), _job("B", 1, [4]))
    snap = Snapshot(nodes=nodes, jobs=jobs)
    d = decide(snap)
    held = sum(a.gpus for a in d.allocations.values())
    lent_held = sum(g for a in d.allocations.values() for n, g in a.gpus_by_node if n == "lent")
    assert len(node_request(snap, d)) == held - lent_held + 4 * (2 - len(d.allocations))


def test_jobs_whose_runs_ask_for_themselves_are_not_asked_for_twice() -> None:
    jobs = (_job("A", 0, [4]), _job("B", 1, [2, 4], cpus=2.0), _job("C", 2, [2, 4], guarantee=300.0))
    snap = Snapshot(nodes=(Node(node_id="a", gpus=4, cpus=64),), jobs=jobs)
    d = decide(snap)
    whole = node_request(snap, d)
    assert len(node_request(snap, d, registered=frozenset({"C"}))) == len(whole) - 4
    # a registered job that waits (its run stopped) still asks for its floor
    assert node_request(snap, d, registered=frozenset({"A", "B"})) == whole
