"""Durable job state for the scheduler actor: one SQLite file.

The scheduler actor runs with `max_restarts=-1`; everything it must not forget lives here, so
a restarted actor finds every job: its spec (cloudpickled), state, plan and allocation, the
run it launched (so the run's newest checkpoint can be found in storage), its restarts and its
error. Writes are transactions; the file survives the actor, the driver and the Ray session
(it lives under a configured directory, `$TIDAL_STATE`, default `~/.cache/tidal/state`).

Job states form one explicit machine (`tidal.core.state.JobState`, `ALLOWED`). Every change
of state goes through `Store.transition`, which refuses a move the machine does not allow (a
bug cannot silently resurrect a finished job) and writes an event row in the same transaction:
`Store.events(job)` is the job's history (`tidal events JOB`). `Store.update` changes fields
only, never the state. The resource matrix is stored as JSON, not pickled; the spec is the one
cloudpickled column (a user's model factory and dataset are code).

Besides jobs the store keeps what the scheduler measured of the cluster itself (`Store.measured`,
`Store.set_measured`: one JSON value per key; the restart cost's samples,
`tidal.core.restarts`), so a restarted actor prices its decisions as its predecessor did.

A write the file cannot take (its disk full, a lock someone else holds past SQLite's 5-s busy
timeout, a read-only mount) is rolled back whole and raised as `StoreWriteError` (an `OSError`)
naming the file: nothing half-written, and the caller decides what to keep for later
(`tidal.platform.scheduler` retries what records the cluster's own doings).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tidal.core.policy import Option
from tidal.core.state import ALLOWED, JobState

__all__ = ["Event", "JobRecord", "JobState", "Store", "StoreWriteError", "TransitionError", "state_dir"]
# PRAGMA user_version; 2: PROFILING/REJECTED, events, options as JSON; 3: the online correction's
# ratio per GPU count (`sps_ratios`; a schema-2 file is migrated in place, its job-wide ratio
# becoming the ratio of the count the job runs on)
SCHEMA_VERSION = 3


def state_dir() -> Path:
    return Path(os.environ.get("TIDAL_STATE", Path.home() / ".cache" / "tidal" / "state"))


@dataclass(frozen=True, kw_only=True)
class JobRecord:
    job_id: str
    name: str
    spec: bytes  # cloudpickled JobSpec
    state: JobState = JobState.PROFILING
    submitted: float = field(default_factory=time.time)
    options: tuple[Option, ...] = ()  # the resource matrix, once planned
    guarantee: float | None = None  # a guaranteed job's samples/s on what it asked for
    plan: dict[str, Any] | None = None
    allocation: list[list[Any]] | None = None  # [[node_id, gpus], ...]
    run_id: str | None = None
    checkpoint: str | None = None
    step: int = 0
    restarts: int = 0
    predicted_sps: float = 0.0
    measured_sps: float = 0.0
    error: str | None = None
    finished: float | None = None
    cancel_requested: bool = False  # a cancel reached a running job: it ends CANCELLED when it stops
    # measured ÷ predicted samples/s per GPU count, smoothed: [[gpus, ratio], ...] ascending
    # (`tidal.core.correction.Correction.ratios`)
    sps_ratios: list[list[float]] = field(default_factory=list)


_COLUMNS = [f.name for f in fields(JobRecord)]
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM jobs"
_INSERT = f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
_JSON = {"plan", "allocation", "sps_ratios"}


@dataclass(frozen=True, kw_only=True)
class Event:
    """One state change of a job: when, from what (None: submitted), to what, and why."""

    t: float
    job_id: str
    from_state: str | None
    to_state: str
    note: str


class TransitionError(RuntimeError):
    """A state change the job state machine does not allow."""


class StoreWriteError(OSError):
    """The state file could not take a write (full, locked, read-only); nothing was written."""


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as e:  # not SQLite (a stray file), unreadable, or a directory
            raise RuntimeError(f"{self.path} is not a Tidal state file ({e}): move it away or point "
                               "$TIDAL_STATE elsewhere") from None
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "jobs" in tables and version == 2:
            self._migrate_2_to_3()
            version = SCHEMA_VERSION
        if "jobs" in tables and version != SCHEMA_VERSION:
            raise RuntimeError(f"{self.path} holds Tidal state of schema {version}, this Tidal reads "
                               f"{SCHEMA_VERSION}: move it away or point $TIDAL_STATE elsewhere")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, name TEXT, spec BLOB, state TEXT,"
            " submitted REAL, options TEXT, guarantee REAL, plan TEXT, allocation TEXT, run_id TEXT,"
            " checkpoint TEXT, step INTEGER, restarts INTEGER, predicted_sps REAL, measured_sps REAL,"
            " error TEXT, finished REAL, cancel_requested INTEGER, sps_ratios TEXT)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS events (t REAL, job_id TEXT, from_state TEXT,"
                         " to_state TEXT, note TEXT)")
        self._db.execute("CREATE INDEX IF NOT EXISTS events_job ON events (job_id, t)")
        # added within schema 3: a file without it gets it here, and older code ignores it
        self._db.execute("CREATE TABLE IF NOT EXISTS measured (key TEXT PRIMARY KEY, value TEXT)")
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _migrate_2_to_3(self) -> None:
        """Schema 2 kept one ratio a job (`sps_ratio`): it becomes the ratio of the GPU count the
        job holds (or of its smallest option), which `Correction.ratio` applies to every count
        until the job is measured on another (above it, no higher than 1)."""
        self._db.execute("BEGIN")
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(jobs)")}
        if "sps_ratios" not in columns:
            self._db.execute("ALTER TABLE jobs ADD COLUMN sps_ratios TEXT")
        old = "sps_ratio" if "sps_ratio" in columns else "NULL"  # early schema-2 files had none
        for job_id, ratio, allocation, options in self._db.execute(
                f"SELECT job_id, {old}, allocation, options FROM jobs").fetchall():
            if ratio is None or ratio == 1.0:
                continue
            held = sum(g for _, g in json.loads(allocation)) if allocation else 0
            counts = [o["gpus"] for o in json.loads(options or "[]")]
            gpus = held or (counts[0] if counts else 1)
            self._db.execute("UPDATE jobs SET sps_ratios = ? WHERE job_id = ?",
                             (json.dumps([[gpus, ratio]]), job_id))
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self._db.execute("COMMIT")

    def _row(self, rec: JobRecord) -> list[Any]:
        out = []
        for c in _COLUMNS:
            v = getattr(rec, c)
            if c == "options":
                out.append(json.dumps([o.to_dict() for o in v]))
            elif c == "state":
                out.append(v.value)
            else:
                out.append(json.dumps(v) if c in _JSON and v is not None else v)
        return out

    def _record(self, row: tuple[Any, ...]) -> JobRecord:
        d = dict(zip(_COLUMNS, row, strict=True))
        for c in _JSON:
            d[c] = json.loads(d[c]) if d[c] is not None else None
        d["sps_ratios"] = d["sps_ratios"] or []
        d["state"] = JobState(d["state"])
        d["cancel_requested"] = bool(d["cancel_requested"])
        d["options"] = tuple(Option.from_dict(o) for o in json.loads(d["options"] or "[]"))
        return JobRecord(**d)

    def add(self, rec: JobRecord, note: str = "submitted") -> None:
        with self._lock, self._writing():
            self._db.execute("BEGIN")
            self._db.execute(_INSERT, self._row(rec))
            self._db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                             (time.time(), rec.job_id, None, rec.state.value, note))
            self._db.execute("COMMIT")

    def get(self, job_id: str) -> JobRecord:
        with self._lock:
            row = self._db.execute(f"{_SELECT} WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise KeyError(f"no job {job_id!r}")
        return self._record(row)

    def all(self) -> list[JobRecord]:
        with self._lock:
            rows = self._db.execute(f"{_SELECT} ORDER BY submitted, job_id").fetchall()
        return [self._record(r) for r in rows]

    def update(self, job_id: str, **changes: Any) -> JobRecord:
        """Change fields of a job other than its state (that is `transition`'s)."""
        if "state" in changes:
            raise TypeError("Store.update does not change a job's state: use Store.transition")
        return self._write(job_id, None, "", changes)

    def transition(self, job_id: str, to: JobState, note: str = "", **changes: Any) -> JobRecord:
        """Move a job to state `to` (a move `ALLOWED` permits, else TransitionError and nothing is
        written), changing `changes` and recording an event with `note`, in one transaction."""
        return self._write(job_id, to, note, changes)

    def _write(self, job_id: str, to: JobState | None, note: str, changes: dict[str, Any]) -> JobRecord:
        with self._lock:
            row = self._db.execute(f"{_SELECT} WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise KeyError(f"no job {job_id!r}")
            old = self._record(row)
            if to is not None and to not in ALLOWED[old.state]:
                raise TransitionError(f"job {job_id}: {old.state.value} → {to.value} is not allowed")
            new = replace(old, **changes)
            if to is not None:
                new = replace(new, state=to)
            sets = ", ".join(f"{c} = ?" for c in _COLUMNS if c != "job_id")
            with self._writing():
                self._db.execute("BEGIN")
                self._db.execute(f"UPDATE jobs SET {sets} WHERE job_id = ?", [*self._row(new)[1:], job_id])
                if to is not None:
                    self._db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                                     (time.time(), job_id, old.state.value, to.value, note))
                self._db.execute("COMMIT")
        return new

    def events(self, job_id: str) -> list[Event]:
        """The job's state changes, oldest first (KeyError for an unknown job)."""
        with self._lock:
            if self._db.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)).fetchone() is None:
                raise KeyError(f"no job {job_id!r}")
            rows = self._db.execute("SELECT t, job_id, from_state, to_state, note FROM events "
                                    "WHERE job_id = ? ORDER BY t, rowid", (job_id,)).fetchall()
        return [Event(t=t, job_id=j, from_state=f, to_state=to, note=n) for t, j, f, to, n in rows]

    def measured(self, key: str) -> Any:
        """The value last stored under `key` by `set_measured` (None if none was)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM measured WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set_measured(self, key: str, value: Any) -> None:
        """Store `value` (anything JSON can hold) under `key`, replacing what was there."""
        with self._lock, self._writing():
            self._db.execute("INSERT OR REPLACE INTO measured VALUES (?, ?)", (key, json.dumps(value)))

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """One write: the file's refusal (SQLite's OperationalError: full, locked, read-only, I/O)
        rolled back (SQLite leaves the transaction open after some, a lock held elsewhere among
        them) and raised as a StoreWriteError naming the file. A constraint the write breaks (an
        IntegrityError: a job id stored twice) is a bug, not the file's, and stays itself."""
        try:
            yield
        except sqlite3.Error as e:
            if self._db.in_transaction:  # either way: an open transaction fails every later BEGIN
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            if not isinstance(e, sqlite3.OperationalError):
                raise
            raise StoreWriteError(f"the Tidal state file {self.path} could not be written "
                                  f"({type(e).__name__}: {e}); nothing was changed") from None
