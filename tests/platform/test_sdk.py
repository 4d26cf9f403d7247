"""The SDK's handling of the scheduler's answers; its calls against a live scheduler are in
test_scheduler.py (submit, resume, wait, logs, cancel, list_jobs)."""

from __future__ import annotations

import pytest
from ray.exceptions import RayActorError, RayTaskError

from tidal.jobs.spec import SpecError
from tidal.platform.sdk import SchedulerStartError, answer_error, scheduler_started, start_failure


def _as_ray_raises(cause: BaseException) -> BaseException:
    """What `ray.get` raises for an actor call that raised `cause`: Ray's own RayTaskError, made as
    Ray makes it (an instance of both RayTaskError and the cause's class)."""
    trace = ("Traceback (most recent call last):\n  File \"scheduler.py\", line 1, in submit\n"
             f"{type(cause).__name__}: {cause}")
    return RayTaskError("Scheduler.submit", trace, cause).as_instanceof_cause()


@pytest.mark.parametrize("cause", [SpecError("JobSpec.resume_from", "not a directory"),
                                   KeyError("no job 'nope'"), ValueError("job x is RUNNING")])
def test_the_schedulers_answer_is_the_exception_it_raised(cause: BaseException) -> None:
    raised = _as_ray_raises(cause)
    assert isinstance(raised, type(cause)) and "\n" in str(raised)  # what callers got before: a trace
    mine = answer_error(raised)
    assert mine is not None and type(mine) is type(cause) and str(mine) == str(cause)
    assert "\n" not in str(mine)


def test_a_fault_is_not_an_answer() -> None:
    assert answer_error(_as_ray_raises(RuntimeError("worker died"))) is None
    assert answer_error(KeyError("raised here, not by the actor")) is None
    assert answer_error(RayActorError()) is None


def test_a_scheduler_that_could_not_start_is_its_constructors_last_line() -> None:
    trace = ("The actor died because of an error raised in its creation task, ray::Scheduler.__init__()\n"
             '  File "scheduler.py", line 154, in __init__\n    self.store = Store(path)\n\n'
             "RuntimeError: /s/tidal.sqlite is not a Tidal state file (file is not a database)\n\n")
    assert start_failure(RayActorError(error_msg=trace, actor_init_failed=True)) == (
        "the Tidal scheduler could not start: RuntimeError: /s/tidal.sqlite is not a Tidal state file "
        "(file is not a database)")
    # an actor that died later (killed, its node lost) restarts: not a failure to start
    assert start_failure(RayActorError(error_msg=trace, actor_init_failed=False)) is None
    assert start_failure(ValueError("no job 'x'")) is None


def test_other_errors_pass_through_scheduler_started() -> None:
    with pytest.raises(RuntimeError, match=r"^boom$"), scheduler_started():
        raise RuntimeError("boom")
    died = RayActorError(error_msg="...\nRuntimeError: bad state file", actor_init_failed=True)
    says = r"^the Tidal scheduler could not start: RuntimeError: bad state file$"
    with pytest.raises(SchedulerStartError, match=says), scheduler_started():
        raise died
