"""The scheduler actor on a real two-node Ray cluster (2 logical GPUs per node, gloo on CPU).

One scenario covers the core of the scheduler: job A starts alone on every GPU and CPU; job B
arrives and is profiled in capacity the scheduler reserves from A; the scheduler reconfigures A
and starts B; the scheduler actor is killed mid-run and restarts; both jobs finish with falling
loss curves equal to uninterrupted runs; every run's workers ran on the nodes its decision named.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import ray

from tests.conftest import tiny_gpt_spec
from tests.platform.conftest import wait as _wait
from tests.platform.test_faults import assert_same_curve
from tidal.jobs import Plan, SpecError
from tidal.jobs.checkpoint import META_FILE
from tidal.jobs.runner import Resources, launch
from tidal.platform import sdk
from tidal.platform.config import NAMESPACE, SCHEDULER_NAME, SchedulerConfig
from tidal.platform.errors import error_note, error_text
from tidal.platform.runs import compute_steps
from tidal.platform.scheduler import resume_source
from tidal.platform.store import JobRecord, JobState, Store

integration = pytest.mark.integration


@integration
def test_two_jobs_reconfiguration_and_scheduler_restart(scheduler: Any) -> None:
    spec_a = tiny_gpt_spec(name="job-a", total_steps=240, max_gpus=4, checkpoint_every=10)
    # a workload of its own (width 80): B is never in the profile cache, so it is profiled on the
    # full cluster
    spec_b = tiny_gpt_spec(name=f"job-b-{uuid.uuid4().hex[:6]}", total_steps=90, max_gpus=4,
                           checkpoint_every=10, seed=1, d_model=80)
    a = sdk.JobHandle(ray.get(scheduler.submit.remote(spec_a)), scheduler)
    _wait(lambda: a.status()["state"] == "RUNNING", "A to start")
    gpus_alone = a.status()["gpus"]
    t0 = time.time()
    b = sdk.JobHandle(ray.get(scheduler.submit.remote(spec_b)), scheduler)  # returns at once: PROFILING
    assert time.time() - t0 < 5.0
    assert b.status()["state"] == "PROFILING"
    _wait(lambda: b.status()["state"] == "PROFILING" and bool(b.status()["nodes"]),
          "B's profile workers to be reserved (shown in its status)", 60)
    _wait(lambda: b.status()["state"] not in ("PROFILING",), "B's admission", 300)
    events = ray.get(scheduler.recent_events.remote())
    # B's profiles ran in capacity reserved from A (A shrank for them), not after A ended
    assert a.status()["state"] != "SUCCEEDED", events
    assert a.status()["restarts"] >= 1, events
    assert any(f"{b.job_id}: profiling 2 plans, reserved 2 workers" in e for e in events), events
    history = [(e["from"], e["to"]) for e in ray.get(scheduler.job_events.remote(b.job_id))]
    assert history[:2] == [(None, "PROFILING"), ("PROFILING", "QUEUED")], history
    _wait(lambda: b.status()["state"] == "RUNNING", "B to start")
    events = ray.get(scheduler.recent_events.remote())
    assert a.status()["restarts"] >= 1, f"A was not reconfigured: alone on {gpus_alone} GPUs; {events}"
    assert a.status()["gpus"] + b.status()["gpus"] <= 4
    assert a.status()["gpus"] < gpus_alone

    _wait(lambda: b.status()["step"] >= 10, "B to train a while")
    # the restart cost was measured from these runs (A's stop, the first steps of B's and A's new
    # runs), while the policy is charged the value the fixture pins
    cost = ray.get(scheduler.restart_cost.remote())
    assert cost["pinned"] and cost["seconds"] == 0.0, cost
    assert cost["stops"] and cost["starts"], cost
    assert all(0.0 < s < 600.0 for s in cost["starts"] + cost["stops"]), cost
    assert cost["measured_s"] > 0.0, cost
    before = {h.job_id: h.status() for h in (a, b)}  # B runs; A runs beside it or waits for its GPUs
    assert before[b.job_id]["state"] == "RUNNING", before
    killed = time.time()
    ray.kill(scheduler, no_restart=False)  # the actor restarts and must find both jobs
    actor = ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
    _wait(lambda: ray.get(actor.ping.remote()) == "ok", "the scheduler to restart", 120)
    # the restarted actor starts from what its predecessor measured (kept in the store)
    kept = ray.get(actor.restart_cost.remote())
    assert set(cost["starts"]) <= set(kept["starts"]), (cost, kept)
    assert set(cost["stops"]) <= set(kept["stops"]), (cost, kept)
    a, b = sdk.JobHandle(a.job_id, actor), sdk.JobHandle(b.job_id, actor)
    assert {r["job_id"] for r in sdk.list_jobs()} >= {a.job_id, b.job_id}
    # the runs outlived the actor (the run host drives them) and the new life adopted them
    events = ray.get(actor.recent_events.remote())
    running = [h for h in (a, b) if before[h.job_id]["state"] in ("RUNNING", "STOPPING")]
    for h in running:
        run_id = f"{h.job_id}-r{before[h.job_id]['restarts']}"
        assert any(f"adopted {h.job_id}'s run {run_id} ({before[h.job_id]['state']}" in e
                   for e in events), events

    final_a, final_b = a.wait(timeout=600, poll_s=2), b.wait(timeout=600, poll_s=2)
    assert final_a["state"] == final_b["state"] == "SUCCEEDED", (final_a, final_b)
    # ... and moved neither: B ended in the run it had, and A, if it ran, was not stopped before
    # B ended (then it may grow into B's GPUs, as the policy would have had it anyway)
    assert final_b["restarts"] == before[b.job_id]["restarts"], (before, final_b)
    b_end = max(e["t"] for e in ray.get(actor.job_events.remote(b.job_id)) if e["to"] == "SUCCEEDED")
    a_stops = [e for e in ray.get(actor.job_events.remote(a.job_id))
               if e["to"] == "STOPPING" and killed < e["t"] < b_end]
    assert a.job_id not in {h.job_id for h in running} or not a_stops, a_stops
    # the online correction saw A's runs: a ratio per GPU count it ran on, stored with the job
    ratios = final_a["sps_ratios"]
    assert ratios and all(1 <= n <= 4 and 0.05 <= r <= 20 for n, r in ratios), ratios

    plan = Plan(dp=2, zero_stage=1, micro_batch=4)
    res = Resources(num_workers=2, gpus_per_worker=1)
    uninterrupted = [launch(spec, plan, res) for spec in (spec_a, spec_b)]  # both at once: 4 GPUs
    for spec, handle, ref in zip((spec_a, spec_b), (a, b), uninterrupted, strict=True):
        curve = handle.logs()
        assert [m["step"] for m in curve] == list(range(1, spec.total_steps + 1))
        assert sum(m["loss"] for m in curve[-5:]) / 5 < curve[0]["loss"] - 0.5
        whole = ref.result(timeout=600)
        rel = [abs(x - m["loss"]) / x for x, m in zip(whole.losses, curve, strict=True)]
        assert max(rel) <= 1e-3, f"{spec.name}: max relative difference {max(rel):.2e}"
    # placements are checked by the restarted actor for the runs it collected
    for check in ray.get(actor.placements.remote()):
        assert check["decided"] == check["ran"], check
    # storage keeps a job's last run only (A ran twice or more), with its newest checkpoints
    storage = Path(os.environ["TIDAL_STORAGE"])
    for final in (final_a, final_b):
        last = Path(final["checkpoint"]).parent
        assert last.parent == storage and last.name.startswith(f"{final['job_id']}-r"), final
        _wait(lambda job=final["job_id"]: len(list(storage.glob(f"{job}-r*"))) == 1,
              "the earlier runs to be removed", 30)
        assert [d.name for d in storage.glob(f"{final['job_id']}-r*")] == [last.name]
        kept = sorted(d.name for d in last.glob("step_*"))
        assert 1 <= len(kept) <= 2 and Path(final["checkpoint"]).name == kept[-1], kept
    for spec in (spec_a, spec_b):  # their profiles (a Ray Train run each, from 2 workers) leave nothing
        assert not [d.name for d in storage.glob(f"profile-{spec.name}-*")]


class FailAfter:
    """A loss that raises after `n` calls in a process: the short profiles pass, the run fails."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, model: Any, batch: Any) -> Any:
        from tidal.jobs.models import lm_loss

        self.calls += 1
        if self.calls > self.n:
            raise RuntimeError("boom: the training function failed")
        return lm_loss(model, batch)


@integration
def test_reject_fail_and_cancel(scheduler: Any) -> None:
    from tidal.platform.cli import _get, format_status, main

    for command in ("status", "cancel"):  # an unknown id is one line, not the actor's traceback
        with pytest.raises(SystemExit, match=r"^tidal: no job 'nope'$"):
            main([command, "nope"])
    storage = Path(os.environ["TIDAL_STORAGE"])  # the actor's too: a file in its place for a moment
    storage.rename(storage.with_name(storage.name + ".away"))
    try:
        storage.write_text("not a directory")
        with pytest.raises(SystemExit, match=rf"^tidal: \$TIDAL_STORAGE {storage} cannot hold checkpoints "
                                             r"\(not a directory\)"):
            _get(scheduler.submit.remote(tiny_gpt_spec(name="no-storage")))  # as the CLI's answers
        assert not [r for r in sdk.list_jobs() if r["name"] == "no-storage"]  # nothing stored
    finally:
        storage.unlink(missing_ok=True)
        storage.with_name(storage.name + ".away").rename(storage)
    with pytest.raises(SpecError, match="needs 8 GPUs, the cluster has 4"):  # unpickled as itself
        ray.get(scheduler.submit.remote(tiny_gpt_spec(name="too-big", min_gpus=8, max_gpus=8)))
    ok = sdk.JobHandle(ray.get(scheduler.submit.remote(
        tiny_gpt_spec(name="keeps-going", total_steps=10**6, max_gpus=2))), scheduler)
    bad = sdk.JobHandle(ray.get(scheduler.submit.remote(
        tiny_gpt_spec(name="raises", total_steps=5000, max_gpus=2, loss=FailAfter(40)))), scheduler)
    final = bad.wait(timeout=400, poll_s=2)
    assert final["state"] == "FAILED" and "boom" in final["error"], final
    # the FAILED job keeps what its run reported before the error (`_run_failed`)...
    curve = bad.logs()
    assert curve and all(math.isfinite(m["loss"]) for m in curve), curve
    # ...and its state change names the worker's error, not Ray Train's wrapper around it
    note = ray.get(scheduler.job_events.remote(bad.job_id))[-1]["note"]
    assert note == "RuntimeError: boom: the training function failed", note
    table = format_status(sdk.list_jobs())
    assert "FAILED" in table and "boom" in table
    step = ok.status()["step"]
    _wait(lambda: ok.status()["state"] == "RUNNING" and ok.status()["step"] > step, "the other job to go on")
    ok.cancel()
    assert ok.wait(timeout=200, poll_s=1)["state"] == "CANCELLED"
    ended = rf"^tidal: {ok.job_id} has already ended \(CANCELLED\): nothing to cancel$"
    with pytest.raises(SystemExit, match=ended):
        main(["cancel", ok.job_id])  # a cancel that does nothing says so
    _wait(lambda: ray.available_resources().get("GPU", 0) == 4, "the cancelled job's GPUs to be freed", 120)


@integration
def test_a_failed_job_resumes_as_a_new_job_from_its_newest_checkpoint(scheduler: Any) -> None:
    """`tidal resume`: a job FAILED by its loss is submitted again with the loss fixed, from its
    newest complete checkpoint; the two jobs' curve is one uninterrupted run's."""
    spec = tiny_gpt_spec(name="resumed", total_steps=100, checkpoint_every=10, max_gpus=2)
    failed = sdk.submit(dataclasses.replace(spec, loss=FailAfter(40)))
    st = failed.wait(timeout=400, poll_s=1)
    assert st["state"] == "FAILED", st  # its record points at the newest checkpoint its run left
    assert st["step"] >= 10 and st["checkpoint"].endswith(f"/{failed.job_id}-r0/step_{st['step']:08d}"), st
    with pytest.raises(KeyError, match="no job 'nope'") as no_job:
        sdk.resume("nope")
    with pytest.raises(SpecError, match=r"^JobSpec.resume_from: .*/resumed-\w+-r0/step_\d+ is at step \d+: "
                                        r"total_steps \(10\) leaves nothing to train$") as done:
        sdk.resume(failed.job_id, dataclasses.replace(spec, total_steps=10))
    # the SDK raises the scheduler's answers as themselves, not as RayTaskError with its trace
    assert type(no_job.value) is KeyError and type(done.value) is SpecError
    again = sdk.resume(failed.job_id, spec)
    first = ray.get(scheduler.job_events.remote(again.job_id))[0]["note"]
    step = int(re.search(r"resumes from step (\d+) of (\S+)$", first)[1])  # type: ignore[index]
    assert step == st["step"] and first.endswith(f"of {failed.job_id}"), first
    with pytest.raises(ValueError, match=rf"job {again.job_id} is (PROFILING|QUEUED|RUNNING): only a job "
                                         r"that has ended can be resumed"):
        sdk.resume(again.job_id)
    final = again.wait(timeout=400, poll_s=1)
    assert final["state"] == "SUCCEEDED" and final["step"] == 100, final
    assert_same_curve(spec, again.logs())  # steps 1..step the failed job's, the rest its own


def test_a_live_jobs_checkpoint_is_no_resume_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No cluster: its run keeps only its newest checkpoints, so a job cannot start from another
    job's while that one goes on; from an ended job's, or one outside Tidal's runs, it can."""
    monkeypatch.setenv("TIDAL_STORAGE", str(tmp_path / "runs"))
    store = Store(tmp_path / "tidal.sqlite")
    store.add(JobRecord(job_id="gpt-aaaaaa", name="gpt", spec=b"", state=JobState.QUEUED))
    store.add(JobRecord(job_id="gpt-bbbbbb", name="gpt", spec=b"", state=JobState.FAILED))
    runs = tmp_path / "runs"
    with pytest.raises(SpecError, match=r"^JobSpec.resume_from: .*/gpt-aaaaaa-r1/step_00000040 is job "
                                        r"gpt-aaaaaa's, which is QUEUED: resume from it once it has ended$"):
        resume_source(store, str(runs / "gpt-aaaaaa-r1" / "step_00000040"))
    assert resume_source(store, str(runs / "gpt-bbbbbb-r0" / "step_00000040")) == "gpt-bbbbbb"
    assert resume_source(store, str(runs / "gone-cccccc-r0" / "step_00000040")) is None  # not in the store
    assert resume_source(store, str(tmp_path / "mine" / "step_00000040")) is None


class WorkerGroupError(RuntimeError):
    """Ray Train's error for a worker that raised, with its text as Ray 2.60 writes it."""


def test_a_failed_runs_note_names_the_workers_error_not_the_wrapper() -> None:
    wrapped = WorkerGroupError(
        "Training failed due to worker errors:\n[Rank 0 Error Snippet]:\nTraceback (most recent call "
        'last):\n  File "tidal/jobs/worker.py", line 261, in trained\n    raise NonFiniteLoss(...)\n'
        "tidal.jobs.worker.NonFiniteLoss: non-finite loss at step 30: nan\n\n")
    stored, note = error_text(wrapped)
    assert note == "tidal.jobs.worker.NonFiniteLoss: non-finite loss at step 30: nan"
    assert stored.startswith("WorkerGroupError: Training failed") and "line 261" in stored
    class ControllerError(RuntimeError):
        pass

    _, note = error_text(ControllerError("Training failed due to controller error:\n"
                                          "[Errno 28] No space left on device"))
    assert note == ("ControllerError: Training failed due to controller error: "
                    "[Errno 28] No space left on device")
    # without a traceback, the first line; long texts are cut, the stored one keeps its end
    stored, note = error_text(ValueError("bad plan\ndetails"))
    assert (stored, note) == ("ValueError: bad plan\ndetails", "ValueError: bad plan")
    stored, note = error_text(ValueError("x" * 5000))
    assert len(note) == 160 and len(stored) == 4000 and stored.endswith("x")


@pytest.mark.parametrize("error", [
    WorkerGroupError("Training failed due to worker errors:\n[Rank 0 Error Snippet]:\nTraceback (most recent "
                     "call last):\n" + '  File "w.py", line 1, in f\n' * 400 + "tidal.X: boom\n"),
    RuntimeError("Training failed due to controller error:\n" + "context\n" * 800 + "[Errno 28] No space"),
    ValueError("bad plan\n" + "details\n" * 900),
    ValueError(""),
])
def test_the_stored_error_has_the_note_of_the_event(error: Exception) -> None:
    """`tidal status` reads its error line off the stored text (`error_note`), `tidal events` got
    the note when the run failed: the same line, however long the text was."""
    stored, note = error_text(error)
    assert len(stored) <= 4000 and error_note(stored) == note and note


def test_an_autolrs_jobs_probe_steps_count_against_its_budget(tmp_path: Path) -> None:
    """The budget's steps (what `total_steps` counts, and what the policy's remaining work and
    the ETA are computed from) include an AutoLRS job's losing probes: from the live run's
    progress, else the job's last checkpoint, else its data position."""
    seen: dict[str, tuple[str, int, bool]] = {}
    r = JobRecord(job_id="j", name="j", spec=b"", step=40)
    assert compute_steps(r, None, seen) == 40  # never checkpointed: the data position
    ckpt = tmp_path / "step_40"
    ckpt.mkdir()
    (ckpt / META_FILE).write_text(json.dumps({"step": 40, "compute_steps": 48}))
    queued = JobRecord(job_id="j", name="j", spec=b"", step=40, checkpoint=str(ckpt))
    assert compute_steps(queued, None, seen) == 48
    (ckpt / META_FILE).write_text(json.dumps({"step": 40, "compute_steps": 999}))
    assert compute_steps(queued, None, seen) == 48  # read once per checkpoint
    running = JobRecord(job_id="j", name="j", spec=b"", step=41, checkpoint=str(ckpt), state=JobState.RUNNING)
    assert compute_steps(running, {"step": 45, "compute_steps": 60}, seen) == 60  # the live run says
    assert compute_steps(running, None, seen) == 60  # its run ended, the store has not caught up
    (ckpt / META_FILE).write_text(json.dumps({"step": 40, "compute_steps": 48}))
    requeued = JobRecord(job_id="j", name="j", spec=b"", step=40, checkpoint=str(ckpt))
    assert compute_steps(requeued, None, seen) == 48  # the run was lost: back to its checkpoint's
    gone = JobRecord(job_id="k", name="k", spec=b"", step=7, checkpoint=str(tmp_path / "missing"))
    assert compute_steps(gone, None, seen) == 7  # unreadable: the data position, no error


@pytest.mark.parametrize(("field", "value", "says"), [
    ("tick_s", -1.0, "tick_s must be a finite number > 0"),
    ("tick_s", 0, "tick_s must be a finite number > 0"),
    ("stall_s", 0.0, "stall_s must be a finite number > 0"),
    ("gpu_mem_gib", float("nan"), "gpu_mem_gib must be a finite number > 0"),
    ("cpus_per_worker", "1", "cpus_per_worker must be a finite number > 0"),
    ("profile_gpus", -0.5, "profile_gpus must be a finite number >= 0"),
    ("release_grace_s", float("inf"), "release_grace_s must be a finite number >= 0"),
    ("profile_samples", 9, "profile_samples must be an integer >= 1 and <= 8"),
    ("profile_steps", 0, "profile_steps must be an integer >= 1"),
    ("max_failures", 1.5, "max_failures must be an integer >= 0"),
    ("max_infra_restarts", -1, "max_infra_restarts must be an integer >= 0"),
    ("max_admission_attempts", True, "max_admission_attempts must be an integer >= 1"),
])
def test_bad_scheduler_settings_fail_in_one_line_naming_the_setting(field: str, value: object,
                                                                   says: str) -> None:
    with pytest.raises(ValueError, match=says) as e:
        SchedulerConfig(**{field: value})  # type: ignore[arg-type]
    assert "\n" not in str(e.value) and f"SchedulerConfig.{field}" in str(e.value)
    SchedulerConfig(profile_gpus=0.0, release_grace_s=0.0, max_failures=0, profile_samples=8)  # edges pass


@pytest.mark.parametrize("bad", [-5.0, float("nan"), float("inf")])
def test_a_pinned_restart_cost_the_policy_cannot_price_fails_in_one_line(bad: float) -> None:
    with pytest.raises(ValueError, match=r"SchedulerConfig\.restart_cost_s must be None"):
        SchedulerConfig(restart_cost_s=bad)
    assert SchedulerConfig().restart_cost_s is None
    assert SchedulerConfig(restart_cost_s=0.0).restart_cost_s == 0.0
