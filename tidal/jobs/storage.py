"""Where runs keep their checkpoints, and where a job resumes from.

Runs write under `storage_root()` (`$TIDAL_STORAGE`, default `~/.cache/tidal/runs`; a
multi-node cluster needs it on a filesystem every node mounts). A checkpoint's meta carries two
positions: the data position (`step`) and the compute steps its budget has spent
(`compute_steps`); they differ only for AutoLRS jobs, whose probe steps count against the budget
but do not advance the data.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from tidal.jobs.spec import JobSpec, SpecError


def storage_root() -> Path:
    return Path(os.environ.get("TIDAL_STORAGE", Path.home() / ".cache" / "tidal" / "runs"))


class StorageError(ValueError):
    """The runs' storage cannot hold checkpoints (one line naming it)."""


def check_storage() -> Path:
    """`storage_root()`, created if missing, once it is known to be a directory this process can
    write: StorageError naming it otherwise. The scheduler checks it when a job is submitted, so a
    storage that is a file, read-only or on a missing mount refuses the job before anything runs,
    not when its first run launches."""
    root = storage_root()
    what = f"$TIDAL_STORAGE {root}" if "TIDAL_STORAGE" in os.environ else f"storage {root}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".tidal-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        why = "not a directory" if root.exists() and not root.is_dir() else (e.strerror or str(e)).lower()
        raise StorageError(f"{what} cannot hold checkpoints ({why}): it must be a writable "
                           "directory (on a multi-node cluster, one every node mounts)") from None
    return root


def checkpoint_progress(checkpoint: str) -> tuple[int, int]:
    """(data position, compute steps) of a checkpoint; they differ only for AutoLRS jobs, whose
    probe steps count against the budget but do not advance the data."""
    from tidal.jobs.checkpoint import read_meta

    return progress(read_meta(checkpoint))


def progress(meta: dict[str, Any]) -> tuple[int, int]:
    """(data position, compute steps) of a checkpoint's meta."""
    return int(meta["step"]), int(meta.get("compute_steps", meta["step"]))


def checkpoint_done(spec: JobSpec, checkpoint: str | None) -> bool:
    """Whether `checkpoint` holds the whole job: its compute steps reach `spec.total_steps` (a run
    killed after its last checkpoint, before it reported, has nothing left to run)."""
    return checkpoint is not None and checkpoint_progress(checkpoint)[1] >= spec.total_steps


def resume_point(spec: JobSpec) -> tuple[str, int] | None:
    """Where a job with `JobSpec.resume_from` starts: the checkpoint's absolute path and its data
    position; None for a job without one. A SpecError naming `JobSpec.resume_from` when it is not
    a directory, not a Tidal checkpoint, half-written (`read_complete_meta`), or already holds
    the whole job (`checkpoint_done`). Read where the runs will read it (the scheduler actor):
    the storage of a cluster need not be mounted where the job was written."""
    if spec.resume_from is None:
        return None
    from tidal.jobs.checkpoint import FORMAT, CheckpointError, read_complete_meta

    path = Path(spec.resume_from).expanduser().resolve()
    if not path.is_dir():
        raise SpecError("JobSpec.resume_from", f"{path} is not a directory")
    try:
        meta = read_complete_meta(path)
        if meta.get("format") != FORMAT:
            raise ValueError(f"its format is {meta.get('format')!r}, not {FORMAT!r}")
        step, compute = progress(meta)
    except (CheckpointError, OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError("JobSpec.resume_from", f"{path} is not a complete Tidal checkpoint: {e}") from None
    if compute >= spec.total_steps:
        raise SpecError("JobSpec.resume_from", f"{path} is at step {compute}: total_steps "
                                               f"({spec.total_steps}) leaves nothing to train")
    return str(path), step
