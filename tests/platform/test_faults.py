"""Faults on a real Ray cluster lose nothing: a Train worker killed -9 three times in one job, one
that hangs (SIGSTOP), and the scheduler actor killed while a job profiles and while one stops.
Every job ends SUCCEEDED with the loss curve of an uninterrupted run, loses at most a checkpoint
interval per fault, and leaves no placement group behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray
from ray import cloudpickle

from tests.conftest import tiny_gpt_spec
from tests.platform.conftest import _start, wait
from tidal.core.policy import Option
from tidal.jobs import Plan
from tidal.jobs.runner import Resources, launch
from tidal.platform import sdk
from tidal.platform.config import NAMESPACE, SCHEDULER_NAME
from tidal.platform.runhost import RUN_HOST_NAME
from tidal.platform.store import JobRecord, JobState, Store

pytestmark = pytest.mark.integration


def _train_workers() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or [""]
        if cmd and cmd[0].startswith("ray::RayTrainWorker"):
            out.append(p)
    return out


def assert_same_curve(spec: Any, curve: list[dict[str, Any]]) -> None:
    """The job's loss curve over all its runs equals one uninterrupted run's (≤ 1e-3 relative)."""
    assert [m["step"] for m in curve] == list(range(1, spec.total_steps + 1))
    whole = launch(spec, Plan(dp=1, micro_batch=8), Resources(num_workers=1, gpus_per_worker=1))
    whole = whole.result(timeout=600)
    rel = [abs(x - m["loss"]) / x for x, m in zip(whole.losses, curve, strict=True)]
    assert max(rel) <= 1e-3, f"{spec.name}: max relative difference {max(rel):.2e}"


def assert_no_placement_group_left() -> None:
    def live() -> list[Any]:
        return [pg for pg in ray.util.placement_group_table().values()
                if pg["state"] in ("CREATED", "PENDING", "RESCHEDULING")]

    deadline = time.time() + 60
    while live() and time.time() < deadline:
        time.sleep(1)
    assert not live(), live()


def _resumed_from(scheduler: Any, job_id: str) -> list[int]:
    """The steps the job was requeued from after each infrastructure failure (its events); a run
    killed after its last checkpoint resumes nowhere: the job ends at that checkpoint's step."""
    notes = [e["note"] for e in ray.get(scheduler.job_events.remote(job_id))]
    return [int(m.group(1)) for n in notes if "infrastructure" in n
            for m in [re.search(r"(?:resumes from|its checkpoint at) step (\d+)", n)] if m]


def test_a_worker_killed_three_times(scheduler: Any) -> None:
    # 240 steps: three kills 25+ steps apart land well before the end (with 160, the third kill
    # once came after the last checkpoint: the job must then end SUCCEEDED, which it now does)
    spec = tiny_gpt_spec(name="killed-worker", total_steps=240, max_gpus=2, checkpoint_every=10)
    job = sdk.JobHandle(ray.get(scheduler.submit.remote(spec)), scheduler)
    killed_at = []
    for k in range(3):
        start = job.status()["step"]
        wait(lambda start=start: job.status()["state"] == "RUNNING" and job.status()["step"] >= start + 25
             and bool(_train_workers()), f"the job to train before kill {k + 1}")
        killed_at.append(job.status()["step"])
        os.kill(_train_workers()[0].pid, signal.SIGKILL)
        wait(lambda k=k: job.status()["restarts"] > k, f"the job to be requeued after kill {k + 1}", 120)
    final = job.wait(timeout=900, poll_s=2)
    assert final["state"] == "SUCCEEDED" and final["restarts"] == 3, final
    resumed = _resumed_from(scheduler, job.job_id)
    print(f"\nkilled at steps {killed_at}, resumed from {resumed}")
    assert len(resumed) == 3, resumed
    for seen, back in zip(killed_at, resumed, strict=True):
        assert seen - spec.checkpoint_every <= back, (killed_at, resumed)  # ≤ one interval lost
    assert_same_curve(spec, job.logs())
    assert_no_placement_group_left()


def test_a_hung_worker_is_aborted_and_its_job_resumes(ray_cluster: Any, tmp_path: Path) -> None:
    """A worker that stops making progress (SIGSTOP: a hung collective, device or filesystem
    looks the same from outside) left its job RUNNING at one step for good. The scheduler now
    aborts a run with no step for `stall_s` and resumes the job from its newest checkpoint."""
    # stall_s counts from the launch until the first step too: a run's start takes 17-33 s on an
    # idle 2-core machine (docs/log/demo.md's A/B), and at 15 s the relaunch after the abort was
    # itself judged hung, again and again (a clean-clone CI: runs r1-r5, 16 s each)
    started = _start(tmp_path, stall_s=45.0)
    actor = next(started)
    stopped: list[psutil.Process] = []
    try:
        spec = tiny_gpt_spec(name="hung-worker", total_steps=120, checkpoint_every=10, max_gpus=1)
        job = sdk.JobHandle(ray.get(actor.submit.remote(spec)), actor)
        wait(lambda: job.status()["state"] == "RUNNING" and job.status()["step"] >= 20
             and bool(_train_workers()), "the job to train")
        stopped.append(_train_workers()[0])
        stopped[0].suspend()
        at = job.status()["step"]
        wait(lambda: job.status()["restarts"] >= 1, "the hung run to be aborted and the job requeued", 180)
        notes = [e["note"] for e in ray.get(actor.job_events.remote(job.job_id))]
        assert any("infrastructure" in n and "RunHung: no step for" in n for n in notes), notes
        assert not stopped[0].is_running() or stopped[0].status() == psutil.STATUS_ZOMBIE  # killed
        final = job.wait(timeout=600, poll_s=2)
        assert final["state"] == "SUCCEEDED" and final["restarts"] == 1, final
        resumed = _resumed_from(actor, job.job_id)
        assert len(resumed) == 1 and at - spec.checkpoint_every <= resumed[0], (at, resumed)
        assert_same_curve(spec, job.logs())
    finally:
        for p in stopped:  # never leave a stopped process behind
            if p.is_running():
                p.resume()
        next(started, None)  # the fixture's teardown: the actor killed


def test_a_run_lost_after_its_last_checkpoint_and_a_lost_checkpoint(ray_cluster: Any, tmp_path: Path) -> None:
    """A scheduler comes up on the store of one that died while a job's last run had already
    written its final checkpoint (measured: a worker killed then left the job QUEUED for good,
    its relaunch refused at every tick), and with a queued job whose checkpoint someone deleted.
    The first ends SUCCEEDED at its last step; the second FAILS alone, naming the checkpoint;
    a job submitted beside them still runs to the end."""
    spec = tiny_gpt_spec(name="lost-at-end", total_steps=20, checkpoint_every=10)
    run_id = f"lost-at-end-{uuid.uuid4().hex[:6]}-r0"
    plan = Plan(dp=1, micro_batch=8)
    whole = launch(spec, plan, Resources(num_workers=1, gpus_per_worker=1), run_id=run_id).result(timeout=600)
    assert whole.final_step == 20
    gone = tmp_path / "deleted" / "step_00000010"
    store = Store(tmp_path / "tidal.sqlite")
    opts = (Option(gpus=1, plan=plan, samples_per_s=100.0, cpus_per_gpu=1.0),)
    node = ray_cluster.node_ids[0]
    store.add(JobRecord(job_id="lost-at-end", name=spec.name, spec=cloudpickle.dumps(spec),
                        state=JobState.RUNNING, options=opts, plan=plan.to_dict(), allocation=[[node, 1]],
                        run_id=run_id), "running when its scheduler died")
    store.add(JobRecord(job_id="ckpt-gone", name="ckpt-gone", spec=cloudpickle.dumps(spec),
                        state=JobState.QUEUED, options=opts, checkpoint=str(gone), step=10, restarts=1),
              "queued from a checkpoint since deleted")
    del store
    started = _start(tmp_path)
    actor = next(started)
    try:
        ok = sdk.JobHandle(ray.get(actor.submit.remote(tiny_gpt_spec(name="beside"), opts)), actor)
        done, bad = sdk.JobHandle("lost-at-end", actor), sdk.JobHandle("ckpt-gone", actor)
        assert ok.wait(timeout=600, poll_s=1)["state"] == "SUCCEEDED"
        final = done.status()
        assert (final["state"], final["step"], final["restarts"]) == ("SUCCEEDED", 20, 1), final
        assert [m["step"] for m in done.logs()] == list(range(1, 21))
        failed = bad.status()
        assert failed["state"] == "FAILED", failed
        assert failed["error"].startswith("CheckpointError") and str(gone) in failed["error"], failed
        notes = [e["note"] for e in ray.get(actor.job_events.remote("ckpt-gone"))]
        assert notes[-1].startswith("launch failed: CheckpointError"), notes
    finally:
        next(started, None)  # the fixture's teardown: the actor killed


def test_a_stray_state_file_stops_the_scheduler_in_one_line(ray_cluster: Any, tmp_path: Path) -> None:
    """$TIDAL_STATE's file overwritten by something else: the actor cannot start, and the SDK and
    the CLI say why in one line at once (not after the SDK's 120-s wait for an actor that
    restarts); the file is left as it was, and a scheduler on a good file starts afterwards."""
    from tidal.platform import cli
    from tidal.platform.config import SchedulerConfig

    stray = tmp_path / "stray" / "tidal.sqlite"
    stray.parent.mkdir()
    stray.write_bytes(b"not SQLite: a user's notes\n" * 200)
    actor = sdk.connect(SchedulerConfig(state_path=str(stray)))
    why = f"the Tidal scheduler could not start: RuntimeError: {stray} is not a Tidal state file"
    t0 = time.time()
    with pytest.raises(sdk.SchedulerStartError) as e:
        sdk.JobHandle("any-job", actor).status()
    assert str(e.value).startswith(why) and "\n" not in str(e.value), e.value
    assert time.time() - t0 < 60
    with pytest.raises(SystemExit) as exit_:
        cli._get(actor.ping.remote())
    assert str(exit_.value.code).startswith(f"tidal: {why}"), exit_.value.code
    assert stray.read_bytes().startswith(b"not SQLite")
    started = _start(tmp_path)  # the dead actor's name is free again
    try:
        assert ray.get(next(started).status.remote()) == []
    finally:
        next(started, None)


def test_a_state_file_locked_while_a_run_ends_loses_nothing(ray_cluster: Any, tmp_path: Path) -> None:
    """Someone holds the state file's write lock (a `sqlite3` shell left in a transaction; a full
    disk refuses writes the same way) while a run ends and a job waits for its GPUs. A submit
    then is refused in one line naming the file; the run's end is recorded once the lock goes,
    with its whole curve, and the waiting job is launched once. Before, the first refused write
    left SQLite's transaction open and every later one failed: the ended job stayed RUNNING and
    the waiting one QUEUED for good."""
    import sqlite3

    from tidal.platform.store import StoreWriteError

    started = _start(tmp_path)
    actor = next(started)
    other = sqlite3.connect(tmp_path / "tidal.sqlite", isolation_level=None)
    try:
        four = Plan(dp=4, micro_batch=2)
        opts = (Option(gpus=4, plan=four, samples_per_s=100.0, cpus_per_gpu=1.0),)
        spec_b = tiny_gpt_spec(name="locked-b", total_steps=40, max_gpus=4, checkpoint_every=10)
        b = sdk.JobHandle(ray.get(actor.submit.remote(spec_b, opts)), actor)
        spec_a = tiny_gpt_spec(name="locked-a", total_steps=60, max_gpus=4, seed=1)  # longer: B runs first
        a = sdk.JobHandle(ray.get(actor.submit.remote(spec_a, opts)), actor)
        wait(lambda: b.status()["state"] == "RUNNING" and b.status()["step"] >= 5 and bool(_train_workers()),
             "B to train")
        other.execute("BEGIN IMMEDIATE")  # the write lock, held from here
        with pytest.raises(StoreWriteError) as refused:
            sdk.answer(actor.submit.remote(tiny_gpt_spec(name="locked-c", max_gpus=4), opts))
        assert str(refused.value).startswith(f"the Tidal state file {tmp_path / 'tidal.sqlite'} could not "
                                             "be written") and "database is locked" in str(refused.value)
        wait(lambda: not _train_workers(), "B's run to end while the file is locked", 180)
        # Ray Train's controller ends a little after its workers (seconds on a loaded host): wait
        # for the scheduler to have collected the end and been refused its record
        wait(lambda: any(f"could not record the end of {b.job_id}'s run" in e
                         for e in ray.get(actor.recent_events.remote())), "B's end to be refused", 120)
        time.sleep(3)  # a tick or more that cannot write
        assert a.status()["state"] == "QUEUED" and b.status()["state"] == "RUNNING"  # reads still work
        other.execute("ROLLBACK")
        finals = [b.wait(timeout=600, poll_s=1), a.wait(timeout=600, poll_s=1)]
        assert [f["state"] for f in finals] == ["SUCCEEDED", "SUCCEEDED"], finals
        assert [f["restarts"] for f in finals] == [0, 0], finals
        assert [r["name"] for r in ray.get(actor.status.remote())] == ["locked-b", "locked-a"]  # not C
        launches = [e for e in ray.get(actor.job_events.remote(a.job_id)) if e["to"] == "RUNNING"]
        assert len(launches) == 1, launches
        said = ray.get(actor.recent_events.remote())
        assert any(f"could not record the end of {b.job_id}'s run" in e for e in said), said
        assert any(f"recorded the end of {b.job_id}'s run" in e for e in said), said
        assert_same_curve(spec_b, b.logs())
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
        next(started, None)


def test_a_launch_the_state_file_refuses_is_written_later_and_never_launched_twice(
        ray_cluster: Any, tmp_path: Path) -> None:
    """The state file refuses the write of a launch (a lock held elsewhere) after the run has
    started. The job stays QUEUED in the store beside its live run while ticks cannot write, and no
    tick launches it again (before, the next tick did, into the same run directory, orphaning the
    first run); once the file takes writes the launch is recorded and the job ends SUCCEEDED from
    one run. A `Scheduler` in the test process, so that the lock is taken before its one tick."""
    import sqlite3

    from tidal.platform.config import SchedulerConfig
    from tidal.platform.scheduler import Scheduler

    path = tmp_path / "tidal.sqlite"
    sched = Scheduler(SchedulerConfig(tick_s=3600.0, state_path=str(path), restart_cost_s=0.0,
                                      cpus_per_worker=1.0))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        spec = tiny_gpt_spec(name="refused-launch", total_steps=30)
        with sched.lock:  # its loop thread, woken by the submit, waits for this
            jid = sched.submit(spec, (Option(gpus=1, plan=Plan(dp=1, micro_batch=8), samples_per_s=100.0,
                                             cpus_per_gpu=1.0),))
            other.execute("BEGIN IMMEDIATE")
        sched.reconcile()  # launches, and the RUNNING write is refused
        assert sched.executor.has_run(jid) and sched.store.get(jid).state is JobState.QUEUED
        run = sched.executor.adopt()[jid]  # (run id, launch time, stop): the host's one run of the job
        sched.reconcile()  # still refused: decides nothing, launches nothing
        assert sched.executor.adopt().get(jid) == run and sched.store.get(jid).state is JobState.QUEUED
        other.execute("ROLLBACK")
        sched.reconcile()
        # the launch written first, then (a short run) perhaps its end, in the same tick
        assert sched.store.get(jid).state in (JobState.RUNNING, JobState.SUCCEEDED)
        assert sched.executor.adopt().get(jid) in (run, None)
        deadline = time.time() + 300
        while sched.store.get(jid).state is not JobState.SUCCEEDED:
            assert time.time() < deadline, sched.store.get(jid)
            time.sleep(1)
            sched.reconcile()
        events = sched.store.events(jid)
        assert [e.to_state for e in events] == ["QUEUED", "RUNNING", "SUCCEEDED"], events
        assert sched.store.get(jid).restarts == 0
        assert any(f"could not record {jid}'s launch" in e for e in sched.events), list(sched.events)
        assert [m["step"] for m in sched.history(jid)] == list(range(1, 31))
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()


def test_a_stop_the_state_file_refuses_is_written_before_the_runs_end(
        ray_cluster: Any, tmp_path: Path) -> None:
    """The state file refuses the record of a stop (a lock held elsewhere) after the run was asked
    to stop. While it refuses, the job stays RUNNING in the store, its ended run is not collected
    and nothing else launches; once the file takes writes the stop is written first, then the
    run's end (the job requeued from its checkpoint), then the job that asked for the GPUs is
    launched. Both end SUCCEEDED, the stopped job's curve that of one uninterrupted run."""
    import sqlite3

    from tidal.core.policy import PolicyConfig
    from tidal.platform.config import SchedulerConfig
    from tidal.platform.scheduler import Scheduler

    path = tmp_path / "tidal.sqlite"
    sched = Scheduler(SchedulerConfig(tick_s=3600.0, state_path=str(path), restart_cost_s=0.0,
                                      cpus_per_worker=1.0, policy=PolicyConfig(aging_s=1e6)))
    other = sqlite3.connect(path, isolation_level=None)
    four = Plan(dp=4, micro_batch=2)

    def tick_until(done: Any, what: str, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while not done():
            assert time.time() < deadline, (what, [sched.store.get(j) for j in (a, b) if j])
            sched.reconcile()
            time.sleep(1)

    try:
        spec_a = tiny_gpt_spec(name="refused-stop-a", total_steps=300, max_gpus=4, checkpoint_every=10)
        a = sched.submit(spec_a, (Option(gpus=4, plan=four, samples_per_s=100.0, cpus_per_gpu=1.0),))
        b = ""
        tick_until(lambda: sched.store.get(a).step >= 5, "A to train")
        spec_b = tiny_gpt_spec(name="refused-stop-b", total_steps=20, max_gpus=4, seed=1)
        with sched.lock:  # its loop thread, woken by the submit, waits for this
            b = sched.submit(spec_b, (Option(gpus=4, plan=four, samples_per_s=1e4, cpus_per_gpu=1.0),))
            other.execute("BEGIN IMMEDIATE")
        sched.reconcile()  # B's rate asks for A's GPUs: A is asked to stop, and the write is refused
        assert sched.runs.stopping(a), "\n".join([str(sched.reasons), *sched.events])
        assert sched.store.get(a).state is JobState.RUNNING
        assert [what for what, _ in sched.recorder.pending] == [f"{a}'s stop"]
        wait(lambda: not _train_workers(), "A's run to stop while the file is locked", 180)
        sched.reconcile()  # still refused: A's ended run is not collected, B not launched
        assert sched.store.get(a).state is JobState.RUNNING and not sched.executor.has_run(b)
        assert sched.executor.has_run(a)  # the ended run, kept until its end can be written
        other.execute("ROLLBACK")
        tick_until(lambda: sched.executor.has_run(b), "B to launch once the file takes writes")
        assert [e.to_state for e in sched.store.events(a)][:4] == ["QUEUED", "RUNNING", "STOPPING", "QUEUED"]
        tick_until(lambda: all(sched.store.get(j).state is JobState.SUCCEEDED for j in (a, b)),
                   "A and B to succeed", 600)
        assert [e.to_state for e in sched.store.events(a)] == \
            ["QUEUED", "RUNNING", "STOPPING", "QUEUED", "RUNNING", "SUCCEEDED"], sched.store.events(a)
        assert [e.to_state for e in sched.store.events(b)] == ["QUEUED", "RUNNING", "SUCCEEDED"]
        assert any(f"could not record {a}'s stop" in e for e in sched.events), list(sched.events)
        assert any(f"recorded {a}'s stop" in e for e in sched.events), list(sched.events)
        assert_same_curve(spec_a, sched.history(a))
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()


def test_scheduler_killed_while_a_job_profiles_and_while_one_stops(scheduler: Any) -> None:
    spec_a = tiny_gpt_spec(name=f"fault-a-{uuid.uuid4().hex[:6]}", total_steps=120, max_gpus=4,
                           checkpoint_every=10, d_model=72)  # a workload of its own: profiled
    a = sdk.JobHandle(ray.get(scheduler.submit.remote(spec_a)), scheduler)
    wait(lambda: a.status()["state"] == "PROFILING" and bool(a.status()["nodes"]),
         "A's profiles to start", 60)
    ray.kill(scheduler, no_restart=False)  # killed while A profiles
    actor = ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
    wait(lambda: ray.get(actor.ping.remote()) == "ok", "the scheduler to restart", 120)
    a = sdk.JobHandle(a.job_id, actor)
    wait(lambda: a.status()["state"] == "RUNNING" and a.status()["step"] >= 15,
         "A to be admitted and run", 400)

    # B comes with its resource matrix, all 4 GPUs at a high rate: A is asked to stop
    # (STOPPING), and the actor dies then
    spec_b = tiny_gpt_spec(name="fault-b", total_steps=60, max_gpus=4, checkpoint_every=10, seed=1)
    plan_b = Plan(dp=4, zero_stage=1, micro_batch=2)
    b = sdk.JobHandle(ray.get(actor.submit.remote(spec_b, (
        Option(gpus=4, plan=plan_b, samples_per_s=1e4, cpus_per_gpu=1.0),))), actor)
    deadline = time.time() + 120
    while a.status()["state"] != "STOPPING":
        assert time.time() < deadline, ("A was never asked to stop", a.status(), b.status(),
                                        ray.available_resources())
        time.sleep(0.1)
    ray.kill(actor, no_restart=False)  # killed while A stops
    actor = ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
    wait(lambda: ray.get(actor.ping.remote()) == "ok", "the scheduler to restart", 120)
    a, b = sdk.JobHandle(a.job_id, actor), sdk.JobHandle(b.job_id, actor)
    finals = [a.wait(timeout=900, poll_s=2), b.wait(timeout=900, poll_s=2)]
    assert [f["state"] for f in finals] == ["SUCCEEDED", "SUCCEEDED"], finals
    # A's stopping run outlived the actor and was adopted still stopping: it ended with its
    # checkpoint as asked, as if no scheduler had died
    events = ray.get(actor.recent_events.remote())
    assert any(f"adopted {a.job_id}'s run {a.job_id}-r" in e and "(STOPPING" in e for e in events), events
    notes = [(e["to"], e["note"]) for e in ray.get(actor.job_events.remote(a.job_id))]
    i = [to for to, _ in notes].index("STOPPING")
    assert notes[i + 1][0] == "QUEUED" and "stopped at step" in notes[i + 1][1], notes
    assert_same_curve(spec_a, a.logs())
    assert_same_curve(spec_b, b.logs())
    assert_no_placement_group_left()


def test_ray_stop_and_start(ray_cluster: Any, tmp_path: Path) -> None:
    """The whole Ray cluster stops and starts again (tests/platform/ray_restart_scenario.py, a
    cluster of its own): the running job resumes from its newest checkpoint, the one that was
    PROFILING is admitted, both finish."""
    from tests.platform.ray_restart_scenario import RUN

    out = tmp_path / "out.json"
    subprocess.run([sys.executable, "-m", "tests.platform.ray_restart_scenario", str(tmp_path / "state"),
                    str(out)], check=True, timeout=1500, cwd=Path(__file__).resolve().parents[2])
    r = json.loads(out.read_text())
    assert r["run"]["final"]["state"] == "SUCCEEDED", r["run"]["final"]
    assert r["profiling"]["final"]["state"] == "SUCCEEDED", r["profiling"]["final"]
    assert [e["to"] for e in r["profiling"]["events"]][:2] == ["PROFILING", "QUEUED"]
    resumed = [int(m.group(1)) for e in r["run"]["events"]
               for m in [re.search(r"scheduler restarted: .* resumes from step (\d+)", e["note"])] if m]
    print(f"\nray stop at step {r['stopped_at']}, resumed from step {resumed}")
    assert len(resumed) == 1, resumed
    assert r["stopped_at"] - int(RUN["checkpoint_every"]) <= resumed[0], (r["stopped_at"], resumed)
    assert_same_curve(tiny_gpt_spec(**RUN), r["run"]["curve"])
    assert not [s for s in r["placement_groups"] if s in ("CREATED", "PENDING", "RESCHEDULING")]


def _tidal(*args: str) -> subprocess.CompletedProcess[str]:
    """The `tidal` command, as a user runs it on the cluster: RAY_ADDRESS set, no TIDAL_STATE."""
    env = {k: v for k, v in os.environ.items() if k != "TIDAL_STATE"}
    env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return subprocess.run([sys.executable, "-m", "tidal.platform.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_scheduler_lost_for_good_is_found_missing_and_started_on_the_cluster_state(
        ray_cluster: Any, tmp_path: Path) -> None:
    """The scheduler killed for good while two jobs run: `tidal status` from a shell without
    TIDAL_STATE says no scheduler runs, in one line, exit 1, and starts none; `tidal start` brings
    one up on the head node on the state file the cluster recorded (not $TIDAL_STATE's default);
    the jobs' runs, which trained on meanwhile, are adopted, neither is moved, and each ends with
    an uninterrupted run's curve. (A run that died with its host is requeued from its newest
    checkpoint: `test_ray_stop_and_start`.)"""
    from ray.util.state import list_actors

    from tidal.platform.registry import recorded_state_path

    state = tmp_path / "cluster-state" / "tidal.sqlite"
    gen = _start(tmp_path, state_path=str(state))
    actor = next(gen)
    assert recorded_state_path() == str(state.resolve())
    specs = [tiny_gpt_spec(name=f"lost-scheduler-{i}", total_steps=60, max_gpus=1, checkpoint_every=10,
                           seed=i) for i in range(2)]
    one = (Option(gpus=1, plan=Plan(dp=1, micro_batch=8), samples_per_s=100.0),)
    jobs = [sdk.JobHandle(ray.get(actor.submit.remote(spec, one)), actor) for spec in specs]
    wait(lambda: all(j.status()["step"] >= 25 for j in jobs), "both jobs to pass their second checkpoint")
    ray.kill(actor, no_restart=True)
    wait(lambda: sdk.find() is None, "the scheduler's name to go", 30)

    t = time.monotonic()
    read = _tidal("status")
    took = time.monotonic() - t
    print(f"tidal status, no scheduler: exit {read.returncode} in {took:.1f} s: {read.stderr.strip()}")
    assert read.returncode == 1 and "Traceback" not in read.stderr  # Ray's own lines come first
    assert read.stderr.strip().splitlines()[-1] == (
        f"tidal: no Tidal scheduler runs on this Ray cluster: `tidal start` starts one on its state "
        f"file {state.resolve()}")
    assert sdk.find() is None  # the read started nothing
    with pytest.raises(sdk.NoSchedulerError, match="no Tidal scheduler runs"):
        sdk.list_jobs()

    started = _tidal("start")
    assert started.returncode == 0, started.stderr
    actor = sdk.find()
    assert actor is not None
    for name in (SCHEDULER_NAME, RUN_HOST_NAME):  # both on the head node
        (row,) = list_actors(filters=[("name", "=", name), ("state", "=", "ALIVE")])
        assert row.node_id == ray_cluster.node_ids[0], name
    try:
        jobs = [sdk.JobHandle(j.job_id, actor) for j in jobs]  # the same job table: the recorded state file
        for spec, job in zip(specs, jobs, strict=True):
            final = job.wait(timeout=600, poll_s=1)
            assert final["state"] == "SUCCEEDED", final
            # its run outlived the scheduler (the run host drives it) and the new one adopted it:
            # one run from start to end, never moved
            adopted = [e for e in ray.get(actor.recent_events.remote())
                       if f"adopted {job.job_id}'s run {job.job_id}-r0 (RUNNING" in e]
            assert adopted, ray.get(actor.recent_events.remote())
            print(f"tidal start: {adopted[0]}")
            states = [e["to"] for e in ray.get(actor.job_events.remote(job.job_id))]
            assert states == ["QUEUED", "RUNNING", "SUCCEEDED"] and final["restarts"] == 0, (states, final)
            assert_same_curve(spec, job.logs())
    finally:
        ray.kill(actor, no_restart=True)
        time.sleep(2)
