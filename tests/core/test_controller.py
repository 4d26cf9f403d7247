"""The reconcile step both executors run (`tidal.core.controller`), no cluster: each of its four
branches, with the real policy and with a policy that returns a fixed decision."""

from __future__ import annotations

from collections.abc import Callable

from tidal.core.controller import reconcile_step
from tidal.core.policy import Allocation, Decision, JobView, Node, Option, Snapshot, decide
from tidal.core.state import JobState
from tidal.jobs import Plan


def _options(max_gpus: int, per_gpu: float = 100.0) -> tuple[Option, ...]:
    return tuple(Option(gpus=n, plan=Plan(dp=n, micro_batch=16 // n), samples_per_s=per_gpu * n)
                 for n in (1, 2, 4, 8) if n <= max_gpus)


def _alloc(node: str, gpus: int) -> Allocation:
    return Allocation(gpus_by_node=((node, gpus),), plan=Plan(dp=gpus, micro_batch=16 // gpus))


def _fixed(allocations: dict[str, Allocation],
           changed: tuple[str, ...] = ()) -> tuple[Callable[[Snapshot], Decision], list[Snapshot]]:
    """A policy that returns one decision whatever it is shown, and the snapshots it was shown."""
    calls: list[Snapshot] = []

    def policy(snapshot: Snapshot) -> Decision:
        calls.append(snapshot)
        return Decision(allocations=allocations, reasons={}, recall_loss={}, changed=changed)

    return policy, calls


def test_a_stopping_job_holds_every_decision_back() -> None:
    snap = Snapshot(nodes=(Node(node_id="n0", gpus=4),),
                    jobs=(JobView(job_id="a", arrival=0.0, options=_options(4), current=_alloc("n0", 2)),
                          JobView(job_id="b", arrival=1.0, options=_options(4))))
    policy, calls = _fixed({"b": _alloc("n0", 2)})
    out = reconcile_step(snap, {"a": JobState.STOPPING, "b": JobState.QUEUED}, policy)
    assert out.decision is None and out.stop == () and out.launch == ()
    assert calls == [], "the policy must not run while a job's GPUs are still being given back"


def test_changed_running_jobs_stop_first_and_nothing_launches_with_them() -> None:
    snap = Snapshot(nodes=(Node(node_id="n0", gpus=4),),
                    jobs=(JobView(job_id="a", arrival=0.0, options=_options(4), current=_alloc("n0", 4)),
                          JobView(job_id="b", arrival=1.0, options=_options(4))))
    # the decision shrinks a to 2 GPUs and gives b the other 2: a must stop before b may start
    policy, calls = _fixed({"a": _alloc("n0", 2), "b": _alloc("n0", 2)}, changed=("a",))
    out = reconcile_step(snap, {"a": JobState.RUNNING, "b": JobState.QUEUED}, policy)
    assert calls == [snap]
    assert out.stop == ("a",) and out.launch == ()
    assert out.decision is not None and set(out.decision.allocations) == {"a", "b"}


def test_only_running_jobs_are_stopped() -> None:
    # a job the decision lists as changed but that is QUEUED has nothing to stop: it launches
    snap = Snapshot(nodes=(Node(node_id="n0", gpus=4),),
                    jobs=(JobView(job_id="a", arrival=0.0, options=_options(4)),))
    policy, _ = _fixed({"a": _alloc("n0", 4)}, changed=("a",))
    out = reconcile_step(snap, {"a": JobState.QUEUED}, policy)
    assert out.stop == ()
    assert [j for j, _ in out.launch] == ["a"]


def test_queued_jobs_launch_in_arrival_order_on_exactly_the_decided_gpus() -> None:
    snap = Snapshot(nodes=(Node(node_id="n0", gpus=4), Node(node_id="n1", gpus=4)),
                    jobs=(JobView(job_id="late", arrival=5.0, options=_options(4)),
                          JobView(job_id="early", arrival=1.0, options=_options(4)),
                          JobView(job_id="waits", arrival=0.0, options=_options(4)),
                          JobView(job_id="runs", arrival=0.5, options=_options(4), current=_alloc("n1", 2))))
    decided = {"late": _alloc("n0", 2), "early": _alloc("n1", 2), "runs": _alloc("n1", 2)}
    policy, _ = _fixed(decided)
    phases = {"late": JobState.QUEUED, "early": JobState.QUEUED, "waits": JobState.QUEUED,
              "runs": JobState.RUNNING}
    out = reconcile_step(snap, phases, policy)
    assert out.stop == ()
    # "waits" has no allocation, "runs" is already running: neither is launched
    assert [j for j, _ in out.launch] == ["early", "late"]
    assert dict(out.launch) == {"early": decided["early"], "late": decided["late"]}


def test_with_the_real_policy_a_full_cluster_launches_what_fits_and_no_more() -> None:
    jobs = tuple(JobView(job_id=f"j{i}", arrival=float(i), options=_options(2)) for i in range(3))
    snap = Snapshot(nodes=(Node(node_id="n0", gpus=4),), jobs=jobs)
    out = reconcile_step(snap, dict.fromkeys(("j0", "j1", "j2"), JobState.QUEUED))
    assert out.decision is not None and out.stop == ()
    launched = dict(out.launch)
    assert launched == dict(out.decision.allocations)
    assert 1 <= len(launched) <= 3
    assert sum(a.gpus for a in launched.values()) <= 4, "capacity exceeded"
    # the default policy is `decide`: the same decision as calling it directly
    assert dict(decide(snap).allocations) == launched
