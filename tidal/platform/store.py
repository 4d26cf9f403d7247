"""Durable job state for the scheduler actor: one SQLite file.

The scheduler actor runs with `max_restarts=-1`; everything it must not forget lives here, so
a restarted actor finds every job: its spec (cloudpickled), state, plan and allocation, the
run it launched (so the run's newest checkpoint can be found in storage), its restarts and its
error. Writes are transactions; the file survives the actor, the driver and the Ray session
(it lives under a configured directory, `$TIDAL_STATE`, default `~/.cache/tidal/state`).

Job states form an explicit machine (`JobState`); `Store.transition` refuses a move the
machine does not allow, so a bug cannot silently resurrect a finished job:

    QUEUED → RUNNING → (STOPPING → QUEUED) … → SUCCEEDED | FAILED
    QUEUED | RUNNING | STOPPING → CANCELLED
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any


class JobState(str, Enum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"  # asked to checkpoint and stop (reconfiguration or cancel)
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset({JobState.STOPPING, JobState.SUCCEEDED, JobState.FAILED,
                                 JobState.CANCELLED, JobState.QUEUED}),
    JobState.STOPPING: frozenset({JobState.QUEUED, JobState.SUCCEEDED, JobState.FAILED,
                                  JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def state_dir() -> Path:
    return Path(os.environ.get("TIDAL_STATE", Path.home() / ".cache" / "tidal" / "state"))


@dataclass(frozen=True, kw_only=True)
class JobRecord:
    job_id: str
    name: str
    spec: bytes  # cloudpickled JobSpec
    state: JobState = JobState.QUEUED
    submitted: float = field(default_factory=time.time)
    options: bytes = b""  # pickled planner options (resource matrix)
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


_COLUMNS = [f.name for f in fields(JobRecord)]
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM jobs"
_INSERT = f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
_JSON = {"plan", "allocation"}


class TransitionError(RuntimeError):
    """A state change the job state machine does not allow."""


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, name TEXT, spec BLOB, state TEXT,"
            " submitted REAL, options BLOB, plan TEXT, allocation TEXT, run_id TEXT, checkpoint TEXT,"
            " step INTEGER, restarts INTEGER, predicted_sps REAL, measured_sps REAL, error TEXT,"
            " finished REAL)"
        )

    def _row(self, rec: JobRecord) -> list[Any]:
        out = []
        for c in _COLUMNS:
            v = getattr(rec, c)
            out.append(json.dumps(v) if c in _JSON and v is not None else (v.value if c == "state" else v))
        return out

    def _record(self, row: tuple[Any, ...]) -> JobRecord:
        d = dict(zip(_COLUMNS, row, strict=True))
        for c in _JSON:
            d[c] = json.loads(d[c]) if d[c] is not None else None
        d["state"] = JobState(d["state"])
        return JobRecord(**d)

    def add(self, rec: JobRecord) -> None:
        with self._lock:
            self._db.execute(_INSERT, self._row(rec))

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
        """Change fields of a job (a state change must be one the machine allows)."""
        with self._lock:
            row = self._db.execute(f"{_SELECT} WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise KeyError(f"no job {job_id!r}")
            old = self._record(row)
            new = replace(old, **changes)
            if new.state != old.state and new.state not in ALLOWED[old.state]:
                raise TransitionError(f"job {job_id}: {old.state.value} → {new.state.value} is not allowed")
            sets = ", ".join(f"{c} = ?" for c in _COLUMNS if c != "job_id")
            self._db.execute(f"UPDATE jobs SET {sets} WHERE job_id = ?",
                             [*self._row(new)[1:], job_id])
        return new
