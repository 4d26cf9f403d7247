"""The scheduler's durable job store: survives reopening, enforces the one state machine, and
records every state change as an event."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tidal.core.policy import Option
from tidal.jobs.spec import Plan
from tidal.platform.store import JobRecord, JobState, Store, StoreWriteError, TransitionError


def test_records_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state" / "tidal.sqlite"
    s = Store(path)
    s.add(JobRecord(job_id="a", name="A", spec=b"\x00spec", submitted=1.0))
    s.add(JobRecord(job_id="b", name="B", spec=b"spec-b", submitted=2.0))
    opts = (Option(gpus=1, plan=Plan(dp=1, micro_batch=4), samples_per_s=10.0, cpus_per_gpu=1.0),
            Option(gpus=2, plan=Plan(dp=2, zero_stage=2, micro_batch=2), samples_per_s=18.5))
    s.transition("a", JobState.QUEUED, "planned", options=opts, guarantee=9.5)
    s.transition("a", JobState.RUNNING, plan={"dp": 2}, allocation=[["n1", 2]], run_id="a-1")
    s.update("a", sps_ratios=[[1, 0.5], [2, 0.25]])
    again = Store(path)  # a restarted scheduler opens the same file
    a = again.get("a")
    assert a.state is JobState.RUNNING and a.plan == {"dp": 2} and a.allocation == [["n1", 2]]
    assert a.spec == b"\x00spec" and a.run_id == "a-1"
    assert a.options == opts and a.guarantee == 9.5  # stored as JSON, read back equal
    assert a.sps_ratios == [[1, 0.5], [2, 0.25]] and again.get("b").sps_ratios == []
    assert again.get("b").state is JobState.PROFILING and again.get("b").options == ()
    assert [r.job_id for r in again.all()] == ["a", "b"]
    with pytest.raises(KeyError):
        again.get("zzz")


def test_measurements_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    s = Store(path)
    assert s.measured("restart_cost") is None
    s.set_measured("restart_cost", {"starts": [51.5, 48.0], "stops": [3.0]})
    s.set_measured("restart_cost", {"starts": [51.5, 48.0, 60.25], "stops": [3.0]})  # replaces
    assert Store(path).measured("restart_cost") == {"starts": [51.5, 48.0, 60.25], "stops": [3.0]}


def test_state_machine_is_enforced(tmp_path: Path) -> None:
    s = Store(tmp_path / "t.sqlite")
    s.add(JobRecord(job_id="a", name="A", spec=b""))
    with pytest.raises(TransitionError, match="PROFILING → RUNNING"):  # not planned yet
        s.transition("a", JobState.RUNNING)
    for to in (JobState.QUEUED, JobState.RUNNING, JobState.STOPPING, JobState.QUEUED, JobState.RUNNING,
               JobState.SUCCEEDED):
        s.transition("a", to)
    assert s.get("a").state.terminal
    with pytest.raises(TransitionError, match="SUCCEEDED → RUNNING"):
        s.transition("a", JobState.RUNNING, step=99)
    assert s.get("a").state is JobState.SUCCEEDED and s.get("a").step == 0  # the refused move wrote nothing
    with pytest.raises(TypeError, match=r"use Store\.transition"):
        s.update("a", state=JobState.QUEUED)
    s.add(JobRecord(job_id="r", name="R", spec=b""))
    s.transition("r", JobState.REJECTED, "fits no plan", error="fits no plan")
    with pytest.raises(TransitionError):
        s.transition("r", JobState.QUEUED)


def test_every_change_of_state_is_an_event(tmp_path: Path) -> None:
    s = Store(tmp_path / "t.sqlite")
    s.add(JobRecord(job_id="a", name="A", spec=b""), "submitted by test")
    s.transition("a", JobState.QUEUED, "planned in 3.0 s")
    s.update("a", step=5)  # not a state change: no event
    s.transition("a", JobState.CANCELLED, "cancelled while queued")
    ev = Store(tmp_path / "t.sqlite").events("a")
    assert [(e.from_state, e.to_state, e.note) for e in ev] == [
        (None, "PROFILING", "submitted by test"), ("PROFILING", "QUEUED", "planned in 3.0 s"),
        ("QUEUED", "CANCELLED", "cancelled while queued")]
    assert ev[0].t <= ev[1].t <= ev[2].t
    with pytest.raises(KeyError, match="no job 'b'"):
        s.events("b")


def test_a_file_that_is_not_a_state_file_is_refused_with_one_line(tmp_path: Path) -> None:
    stray = tmp_path / "tidal.sqlite"
    stray.write_text("not a database, just some text a user left here\n" * 50)
    with pytest.raises(RuntimeError, match=r"tidal\.sqlite is not a Tidal state file \(file is not a "
                                           r"database\): move it away or point \$TIDAL_STATE elsewhere"):
        Store(stray)
    assert stray.read_text().startswith("not a database")  # left as it was
    with pytest.raises(RuntimeError, match="is not a Tidal state file"):
        Store(tmp_path)  # a directory


def test_a_state_file_of_another_schema_is_refused_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, options BLOB)")
    db.commit()
    db.close()
    with pytest.raises(RuntimeError, match="schema 0, this Tidal reads 3: move it away"):
        Store(path)


def test_a_schema_2_state_file_is_migrated_keeping_its_jobs_and_ratios(tmp_path: Path) -> None:
    """Schema 2 kept one correction ratio a job; schema 3 one a GPU count. Opening a schema-2
    file migrates it in place: every job is kept, a job's ratio becomes that of the count it
    holds (or of its smallest option), and the file then reads as schema 3."""
    path = tmp_path / "v2.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT, spec BLOB, state TEXT,"
               " submitted REAL, options TEXT, guarantee REAL, plan TEXT, allocation TEXT, run_id TEXT,"
               " checkpoint TEXT, step INTEGER, restarts INTEGER, predicted_sps REAL, measured_sps REAL,"
               " error TEXT, finished REAL, cancel_requested INTEGER, sps_ratio REAL)")
    db.execute("CREATE TABLE events (t REAL, job_id TEXT, from_state TEXT, to_state TEXT, note TEXT)")
    opts = '[{"gpus": 2, "plan": {"dp": 2, "micro_batch": 4}, "samples_per_s": 10.0}]'
    rows = [("run", "RUNNING", opts, '[["n1", 4]]', 0.5), ("wait", "QUEUED", opts, None, 2.0),
            ("new", "QUEUED", opts, None, 1.0)]
    for jid, state, o, alloc, ratio in rows:
        db.execute("INSERT INTO jobs (job_id, name, spec, state, submitted, options, allocation, step,"
                   " restarts, predicted_sps, measured_sps, cancel_requested, sps_ratio)"
                   " VALUES (?, ?, ?, ?, 1.0, ?, ?, 7, 0, 0, 0, 0, ?)",
                   (jid, jid, b"s", state, o, alloc, ratio))
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    s = Store(path)
    assert s.get("run").sps_ratios == [[4, 0.5]] and s.get("run").step == 7
    assert s.get("wait").sps_ratios == [[2, 2.0]] and s.get("new").sps_ratios == []
    s.update("new", sps_ratios=[[2, 0.9]])
    assert Store(path).get("new").sps_ratios == [[2, 0.9]]  # reopened: now schema 3, no migration
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 3


@pytest.mark.parametrize("trouble", ["full", "locked"])
def test_a_refused_write_changes_nothing_and_the_next_one_works(tmp_path: Path, trouble: str) -> None:
    """The disk full (SQLite's own page limit, the error a full disk gives) or the file locked by
    another process (someone's `sqlite3` shell in a transaction, past the 5-s busy timeout): the
    write raises one StoreWriteError naming the file and what SQLite said, nothing of it is
    stored, and once the trouble is gone the next write works. A lock left SQLite's transaction
    open: before, every later write failed with `cannot start a transaction within a
    transaction` until the actor restarted."""
    path = tmp_path / "tidal.sqlite"
    s = Store(path)
    s.add(JobRecord(job_id="a", name="A", spec=b"spec", state=JobState.QUEUED))
    other = sqlite3.connect(path, isolation_level=None)
    if trouble == "full":
        s._db.execute(f"PRAGMA max_page_count = {s._db.execute('PRAGMA page_count').fetchone()[0]}")
        note, said = "n" * 100_000, "database or disk is full"
    else:
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        note, said = "launched", "database is locked"
    with pytest.raises(OSError) as e:
        s.transition("a", JobState.RUNNING, note, run_id="a-r0")
    assert isinstance(e.value, StoreWriteError)
    assert str(e.value).startswith(f"the Tidal state file {path} could not be written")
    assert said in str(e.value)
    with pytest.raises(StoreWriteError):
        s.add(JobRecord(job_id="b", name="B", spec=note.encode()))
    assert s.get("a").state is JobState.QUEUED and s.get("a").run_id is None
    assert [x.to_state for x in s.events("a")] == ["QUEUED"] and [r.job_id for r in s.all()] == ["a"]
    if trouble == "full":
        s._db.execute("PRAGMA max_page_count = 1073741823")
    else:
        other.execute("ROLLBACK")
    s.transition("a", JobState.RUNNING, "launched", run_id="a-r0")
    s.set_measured("k", [1.0])
    assert s.get("a").state is JobState.RUNNING and Store(path).get("a").run_id == "a-r0"
