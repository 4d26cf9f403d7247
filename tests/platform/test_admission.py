"""Admission on a real Ray cluster: `submit` returns at once, jobs profile off the actor and
concurrently, a PROFILING job can be cancelled, and broken jobs (and NaN options) are refused in
seconds without touching a running one."""

from __future__ import annotations

import math
import re
import time
import uuid
from typing import Any

import pytest
import ray

from tests.conftest import tiny_gpt_spec
from tests.jobs.test_dryrun import _empty, _raises
from tests.platform.conftest import wait
from tidal.core.policy import Option
from tidal.jobs.spec import Plan, SpecError
from tidal.platform import sdk

pytestmark = pytest.mark.integration


def _admission_s(scheduler: Any, job_id: str) -> float:
    """Seconds from the job's submission to its QUEUED event (its store's history)."""
    ev = ray.get(scheduler.job_events.remote(job_id))
    assert ev[0]["to"] == "PROFILING" and ev[1]["to"] == "QUEUED", ev
    return float(ev[1]["t"] - ev[0]["t"])


def test_submit_returns_at_once_and_submissions_profile_concurrently(scheduler_one_profile: Any) -> None:
    scheduler = scheduler_one_profile
    tag = uuid.uuid4().hex[:6]

    def spec(i: int) -> Any:  # workloads of their own (widths 100-128): none is in the profile cache
        return tiny_gpt_spec(name=f"adm-{tag}-{i}", total_steps=20, max_gpus=1, seed=i, d_model=100 + 4 * i)

    t = time.time()
    one = sdk.JobHandle(ray.get(scheduler.submit.remote(spec(0))), scheduler)
    assert time.time() - t < 5.0, "submit waited for the profile"
    wait(lambda: one.status()["state"] != "PROFILING", "the single job's admission", 300)
    single = _admission_s(scheduler, one.job_id)

    t = time.time()
    refs = [scheduler.submit.remote(spec(i)) for i in range(1, 7)]  # six at once
    ids = ray.get(refs)
    submit_s = time.time() - t
    assert submit_s < 5.0, f"six submissions took {submit_s:.1f} s to return"
    cancelled = sdk.JobHandle(ray.get(scheduler.submit.remote(spec(7))), scheduler)
    cancelled.cancel()  # a PROFILING job can be cancelled
    assert cancelled.status()["state"] == "CANCELLED"
    handles = [sdk.JobHandle(i, scheduler) for i in ids]
    at_once = [0]  # the most profiles holding capacity at the same moment

    def admitted() -> bool:
        rows = [h.status() for h in handles]
        at_once[0] = max(at_once[0], sum(1 for r in rows if r["state"] == "PROFILING" and r["nodes"]))
        return all(r["state"] != "PROFILING" for r in rows)

    wait(admitted, "six admissions", 600)
    times = [_admission_s(scheduler, h.job_id) for h in handles]
    print(f"\nadmission: single {single:.1f} s; six at once "
          + ", ".join(f"{x:.1f}" for x in times) + f" s (max {max(times) / single:.2f}x single); "
          f"{at_once[0]} profiles at once")
    finals = [h.wait(timeout=600, poll_s=2) for h in [one, *handles]]
    assert all(f["state"] == "SUCCEEDED" for f in finals), finals
    # concurrently, not one after another: two or more profiles held reserved capacity at once
    assert at_once[0] >= 2, at_once
    assert ray.get(scheduler.job_events.remote(cancelled.job_id))[-1]["note"] == "cancelled while profiling"


def test_broken_jobs_are_refused_in_seconds_without_touching_a_running_job(scheduler: Any) -> None:
    running = sdk.submit(tiny_gpt_spec(name="keeps-running", total_steps=10**6, max_gpus=2),
                         config=None)
    wait(lambda: running.status()["state"] == "RUNNING" and running.status()["step"] > 0, "a job to run")
    before = running.status()
    broken = ((dict(dataset=_empty), "JobSpec.dataset"), (dict(model=_raises), "JobSpec.model"))
    for override, words in broken:
        t = time.time()
        with pytest.raises(SpecError, match=words):
            sdk.submit(tiny_gpt_spec(name="broken", **override))
        assert time.time() - t < 10.0
    with pytest.raises(SpecError, match="needs 100 GPUs, the cluster has 4"):
        sdk.submit(tiny_gpt_spec(name="too-big", global_batch=800, min_gpus=100, max_gpus=100))
    nan = Option(gpus=1, plan=Plan(dp=1, micro_batch=8), samples_per_s=math.nan)
    with pytest.raises(SpecError, match=r"finite samples/s > 0 \(got nan\)"):
        sdk.submit(tiny_gpt_spec(name="nan-options"), options=(nan,))
    after = running.status()
    assert after["state"] == "RUNNING" and after["restarts"] == before["restarts"], (before, after)
    assert [r["name"] for r in sdk.list_jobs()] == ["keeps-running"]  # nothing else was stored
    running.cancel()
    assert running.wait(timeout=200, poll_s=1)["state"] == "CANCELLED"


def test_a_sweeps_jobs_wait_for_one_anothers_profiles_instead_of_measuring_them_again(scheduler: Any) -> None:
    """Jobs of one workload (a sweep: other LRs) submitted while the first one profiles wait for
    its cache entries (SHARING) and plan from them; when the job they wait for is cancelled
    mid-profile, one of them measures what is missing and the other waits for that one."""
    tag = uuid.uuid4().hex[:6]

    def spec(i: int) -> Any:  # width 92: no other test's workload, so nothing is cached
        return tiny_gpt_spec(name=f"sweep-{tag}-{i}", total_steps=5, max_gpus=1, lr=1e-3 * (i + 1),
                             d_model=92)

    def events(h: sdk.JobHandle) -> list[str]:  # the scheduler's log lines about the job ("HH:MM:SS job...")
        return [line for line in ray.get(scheduler.recent_events.remote())
                if line.split(" ", 1)[1].startswith(h.job_id)]

    def measured(h: sdk.JobHandle) -> int:  # the profiles its admission set out to measure
        return sum(int(m[1]) for n in events(h) if (m := re.search(r"profiling (\d+) plans", n)))

    first = sdk.JobHandle(ray.get(scheduler.submit.remote(spec(0))), scheduler)
    wait(lambda: first.status()["reason"].startswith("profiling 2 plans"), "the first job to profile", 300)
    b, c = (sdk.JobHandle(j, scheduler) for j in ray.get([scheduler.submit.remote(spec(i)) for i in (1, 2)]))
    says = f"{first.job_id} is measuring 2 of its 2 profiles"
    wait(lambda: all(says in " ".join(events(h)) for h in (b, c)),
         "the sweep's other jobs to wait for the first one's profiles", 120)
    assert b.status()["reason"] == f"waits for {first.job_id}'s profiles of the same workload"
    assert b.status()["state"] == c.status()["state"] == "PROFILING"
    first.cancel()  # mid-profile: what it measured is cached, the rest is not
    finals = [h.wait(timeout=400, poll_s=1) for h in (b, c)]
    assert all(f["state"] == "SUCCEEDED" for f in finals), finals
    # what the first one left unmeasured, one of them measures and the other waits for (none if
    # the first had measured both before it was cancelled): never both
    assert sum(measured(h) > 0 for h in (b, c)) <= 1, [events(h) for h in (b, c)]

    # a later job of the workload: every profile is cached, it waits for none and measures none
    d = sdk.JobHandle(ray.get(scheduler.submit.remote(spec(3))), scheduler)
    assert d.wait(timeout=300, poll_s=1)["state"] == "SUCCEEDED" and measured(d) == 0, events(d)


def test_only_a_running_admission_is_waited_for() -> None:
    """No cluster: `measuring` names the job whose PROFILING stage measures one of the profiles,
    never the asking job itself, nor one that waits or sizes (its profiles are not under way)."""
    from tidal.platform.admission import Admission, Stage, measuring

    mine = frozenset({"a.json", "b.json"})
    admissions = {
        "me": Admission(stage=Stage.PROFILING, ref=None, keys=mine),
        "waits": Admission(stage=Stage.WAITING, ref=None, keys=mine),
        "other-workload": Admission(stage=Stage.PROFILING, ref=None, keys=frozenset({"c.json"})),
    }
    assert measuring(admissions, mine, but="me") is None
    admissions["sweep"] = Admission(stage=Stage.PROFILING, ref=None, keys=frozenset({"b.json"}))
    assert measuring(admissions, mine, but="me") == "sweep"
    shared = Admission(stage=Stage.SHARING, ref=None, keys=mine, after="sweep")
    assert shared.reason() == "waits for sweep's profiles of the same workload"


class HangsAfter:
    """A loss that never returns after `n` calls in a process: the client's dry run passes, the
    profile's step hangs (as a stopped worker or a deadlocked collective would)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, model: Any, batch: Any) -> Any:
        from tidal.jobs.models import lm_loss

        self.calls += 1
        if self.calls > self.n:
            time.sleep(3600)
        return lm_loss(model, batch)


@pytest.fixture
def scheduler_quick_stall(ray_cluster: Any, tmp_path: Any) -> Any:
    from tests.platform.conftest import _start

    yield from _start(tmp_path, stall_s=8.0, max_admission_attempts=2)


def test_a_hung_profile_is_killed_and_its_job_rejected_after_its_attempts(scheduler_quick_stall: Any) -> None:
    """A profile that never answers used to leave its job PROFILING for good, holding the
    capacity reserved for it: its admission is killed after `stall_s` per plan (plus one), tried
    again, and the job REJECTED naming why; the profile's processes go with it."""
    scheduler = scheduler_quick_stall
    total = ray.cluster_resources()["CPU"]
    hung = sdk.JobHandle(ray.get(scheduler.submit.remote(
        tiny_gpt_spec(name="hangs", d_model=84, max_gpus=2, loss=HangsAfter(1)))), scheduler)
    st = hung.wait(timeout=300, poll_s=1)
    assert st["state"] == "REJECTED", st
    assert re.fullmatch(r"admission failed 2 times: AdmissionHung: profiling 2 plans took more than 24 s "
                        r"\(SchedulerConfig.stall_s 8 s per plan, plus one\)", st["error_line"]), st
    log = ray.get(scheduler.recent_events.remote())
    assert any(f"{hung.job_id}: admission lost to the cluster (AdmissionHung: profiling 2 plans" in line
               for line in log), log
    wait(lambda: ray.available_resources().get("CPU", 0) == total, "the hung profile's CPUs to be freed", 60)


def test_an_admission_stage_is_overdue_after_stall_s_per_plan_plus_one() -> None:
    """No cluster: sizing may take `stall_s`, profiling `stall_s` per plan plus one; a stage
    with no task of its own (waiting, sharing) is never overdue."""
    from tidal.platform.admission import Admission, Stage

    sizing = Admission(stage=Stage.SIZING, ref="task", started=100.0)
    assert sizing.overdue(110.0, 10.0) is None
    assert sizing.overdue(110.5, 10.0) == "sizing took more than 10 s (SchedulerConfig.stall_s 10 s)"
    three = frozenset({"a.json", "b.json", "c.json"})  # the cache entries of 3 plans
    profiling = Admission(stage=Stage.PROFILING, ref="task", keys=three, started=100.0)
    assert profiling.overdue(140.0, 10.0) is None
    assert profiling.overdue(141.0, 10.0) == ("profiling 3 plans took more than 40 s "
                                              "(SchedulerConfig.stall_s 10 s per plan, plus one)")
    for stage in (Stage.WAITING, Stage.SHARING):
        assert Admission(stage=stage, ref=None, keys=three, started=100.0).overdue(1e9, 10.0) is None
