"""The run host's body (`RunHost`, a plain class here: no cluster). A run that is starting holds
no lock the other runs' questions need, and a job cannot be launched twice meanwhile."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tidal.jobs.runner import Resources
from tidal.jobs.spec import Plan
from tidal.platform import runhost
from tidal.platform.runhost import RunBusy, RunHost


class Started:
    """What `runner.launch` returns, as far as the host looks at it."""

    def __init__(self, run_id: str) -> None:
        self.run_id, self.launched_at, self.stop_requested_at = run_id, 1.0, None


def test_a_starting_run_blocks_neither_the_hosts_answers_nor_guards_against_a_second_launch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow_launch(spec: Any, plan: Plan, resources: Resources, checkpoint: str | None, *, run_id: str,
                    **_: Any) -> Started:
        if run_id == "a-r0":  # the first launch of a host: its CUDA probe takes seconds
            entered.set()
            assert release.wait(10)
        return Started(run_id)

    monkeypatch.setattr(runhost, "launch", slow_launch)
    host = RunHost()
    res = Resources(num_workers=1, gpus_per_worker=1)
    args = (None, Plan(dp=1, micro_batch=8), res, None)
    first = threading.Thread(target=host.launch, args=("a", *args, "a-r0", 0))
    first.start()
    try:
        assert entered.wait(10)
        answered: list[Any] = []
        asker = threading.Thread(target=lambda: answered.append(host.runs()))
        asker.start()
        asker.join(5)
        assert answered == [{}], "the host's answers waited for a run to start"
        with pytest.raises(RunBusy, match=r"a already has a run here \(being launched\)"):
            host.launch("a", *args, "a-r1", 0)
        assert host.launch("b", *args, "b-r0", 0) == 1.0  # another job launches meanwhile
    finally:
        release.set()
        first.join(10)
    assert host.runs() == {"a": ("a-r0", 1.0, None), "b": ("b-r0", 1.0, None)}
    with pytest.raises(RunBusy, match=r"a already has a run here \(a-r0\)"):
        host.launch("a", *args, "a-r1", 0)


def test_a_launch_that_raises_leaves_the_job_free_to_launch_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def refusing(spec: Any, plan: Plan, resources: Resources, checkpoint: str | None, *, run_id: str,
                 **_: Any) -> Started:
        calls.append(run_id)
        if run_id.endswith("r0"):
            raise ValueError("plan refused")
        return Started(run_id)

    monkeypatch.setattr(runhost, "launch", refusing)
    host = RunHost()
    args = (None, Plan(dp=1, micro_batch=8), Resources(num_workers=1, gpus_per_worker=1), None)
    with pytest.raises(ValueError, match="plan refused"):
        host.launch("a", *args, "a-r0", 0)
    assert host.launch("a", *args, "a-r1", 0) == 1.0
    assert calls == ["a-r0", "a-r1"] and host.runs() == {"a": ("a-r1", 1.0, None)}
