"""A scheduler's start (`RunTracker.recover`): the runs the run host still drives are adopted as
they are, the ones it lost are requeued, the ones no record names are stopped. No cluster: the
executor here is a stand-in that answers from a table what the run host would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal.platform.config import SchedulerConfig
from tidal.platform.curves import Curves
from tidal.platform.recording import Recorder
from tidal.platform.runs import RunTracker
from tidal.platform.store import JobRecord, JobState, Store


class HostTable:
    """The executor's answers about the run host, from a table: job → (run id, launch time,
    when a stop was asked). Records what the tracker asked of it."""

    def __init__(self, runs: dict[str, tuple[str, float, float | None]]) -> None:
        self.runs = runs
        self.jobs: set[str] = set()
        self.stopped: list[str] = []
        self.discarded: list[str] = []

    def adopt(self) -> dict[str, tuple[str, float, float | None]]:
        return dict(self.runs)

    def track(self, job_id: str) -> None:
        self.jobs.add(job_id)

    def stop(self, job_id: str) -> bool:
        self.stopped.append(job_id)
        return job_id in self.jobs

    def discard(self, job_id: str) -> None:
        self.discarded.append(job_id)


def _job(store: Store, job_id: str, *path: JobState, run_id: str | None = None, **changes: Any) -> None:
    store.add(JobRecord(job_id=job_id, name=job_id, spec=b""))
    for to in path:
        store.transition(job_id, to, **(dict(run_id=run_id, allocation=[["n1", 1]], **changes)
                                        if to is JobState.RUNNING else {}))


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("TIDAL_STORAGE", str(tmp_path / "runs"))  # no run left a checkpoint there
    return Store(tmp_path / "tidal.sqlite")


def _tracker(store: Store, host: HostTable, tmp_path: Path) -> tuple[RunTracker, list[str]]:
    notes: list[str] = []
    tracker = RunTracker(store, host, SchedulerConfig(), Curves(tmp_path / "curves"),  # type: ignore[arg-type]
                         Recorder(notes.append), notes.append, lambda r: None)  # type: ignore[arg-type,return-value]
    return tracker, notes


def test_live_runs_are_adopted_as_they_are(store: Store, tmp_path: Path) -> None:
    _job(store, "a", JobState.QUEUED, JobState.RUNNING, run_id="a-r0")
    _job(store, "b", JobState.QUEUED, JobState.RUNNING, JobState.STOPPING, run_id="b-r2", restarts=2)
    host = HostTable({"a": ("a-r0", 100.0, None), "b": ("b-r2", 90.0, 140.0)})
    tracker, notes = _tracker(store, host, tmp_path)
    tracker.recover()
    assert host.jobs == {"a", "b"} and not host.discarded
    assert store.get("a").state is JobState.RUNNING and store.get("b").state is JobState.STOPPING
    assert [e.to_state for e in store.events("a")] == ["PROFILING", "QUEUED", "RUNNING"]  # nothing written
    # the policy sees how long each has run, from its launch by the predecessor
    assert tracker.running_s("a", now=160.0) == 60.0 and tracker.running_s("b", now=160.0) == 70.0
    # a stopping run stays asked to stop (again: the predecessor may have died before it asked)
    assert host.stopped == ["b"] and tracker.stopping("b") and not tracker.stopping("a")
    assert tracker.records["b"].stop_asked_at == 140.0  # its stop's measured cost starts then
    assert "scheduler restarted: adopted a's run a-r0 (RUNNING, step 0)" in notes, notes


def test_lost_runs_are_requeued_and_unknown_ones_stopped(store: Store, tmp_path: Path) -> None:
    _job(store, "gone", JobState.QUEUED, JobState.RUNNING, run_id="gone-r0")
    _job(store, "other", JobState.QUEUED, JobState.RUNNING, run_id="other-r1", restarts=1)
    _job(store, "queued", JobState.QUEUED)
    host = HostTable({"other": ("other-r0", 10.0, None),  # an older run of the job: not the record's
                      "queued": ("queued-r0", 20.0, None)})  # launched, its launch never recorded
    tracker, notes = _tracker(store, host, tmp_path)
    tracker.recover()
    for jid, restarts in (("gone", 1), ("other", 2)):
        r = store.get(jid)
        assert r.state is JobState.QUEUED and r.restarts == restarts and r.allocation is None, r
    assert any(n.startswith("gone scheduler restarted: run gone-r0 lost") for n in notes), notes
    assert not host.jobs and sorted(host.discarded) == ["other", "queued"]
    assert store.get("queued").state is JobState.QUEUED
    assert any("queued: run queued-r0 is not in the state file; stopped" in n for n in notes), notes


def test_a_cancel_asked_before_the_run_was_lost_ends_the_job(store: Store, tmp_path: Path) -> None:
    _job(store, "c", JobState.QUEUED, JobState.RUNNING, JobState.STOPPING, run_id="c-r0")
    store.update("c", cancel_requested=True)
    tracker, _ = _tracker(store, HostTable({}), tmp_path)
    tracker.recover()
    assert store.get("c").state is JobState.CANCELLED
