"""The one loan step (`tidal.serving.loanstep`), no cluster: what it never lends, what it reclaims,
its state across a restart, and the conformance of its two executors (the live scheduler's
`tidal.platform.lending.Lending` and the simulator's `tidal.sim.serving.ServingSim`) on one
recorded scenario."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from tidal.autoscaler.reclaim import Borrower
from tidal.core.policy import Allocation, Option
from tidal.core.state import JobState
from tidal.jobs import Plan
from tidal.platform.lending import LOAN_STATE, Lending
from tidal.platform.metrics import Metrics
from tidal.platform.store import JobRecord, Store
from tidal.serving.loans import LoanConfig, planned_lead, replicas_for
from tidal.serving.loanstep import LoanState, PoolNow, loan_step
from tidal.sim.records import ActiveJob, SimResult
from tidal.sim.serving import InferencePool, ServingSim
from tidal.sim.workload import SimJob

CFG = LoanConfig(replica_rps=1.0, interval_s=60.0, lead_s=30.0, min_replicas=0)


def _random_pool(rng: random.Random) -> tuple[dict[str, int], dict[str, int], tuple[Borrower, ...]]:
    """Inference nodes, what training holds there, and the borrowers holding it (every held GPU
    belongs to a borrower)."""
    pool = {f"inf-{i}": rng.choice([2, 4, 8]) for i in range(rng.randint(1, 3))}
    held = {nid: 0 for nid in pool}
    borrowers = []
    for k in range(rng.randint(0, 4)):
        lent = []
        for nid in pool:
            g = rng.randint(0, pool[nid] - held[nid])
            if g:
                lent.append((nid, g))
                held[nid] += g
        if lent:
            total = sum(g for _, g in lent) + rng.randint(0, 4)
            options = tuple(sorted({1, total // 2 or 1, total}))
            borrowers.append(Borrower(job_id=f"j{k}", gpus=total, lent_by_node=tuple(lent), options=options,
                                      lost_s=rng.uniform(0, 5), restart_s=rng.uniform(5, 60)))
    return pool, held, tuple(borrowers)


@pytest.mark.parametrize("seed", range(40))
def test_the_step_never_lends_what_serve_needs_now(seed: int) -> None:
    """After the step's reclaims, training holds at most the lendable GPUs, and no more is lent
    than the pool less the replicas the current demand needs (the forecast only lends less)."""
    rng = random.Random(seed)
    pool, held, borrowers = _random_pool(rng)
    total = sum(pool.values())
    state = LoanState(demand=tuple(rng.uniform(0, total) for _ in range(rng.randint(0, 10))))
    demand = rng.uniform(0, 1.2 * total)
    step, new = loan_step(state, PoolNow(pool=pool, demand=demand, held=held, borrowers=borrowers), CFG)
    assert step.decision is not None
    assert sum(step.lent.values()) <= max(0, total - replicas_for(demand, CFG))
    assert step.held_after <= step.lendable
    assert all(step.lent[n] <= pool[n] for n in pool)
    assert new.demand[-1] == demand and len(new.demand) <= CFG.history and new.lent == step.lent
    freed = sum(r.freed for r in step.reclaims)
    assert step.held_after == sum(held.values()) - freed


def test_gpus_on_their_way_back_are_not_reclaimed_twice() -> None:
    """A job already asked to stop gives its lent GPUs back: the step reclaims only the rest of
    the shortfall (here none)."""
    pool = {"inf-0": 8}
    borrower = Borrower(job_id="a", gpus=4, lent_by_node=(("inf-0", 4),), options=(2, 4))
    now = PoolNow(pool=pool, demand=6.0, held={"inf-0": 8}, borrowers=(borrower,), returning=4)
    step, _ = loan_step(LoanState(demand=(6.0,) * 20), now, CFG)
    # 8 held − 4 on their way back − 2 lendable: 2 more to take, not 6
    assert step.lendable == 2 and [(r.job_id, r.keep_gpus, r.freed) for r in step.reclaims] == [("a", 2, 2)]
    now = replace(now, returning=6)
    step, _ = loan_step(LoanState(demand=(6.0,) * 20), now, CFG)
    assert step.reclaims == ()


def test_nothing_is_lent_before_any_demand_is_seen() -> None:
    step, state = loan_step(LoanState(), PoolNow(pool={"inf-0": 4}, demand=None, held={}), CFG)
    assert step.decision is None and sum(step.lent.values()) == 0 and state.risk == 1.0


def test_the_state_survives_a_restart_in_the_store(tmp_path: Path) -> None:
    """The live executor stores the step's state each tick; a new one (a restarted scheduler) on
    the same state file starts from it, not from nothing."""
    store = Store(tmp_path / "tidal.sqlite")
    lending = Lending(CFG, Metrics(), store)
    nodes = [_ray_node("inf-0", 4)]
    for d in (1.0, 3.0, 2.0):
        lending.step([], nodes, lambda d=d: d, lambda _: True, 30.0, lambda _: 1.0)
    again = Lending(CFG, Metrics(), Store(tmp_path / "tidal.sqlite"))
    assert again.loan == lending.loan and again.loan.demand == (1.0, 3.0, 2.0)
    assert store.measured(LOAN_STATE)["demand"] == [1.0, 3.0, 2.0]


@pytest.mark.parametrize("damage", [
    {"demand": ["a lot"]}, {"demand": [1.0, float("nan")]}, {"demand": 3}, {"leads": [-1.0]},
    {"lent": {"inf-0": "two"}}, {"risk": 7}, "not a mapping",
])
def test_a_damaged_stored_state_costs_the_history_not_the_scheduler(
        tmp_path: Path, damage: object, caplog: pytest.LogCaptureFixture) -> None:
    """A loan state that is not what `to_dict` wrote (a hand edit, another version) is refused
    with a warning naming the field and the store's key: the step starts without history, and
    the next tick's state replaces the record."""
    store = Store(tmp_path / "tidal.sqlite")
    store.set_measured(LOAN_STATE, {"demand": [1.0], **damage} if isinstance(damage, dict) else damage)
    with caplog.at_level("WARNING", logger="tidal.scheduler"):
        lending = Lending(CFG, Metrics(), store)
    assert lending.loan == LoanState()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    field = next(iter(damage)) if isinstance(damage, dict) else "expected a mapping"
    assert field in warning and LOAN_STATE in warning, warning
    lending.step([], [_ray_node("inf-0", 4)], lambda: 2.0, lambda _: True, 30.0, lambda _: 1.0)
    assert store.measured(LOAN_STATE)["demand"] == [2.0]


def test_serve_is_told_the_replicas_kept_once_the_demand_is_bounded(tmp_path: Path) -> None:
    """Each tick the executor passes on the replicas the step keeps for Serve (its floors,
    `tidal.serving.autoscaling`): None while the history cannot bound the demand (nothing is
    lent, so no floor is needed) or without a pool, then the decision's replicas, never below
    what Serve needs now; a failing receiver costs the floors, not the tick."""
    told: list[int | None] = []
    lending = Lending(CFG, Metrics(), Store(tmp_path / "tidal.sqlite"), keep=told.append)
    nodes = [_ray_node("inf-0", 4)]
    rng = random.Random(3)
    for _ in range(30):
        d = rng.choice([0.5, 1.0, 1.4])
        lending.step([], nodes, lambda d=d: d, lambda _: True, 30.0, lambda _: 1.0)
        kept = told[-1]
        assert kept is None or replicas_for(d, CFG) <= kept <= 4
    assert told[0] is None and told[-1] is not None
    lending.step([], [], lambda: 1.0, lambda _: True, 30.0, lambda _: 1.0)
    assert told[-1] is None

    def broken(_: int | None) -> None:
        raise ConnectionError("GCS unavailable")

    lending.keep = broken
    assert lending.step([], nodes, lambda: 1.0, lambda _: True, 30.0, lambda _: 1.0) == []


def test_the_planned_lead_is_the_configured_one_until_recalls_are_measured() -> None:
    cfg = replace(CFG, lead_s=30.0, risk=0.1)
    assert planned_lead((), cfg) == 30.0
    assert planned_lead((12.0, 45.0), cfg) == 45.0  # too few to bound: the longest, or lead_s
    assert planned_lead((12.0, 14.0), cfg) == 30.0
    leads = tuple(float(x) for x in range(10, 30))  # 20 measured: the 19th smallest bounds the next
    assert planned_lead(leads, cfg) == 28.0
    assert planned_lead((1e6,), cfg) == (cfg.history // 2 - 1) * cfg.interval_s  # what the history can score


def test_recalls_are_timed_until_serve_runs_its_replicas(tmp_path: Path) -> None:
    """A reclaim decided at t = 1,000 s is answered when Serve runs the replicas it wanted then:
    its lead time is an event, a sample the next steps plan with, and stored."""
    store, events = Store(tmp_path / "tidal.sqlite"), []
    lending = Lending(replace(CFG, interval_s=10.0, lead_s=10.0), Metrics(), store, events.append)
    lending.loan = LoanState(demand=(1.0,) * 30)
    nodes = [_ray_node("inf-000", 4)]
    rec = JobRecord(job_id="a", name="a", spec=b"", state=JobState.RUNNING, options=_options(1, 2),
                    allocation=[["inf-000", 2]])
    running = {"n": 1}
    tick = lambda t, d: lending.step([rec], nodes, lambda: d, lambda _: True, 30.0, lambda _: 1.0,  # noqa: E731
                                     now=t, serve_running=lambda: running["n"])
    assert tick(990.0, 1.0) == []  # lent: 3 GPUs, the job holds 2
    stops = tick(1000.0, 4.0)  # Serve wants all 4
    assert [r.job_id for r, _ in stops] == ["a"]
    rec = replace(rec, state=JobState.QUEUED, allocation=None)
    tick(1010.0, 4.0)
    assert lending.loan.leads == () and not events  # 1 replica runs: not answered yet
    running["n"] = 4
    tick(1037.0, 4.0)
    assert lending.loan.leads == (37.0,) and "37.0 s after the reclaim" in events[-1]
    assert lending.state["lead_s"] == 37.0  # longer than the configured 10 s
    assert Lending(CFG, Metrics(), Store(tmp_path / "tidal.sqlite")).loan.leads == (37.0,)


# -- conformance: the live executor and the simulator's on one scenario ----------------------------


def _ray_node(nid: str, gpus: int) -> dict:
    return {"NodeID": nid, "Alive": True, "Resources": {"GPU": float(gpus), "CPU": 8.0},
            "Labels": {"tidal.io/pool": "inference"}}


def _options(*counts: int) -> tuple[Option, ...]:
    return tuple(Option(gpus=g, plan=Plan(dp=g, micro_batch=8 // g), samples_per_s=float(g)) for g in counts)


def _scenario() -> tuple[list[float], dict[str, tuple[tuple[Option, ...], tuple[tuple[str, int], ...]]]]:
    """Serve's demand per interval (replicas): a steady start long enough for the forecast to
    state its risk, then surges; and two borrowers: their options and allocations."""
    demand = [1.0] * 12 + [1.0, 1.0, 2.0, 1.0, 1.0, 5.0, 7.0, 3.0, 2.0, 1.0, 1.0, 6.0]
    jobs = {"a": (_options(1, 2), (("inf-000", 2),)),
            "b": (_options(2, 4), (("inf-001", 2), ("own-0", 2)))}
    return demand, jobs


def test_the_live_and_simulated_loan_steps_conform(tmp_path: Path) -> None:
    """The same demand and borrowers through both executors, interval by interval (each side's
    reclaims applied before the next: at once in the simulator, as a completed stop and relaunch
    on the kept GPUs in the live one): the same loans, the same reclaims, the same state."""
    demand, jobs = _scenario()
    pool = InferencePool(rates=tuple(demand), loan=CFG, mode="shrink", nodes=2, gpus_per_node=4)
    sim = ServingSim(pool, restart_s=30.0, iter_time=lambda job, plan, per_node: 1.0)
    active = {jid: ActiveJob(spec=SimJob(name=jid, submit=0.0, app="x", num_gpus=2, num_cpus=8, exec_plan="",
                                         steps=10_000),
                             options=opts, guarantee=None, requested=None, true_floor=None,
                             phase=JobState.RUNNING, alloc=Allocation(gpus_by_node=alloc, plan=opts[-1].plan),
                             rate=1.0)
              for jid, (opts, alloc) in jobs.items()}
    result = SimResult(policy="tidal", jobs=[], timeline=[], actions=[], round_ms=[], metrics={})
    live = Lending(CFG, Metrics(), Store(tmp_path / "tidal.sqlite"))
    nodes = [_ray_node("inf-000", 4), _ray_node("inf-001", 4)]
    warm = 12  # the steady start, as both executors would have seen it before the borrowers came
    live.loan = LoanState(demand=tuple(demand[:warm]))
    reclaims_seen, lent_seen = 0, 0
    for k in range(warm + 1, len(demand) + 1):
        t = k * CFG.interval_s
        recs = [JobRecord(job_id=jid, name=jid, spec=b"", state=JobState.RUNNING, options=j.options,
                          allocation=[[n, g] for n, g in j.alloc.gpus_by_node] if j.alloc else None)
                for jid, j in active.items() if j.alloc is not None]
        stops = live.step(recs, nodes, lambda k=k: demand[k - 1], lambda _: True, 30.0, lambda _: 1.0)
        before = len(result.actions)
        sim.before_round(t, active, result)
        sim_stops = sorted({a[2] for a in result.actions[before:] if a[1] == "stop"})
        assert sorted(r.job_id for r, _ in stops) == sim_stops, k
        assert live.loan == sim.state, k
        assert live.state["lent"] == sim.lent, k
        reclaims_seen += len(sim_stops)
        lent_seen = max(lent_seen, sum(sim.lent.values()))
    assert reclaims_seen > 0 and lent_seen > 0  # the scenario lends, and its surges reclaim
