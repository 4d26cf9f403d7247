"""The scheduler's durable job store: survives reopening, enforces the state machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.platform.store import JobRecord, JobState, Store, TransitionError


def test_records_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state" / "tidal.sqlite"
    s = Store(path)
    s.add(JobRecord(job_id="a", name="A", spec=b"\x00spec", submitted=1.0))
    s.add(JobRecord(job_id="b", name="B", spec=b"spec-b", submitted=2.0))
    s.update("a", state=JobState.RUNNING, plan={"dp": 2}, allocation=[["n1", 2]], run_id="a-1")
    again = Store(path)  # a restarted scheduler opens the same file
    a = again.get("a")
    assert a.state is JobState.RUNNING and a.plan == {"dp": 2} and a.allocation == [["n1", 2]]
    assert a.spec == b"\x00spec" and a.run_id == "a-1"
    assert [r.job_id for r in again.all()] == ["a", "b"]
    with pytest.raises(KeyError):
        again.get("zzz")


def test_state_machine_is_enforced(tmp_path: Path) -> None:
    s = Store(tmp_path / "t.sqlite")
    s.add(JobRecord(job_id="a", name="A", spec=b""))
    s.update("a", state=JobState.RUNNING)
    s.update("a", state=JobState.STOPPING)
    s.update("a", state=JobState.QUEUED)
    s.update("a", state=JobState.RUNNING)
    s.update("a", state=JobState.SUCCEEDED)
    assert s.get("a").state.terminal
    with pytest.raises(TransitionError, match="SUCCEEDED → RUNNING"):
        s.update("a", state=JobState.RUNNING)
    assert s.get("a").state is JobState.SUCCEEDED  # the refused change wrote nothing
