"""The simulator on small seeded workloads: invariants for every policy, no cluster needed."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tidal.core.policy import Allocation, Decision, Snapshot
from tidal.sim import baselines
from tidal.sim.simulator import (
    POLICIES,
    CapacityError,
    JobRecord,
    PolicyUnderTest,
    SimConfig,
    SimResult,
    Simulator,
    idle_while_waiting_gpu_s,
)
from tidal.sim.tables import Truth, packed
from tidal.sim.views import PerfectPlanner, SimPlanner
from tidal.sim.workload import (
    SimJob,
    check_jobs,
    family,
    jittered,
    read_workload,
    synthetic,
    write_workload,
)

RUBICK = Path(__file__).resolve().parents[3] / "shared" / "traces" / "rubick"
AZURE = RUBICK.parent / "azure-llm" / "AzureLLMInferenceTrace_conv.csv"
MIX = {"bert": 1.0, "gpt2": 1.0, "t5": 1.0}
CFG = SimConfig(nodes=2, gpus_per_node=8)


@pytest.fixture(scope="module")
def world() -> tuple[Truth, SimPlanner, list[SimJob]]:
    truth = Truth(RUBICK)
    planner = SimPlanner(truth=truth, fit_restarts=3)
    jobs = synthetic(truth, jobs=40, jobs_per_hour=60, seed=3, mix=MIX, median_s=120, sigma=1.5,
                     sla_fraction=0.25)
    return truth, planner, jobs


def _check(result: SimResult, jobs: list[SimJob], capacity: int) -> None:
    assert sorted(r.name for r in result.jobs) == sorted(j.name for j in jobs)  # every job finishes
    for r in result.jobs:
        assert r.start >= r.submit and r.finish > r.start
        assert r.jct >= r.isolated_s - 1e-6, f"{r.name}: JCT {r.jct:.0f} s < isolated {r.isolated_s:.0f} s"
    held: dict[str, int] = {}
    for t, jid, g in sorted(result.timeline, key=lambda x: (x[0], x[2])):  # releases first at a tie
        held[jid] = g
        assert sum(held.values()) <= capacity, f"{sum(held.values())} GPUs held at t={t}"
    assert 0 < result.metrics["gpu_util"] <= 1.0


@pytest.mark.parametrize("name", list(POLICIES))
def test_invariants_for_every_policy(world: tuple[Truth, SimPlanner, list[SimJob]], name: str) -> None:
    truth, planner, jobs = world
    r = Simulator(jobs, truth, planner, POLICIES[name], CFG).run()
    _check(r, jobs, 16)
    if name in ("fifo_static", "tuned_once"):
        assert r.metrics["restarts_per_job"] == 0  # no preemption, no resizing


def test_event_driven_decisions(world: tuple[Truth, SimPlanner, list[SimJob]]) -> None:
    truth, planner, jobs = world
    cfg = SimConfig(nodes=2, gpus_per_node=8, round_s=None)
    r = Simulator(jobs, truth, planner, POLICIES["tidal"], cfg).run()
    _check(r, jobs, 16)
    assert all(r.start == r.submit for r in r.jobs[:1])  # the first job starts on arrival


def test_tidal_beats_the_black_box_baseline(world: tuple[Truth, SimPlanner, list[SimJob]]) -> None:
    truth, planner, jobs = world
    tidal = Simulator(jobs, truth, planner, POLICIES["tidal"], CFG).run().metrics
    fifo = Simulator(jobs, truth, planner, POLICIES["fifo_static"], CFG).run().metrics
    assert tidal["avg_jct_s"] < fifo["avg_jct_s"] and tidal["makespan_s"] <= fifo["makespan_s"]


def test_the_policy_sees_how_long_each_job_has_run_on_its_allocation(
        world: tuple[Truth, SimPlanner, list[SimJob]]) -> None:
    """`JobView.running_s` (phase 5's settle rule) is the time since the job's last launch, as
    the simulator's own action log has it, and 0 for a job that does not run."""
    truth, planner, jobs = world
    seen: list[Snapshot] = []

    def watch(snap: Snapshot) -> Decision:
        seen.append(snap)
        return POLICIES["tidal"].decide(snap)

    r = Simulator(jobs, truth, planner, replace(POLICIES["tidal"], decide=watch), CFG).run()
    launches: dict[str, list[float]] = {}
    for t, kind, jid, _, _ in r.actions:
        if kind == "launch":
            launches.setdefault(jid, []).append(t)
    settled = 0
    for snap in seen:
        for j in snap.jobs:
            if j.current is None:
                assert j.running_s == 0.0
                continue
            # a round that launches at `now` decides again at `now`: before or after that launch
            since = {snap.now - max((t for t in launches[j.job_id] if t <= snap.now), default=-1.0),
                     snap.now - max((t for t in launches[j.job_id] if t < snap.now), default=-1.0)}
            assert any(j.running_s == pytest.approx(x) for x in since)
            settled += j.running_s > 0
    assert settled > 0


def test_an_over_allocating_policy_is_caught(world: tuple[Truth, SimPlanner, list[SimJob]]) -> None:
    truth, planner, jobs = world

    def greedy(snap: Snapshot) -> Decision:  # every job on every GPU of node 0: impossible
        node = snap.nodes[0]
        allocs = {j.job_id: Allocation(gpus_by_node=((node.node_id, j.options[0].gpus),),
                                       plan=j.options[0].plan) for j in snap.jobs}
        return Decision(allocations=allocs, reasons={}, recall_loss={}, changed=())

    bad = PolicyUnderTest(name="bad", kind="static", decide=greedy)
    with pytest.raises(CapacityError):
        Simulator(jobs, truth, planner, bad, CFG).run()


def test_bad_workloads_are_rejected(world: tuple[Truth, SimPlanner, list[SimJob]], tmp_path: Path) -> None:
    truth, planner, jobs = world
    big = SimJob(name="big-0", submit=0, app="bert", num_gpus=64, num_cpus=512, exec_plan="ga", steps=10)
    with pytest.raises(ValueError, match="big-0 requests 64 GPUs"):
        Simulator([big], truth, planner, POLICIES["tidal"], CFG)
    odd = SimJob(name="x-0", submit=0, app="resnet", num_gpus=1, num_cpus=8, exec_plan="ga", steps=10)
    with pytest.raises(ValueError, match="unknown application 'resnet'"):
        Simulator([odd], truth, planner, POLICIES["tidal"], CFG)
    path = tmp_path / "w.csv"
    write_workload(jobs, path)
    again = read_workload(path)
    assert [(j.name, j.app, j.num_gpus, j.exec_plan, j.steps, j.is_sla) for j in again] == [
        (j.name, j.app, j.num_gpus, j.exec_plan, j.steps, j.is_sla) for j in jobs]


HEADER = "name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla\n"


@pytest.mark.parametrize(("row", "error"), [
    ("x-0,abc,10,vit,2,16,0,zero-dp,100,0",
     r"line 2: submission_time must be a number of seconds >= 0, got 'abc'"),
    ("x-0,-5,10,vit,2,16,0,zero-dp,100,0", r"line 2: submission_time must be .* got '-5'"),
    ("x-0,0,10,vit,0,16,0,zero-dp,100,0", r"line 2: num_gpus must be an integer >= 1, got '0'"),
    ("x-0,0,10,vit,2.5,16,0,zero-dp,100,0", r"line 2: num_gpus must be an integer >= 1, got '2.5'"),
    ("x-0,0,10,vit,2,16,0,zero-dp,nan,0", r"line 2: steps must be an integer >= 1, got 'nan'"),
    ("x-0,0,10,vit,2,16,0,zero-dp,100,yes", r"line 2: is_sla must be 1 \(guaranteed\) or 0, got 'yes'"),
    (",0,10,vit,2,16,0,zero-dp,100,0", r"line 2: a job needs a name"),
    ("x-0,0,10,vit,2,16,0,zero-dp,100,0\nx-0,5,10,vit,2,16,0,zero-dp,100,0",
     r"line 3: job name 'x-0' repeats line 2"),
])
def test_a_malformed_workload_fails_on_its_line(tmp_path: Path, row: str, error: str) -> None:
    path = tmp_path / "w.csv"
    path.write_text(HEADER + row + "\n")
    with pytest.raises(ValueError, match=error):
        read_workload(path)
    (tmp_path / "cols.csv").write_text("name,submission_time\nx,1\n")
    says = (r"missing columns \['application', 'num_gpus', 'num_cpus', 'exec_plan', 'steps'\] "
            r"\(a workload has .*; optional: duration, bandwidth, is_sla\)$")
    with pytest.raises(ValueError, match=says):
        read_workload(tmp_path / "cols.csv")


def test_a_workload_may_leave_out_what_no_code_needs(tmp_path: Path) -> None:
    """`duration` (informational), `bandwidth` (unused) and `is_sla` (best-effort) are optional:
    a trace of the artifact's older columns reads as the same jobs."""
    full = tmp_path / "full.csv"
    full.write_text(HEADER + "x-0,5,10,vit,2,16,0,zero-dp,100,0\ny-1,7,,bert,1,8,0,ga,3,1\n")
    short = tmp_path / "short.csv"
    short.write_text("name,submission_time,application,num_gpus,num_cpus,exec_plan,steps\n"
                     "x-0,5,vit,2,16,zero-dp,100\ny-1,7,bert,1,8,ga,3\n")
    a, b = read_workload(full), read_workload(short)
    assert [replace(j, duration=0.0, is_sla=False) for j in a] == b
    assert [j.is_sla for j in a] == [False, True] and not any(j.is_sla for j in b)


def test_what_a_cluster_cannot_run_is_named_before_a_model_is_fitted(
        world: tuple[Truth, SimPlanner, list[SimJob]]) -> None:
    truth = world[0]
    job = SimJob(name="x-0", submit=0, app="gpt2", num_gpus=5, num_cpus=40, exec_plan="151", steps=10)
    check_jobs([job], truth.apps(), 64)  # gpt2's 1·5·1 plan on 5 GPUs, as the artifact's traces have it
    for bad, error in [(replace(job, exec_plan="nosuchplan"), "x-0: plan 'nosuchplan' on 5 GPUs"),
                       (replace(job, exec_plan="122"), "plan '122' on 5 GPUs: .* product is the GPU count"),
                       (replace(job, app="resnet"), "unknown application 'resnet'"),
                       (replace(job, num_gpus=65, exec_plan="ga"), "requests 65 GPUs, the cluster has 64")]:
        with pytest.raises(ValueError, match=error):
            check_jobs([bad], truth.apps(), 64)
    with pytest.raises(ValueError, match="unique: 'x-0' repeats"):
        check_jobs([job, job], truth.apps(), 64)


@pytest.mark.parametrize("script", ["sim_compare", "sim_sweep", "loan_compare"])
def test_the_simulator_benchmarks_refuse_a_bad_workload_in_one_line(tmp_path: Path, script: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "x-0,0,10,nosuchapp,2,16,0,zero-dp,100,0\n")
    args = {"sim_compare": ["--workload", str(bad)], "sim_sweep": ["--workloads", str(bad)],
            "loan_compare": ["--workload", str(bad), "--serving", str(AZURE)]}[script]
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(root / "benchmarks" / f"{script}.py"), "--traces", str(RUBICK), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=root)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"{script}.py: error: job x-0: unknown application 'nosuchapp' "
        "(the tables have bert, gpt2, t5, roberta, vit, llama7, llama30)")


@pytest.mark.parametrize("args,error", [
    (["--copies", "0"], "--copies must be >= 1, got 0"),
    (["--copies", "3", "--jitter-s", "-5"], "--jitter-s must be a positive number of seconds, got -5.0")])
def test_sim_sweep_refuses_bad_copies_in_one_line(args: list[str], error: str) -> None:
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(root / "benchmarks" / "sim_sweep.py"), "--traces", str(RUBICK), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=root)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"sim_sweep.py: error: {error}", r.stderr


def test_rubick_trace_reads(world: tuple[Truth, SimPlanner, list[SimJob]]) -> None:
    jobs = read_workload(RUBICK / "workload-base.csv")
    assert len(jobs) == 406 and {j.app for j in jobs} == set(world[0].apps())


def test_the_workload_family(world: tuple[Truth, SimPlanner, list[SimJob]]) -> None:
    """At least 12 seeded workloads: the shared trace, its variants, synthetic ones over the
    rate × guarantee-share grid; the same seed gives the same family."""
    truth = world[0]
    fam = family(truth, [str(RUBICK / "workload-base.csv")], jobs=60)
    names = [n for n, _ in fam]
    assert len(fam) >= 12 and len(set(names)) == len(names)
    by = dict(fam)
    base = by["workload-base"]
    assert [j.submit for j in by["workload-base-rate2"]] == [round(j.submit / 2) for j in base]
    for share in (25, 50):
        got = sum(j.is_sla for j in by[f"workload-base-sla{share}"]) / len(base)
        assert abs(got - share / 100) < 0.07
    assert not any(j.is_sla for n, jobs in fam if "sla0" in n for j in jobs)
    assert [(n, [(j.name, j.submit, j.steps, j.exec_plan) for j in jobs]) for n, jobs in fam] == [
        (n, [(j.name, j.submit, j.steps, j.exec_plan) for j in jobs])
        for n, jobs in family(truth, [str(RUBICK / "workload-base.csv")], jobs=60)]


def test_a_jittered_copy_moves_each_arrival_by_at_most_the_jitter() -> None:
    """The same jobs (names, sizes, work, guarantees), each submitted within ±jitter of its
    time and never before 0; seeded; a bad jitter is refused in one line."""
    base = read_workload(RUBICK / "workload-base.csv")
    copy = jittered(base, 30.0, seed=1)
    assert [replace(j, submit=0.0) for j in copy] == [replace(j, submit=0.0) for j in base]
    moves = [c.submit - j.submit for c, j in zip(copy, base, strict=True)]
    assert all(-30.0 <= m <= 30.0 for m in moves) and min(j.submit for j in copy) >= 0.0
    assert sum(m != 0 for m in moves) > len(base) // 2 and max(moves) > 20 and min(moves) < -20
    assert copy == jittered(base, 30.0, seed=1) and copy != jittered(base, 30.0, seed=2)
    assert jittered(base, 0.0, seed=1) == base
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="jitter must be a finite number of seconds >= 0"):
            jittered(base, bad, seed=1)


def test_a_guaranteed_job_stopped_after_its_start_is_in_violation(
        world: tuple[Truth, SimPlanner, list[SimJob]]) -> None:
    """The one definition (tidal.sim.simulator): from first start to completion, time stopped
    counts; time waiting before the first start does not."""
    truth, planner, _ = world
    job = SimJob(name="g-0", submit=0, app="bert", num_gpus=1, num_cpus=8, exec_plan="ga", steps=3000,
                 is_sla=True)
    other = SimJob(name="b-1", submit=0, app="bert", num_gpus=1, num_cpus=8, exec_plan="ga", steps=30000)

    def stop_once(snap: Snapshot) -> Decision:  # g-0 waits until 120 s, runs, is stopped 240-360 s
        d = baselines.fifo(snap)
        if snap.now < 120 or 240 <= snap.now < 360:
            running = any(j.job_id == "g-0" and j.current is not None for j in snap.jobs)
            allocs = {k: v for k, v in d.allocations.items() if k != "g-0"}
            return Decision(allocations=allocs, reasons={"g-0": "test"}, recall_loss={},
                            changed=("g-0",) if running else ())
        return d

    r = Simulator([job, other], truth, planner, PolicyUnderTest(name="s", kind="static", decide=stop_once),
                  SimConfig(nodes=1, gpus_per_node=8)).run()
    g = next(j for j in r.jobs if j.name == "g-0")
    assert g.start == 120.0
    assert g.violation_s == pytest.approx(120.0)  # the two stopped rounds, not the wait
    assert dict(g.violation_by) == pytest.approx({"stopped": 120.0})  # its cause
    assert r.metrics["guarantee_violation_stopped_s"] == pytest.approx(120.0)
    assert r.metrics["guarantee_violation_spread_s"] == r.metrics["guarantee_violation_model_s"] == 0.0


def test_idle_while_waiting_counts_only_idle_gpus_while_a_job_waits() -> None:
    """4 GPUs. a holds 2 from 0 to 10 s; b arrives at 0 and waits for all 4 until a ends, then
    holds them to 20 s; c arrives at 25 s (nothing waits between 20 and 25 s) and holds 1 GPU
    to 30 s: 2 GPUs idle for 10 s while b waits, nothing else."""
    def rec(name: str, submit: float, start: float, finish: float) -> JobRecord:
        return JobRecord(name=name, app="bert", submit=submit, start=start, finish=finish, restarts=0,
                         steps=1, isolated_s=0.0)

    jobs = [rec("a", 0, 0, 10), rec("b", 0, 10, 20), rec("c", 25, 25, 30)]
    timeline = [(0.0, "a", 2), (10.0, "a", 0), (10.0, "b", 4), (20.0, "b", 0), (25.0, "c", 1), (30.0, "c", 0)]
    result = SimResult(policy="x", jobs=jobs, timeline=timeline, actions=[], round_ms=[], metrics={})
    assert idle_while_waiting_gpu_s(result, 4) == pytest.approx(20.0)
    # a stopped job (0 GPUs before its end) waits too: b stopped from 12 to 15 s with c absent
    stopped = [*timeline[:3], (12.0, "b", 0), (15.0, "b", 4), *timeline[3:]]
    result = SimResult(policy="x", jobs=jobs, timeline=stopped, actions=[], round_ms=[], metrics={})
    assert idle_while_waiting_gpu_s(result, 4) == pytest.approx(20.0 + 4 * 3.0)


def test_the_perfect_planner_predicts_the_truth(world: tuple[Truth, SimPlanner, list[SimJob]]) -> None:
    """sim_sweep's "truth as the model" row: every option and the guarantee are the truth
    table's packed throughputs, where the fitted planner's are not."""
    truth, fitted, jobs = world
    perfect = PerfectPlanner(truth=truth)
    off = 0.0
    for job in jobs[:20]:
        b = truth.global_batch(job.app)
        for opt, fit_opt in zip(perfect.options(job, "co"), fitted.options(job, "co"), strict=True):
            true = b / truth.plan_time(job.app, opt.plan, packed(opt.gpus, perfect.gpus_per_node))
            assert opt.samples_per_s == pytest.approx(true)
            off = max(off, abs(fit_opt.samples_per_s / true - 1))
        assert perfect.requested_throughput(job) == pytest.approx(
            b / truth.iter_time(job.app, job.exec_plan, packed(job.num_gpus, perfect.gpus_per_node)))
    assert off > 0.05  # the fitted model errs on some option: the row measures something
    with pytest.raises(TypeError, match="fits no model"):
        perfect.model(jobs[0].app)
