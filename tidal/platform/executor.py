"""The executor: the only part of the control plane that starts and stops runs.

It launches a job's run (a Ray Train `TorchTrainer` of DeepSpeed workers, `tidal.jobs.runner`)
on exactly the nodes a decision names, asks runs to stop at their next step boundary with a
checkpoint, and hands the scheduler every run that ended (`collect`) with how it ended. It also
finds a lost run's newest complete checkpoint in storage and tells a fault of the cluster from
the job's own error; what becomes of the job is the scheduler's call (`tidal.core.state`).
"""

from __future__ import annotations

import glob
import re
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.core.policy import Allocation
from tidal.jobs.checkpoint import read_complete_meta, read_metrics
from tidal.jobs.runner import Resources, RunHandle, RunResult, launch
from tidal.jobs.spec import JobSpec
from tidal.jobs.storage import storage_root

# What an infrastructure failure looks like from a run's error: a dead worker, node or actor, or
# a collective torn down under a surviving worker (gloo/NCCL). Anything else — the job's loss or
# model raising, a non-finite loss (tidal.jobs.worker.NonFiniteLoss) — is the job's own error.
_INFRA_TYPES = ("ActorDiedError", "RayActorError", "WorkerCrashedError", "NodeDiedError",
                "ActorUnavailableError", "OwnerDiedError", "ObjectLostError", "RaySystemError",
                "RunHung")
# The storage failing under a checkpoint is the cluster's too: the job resumes from its newest
# complete checkpoint (measured: a full disk FAILED a job at its third checkpoint, the two before
# it complete; a job cannot be resumed once FAILED).
_INFRA_TEXT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL error",
               "ProcessGroupNCCL", "ProcessGroupGloo", "The actor died", "worker died",
               "node died", "SYSTEM_ERROR", "Socket Timeout",
               "No space left on device", "Disk quota exceeded", "Read-only file system",
               "Stale file handle")


def infrastructure_failure(error: BaseException) -> bool:
    """True if a run failed for the cluster's reason, not the job's (see the markers above). The
    job's own error wins when both appear: a NonFiniteLoss is never retried."""
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in chain and len(chain) < 10:
        chain.append(e)
        e = getattr(e, "cause", None) or e.__cause__ or e.__context__
    text = " ".join(f"{type(x).__name__}: {x}" for x in chain)
    if "NonFiniteLoss" in text or "non-finite loss" in text:
        return False
    return any(t in text for t in _INFRA_TYPES) or any(t in text for t in _INFRA_TEXT)


def run_checkpoints(run_id: str | None) -> tuple[str | None, int, list[dict[str, Any]]]:
    """A lost run's newest complete checkpoint, its step, and the metrics of the steps up to it
    (each checkpoint's rows, a later one's winning a step: the newest holds the run's so far)."""
    if not run_id:
        return None, 0, []
    root = storage_root() / run_id
    best: tuple[str | None, int] = (None, 0)
    metrics: dict[int, dict[str, Any]] = {}
    for d in sorted(root.glob("step_*")) if root.exists() else []:
        try:
            step = int(read_complete_meta(d)["step"])
            metrics_of_d = read_metrics(d)
        except Exception:  # a half-written checkpoint: skip it
            continue
        metrics.update((int(m["step"]), m) for m in metrics_of_d)
        if step >= best[1]:
            best = (str(d), step)
    return best[0], best[1], [metrics[k] for k in sorted(metrics) if k <= best[1]]


def prune_runs(job_id: str, run_id: str | None, checkpoint: str | None) -> list[str]:
    """Remove job `job_id`'s earlier runs from storage: the `<job_id>-r<k>` directories under
    `storage_root()` of runs before its latest run `run_id` (`<job_id>-r<n>`, k < n; the scheduler
    numbers a job's runs in launch order), but the one holding `checkpoint`, the job's own (what it
    resumes from, or its result). The latest run's directory stays whatever its state (a FAILED
    job's checkpoints are its user's), and so does anything else. Returns the names removed; one
    that cannot be removed is left, and tried again at the job's next change."""
    own = re.compile(rf"{re.escape(job_id)}-r(\d+)")
    latest = own.fullmatch(run_id or "")
    root = storage_root()
    if latest is None or not root.is_dir():
        return []
    held = Path(checkpoint).resolve() if checkpoint else None
    removed = []
    for d in root.glob(f"{glob.escape(job_id)}-r*"):
        m = own.fullmatch(d.name)
        if m is None or int(m[1]) >= int(latest[1]) or d.is_symlink() or not d.is_dir():
            continue
        if held is not None and held.is_relative_to(d.resolve()):
            continue
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(d.name)
    return sorted(removed)


def checkpoint_owner(checkpoint: str) -> str | None:
    """The job whose run wrote `checkpoint`: `<job_id>` for a checkpoint under
    `storage_root()/<job_id>-r<k>/` (the layout `prune_runs` keeps); None for one elsewhere."""
    try:
        rel = Path(checkpoint).resolve().relative_to(storage_root().resolve())
    except ValueError:
        return None
    m = re.fullmatch(r"(.+)-r\d+", rel.parts[0]) if rel.parts else None
    return m[1] if m else None


@dataclass(frozen=True, kw_only=True)
class Ended:
    """A run that ended: its result, or the error it ended with and what it reported before."""

    job_id: str
    result: RunResult | None
    error: Exception | None
    history: list[dict[str, Any]] = field(default_factory=list)  # with `error`: the steps it ran


class Executor:
    def __init__(self, *, cpus_per_worker: float, max_failures: int, release_grace_s: float) -> None:
        self.cpus_per_worker = cpus_per_worker
        self.max_failures = max_failures  # Ray Train restarts a crashed worker group this often
        self.release_grace_s = release_grace_s
        self.handles: dict[str, RunHandle] = {}
        # (time, GPUs per node) of runs that just ended: Ray frees a placement group a little later
        self.released: deque[tuple[float, tuple[tuple[str, int], ...]]] = deque(maxlen=1000)

    def launch(self, job_id: str, spec: JobSpec, alloc: Allocation, checkpoint: str | None,
               run_id: str) -> None:
        """Start the job's run of `alloc.plan` with one worker per GPU, worker i on the i-th GPU's
        node (`Resources.node_ids`), from `checkpoint`."""
        node_ids = tuple(n for n, g in alloc.gpus_by_node for _ in range(g))
        res = Resources(num_workers=alloc.plan.dp, gpus_per_worker=1, cpus_per_worker=self.cpus_per_worker,
                        node_ids=node_ids)
        self.handles[job_id] = launch(spec, alloc.plan, res, checkpoint, run_id=run_id,
                                      max_failures=self.max_failures, job_key=job_id)

    def stop(self, job_id: str) -> bool:
        """Ask the job's run to stop at its next step boundary with a checkpoint; False if it has
        no run here."""
        h = self.handles.get(job_id)
        if h is not None:
            h.stop()
        return h is not None

    def has_run(self, job_id: str) -> bool:
        return job_id in self.handles

    def registered(self, job_id: str) -> bool:
        """Whether the job's run has registered its workers with Ray's autoscaling coordinator
        (`tidal.core.autoscale`); False if it has no run here."""
        h = self.handles.get(job_id)
        return h is not None and h.registered()

    def quiet_s(self, job_id: str) -> float | None:
        """Seconds since the job's run last executed a step, or since its launch before its
        first; None when not known (`RunHandle.quiet_s`)."""
        h = self.handles.get(job_id)
        return h.quiet_s() if h is not None else None

    def abort_hung(self, job_id: str, why: str) -> None:
        """Abort the job's hung run; `collect` hands it back ended with `RunHung(why)`."""
        h = self.handles.get(job_id)
        if h is not None:
            h.abort_hung(why)

    def progress(self, job_id: str) -> dict[str, Any] | None:
        h = self.handles.get(job_id)
        return h.progress() if h is not None else None

    def history(self, job_id: str) -> list[dict[str, Any]]:
        h = self.handles.get(job_id)
        return h.history() if h is not None else []

    def collect(self, allocations: dict[str, list[list[Any]] | None]) -> list[Ended]:
        """Every run that ended since the last call; `allocations` (job → GPUs per node) marks
        their GPUs as just released."""
        out = []
        for jid, h in list(self.handles.items()):
            if not h.done():
                continue
            del self.handles[jid]
            self.released.append((time.time(), tuple((n, int(g)) for n, g in allocations.get(jid) or [])))
            try:
                out.append(Ended(job_id=jid, result=h.result(), error=None))
            except Exception as e:
                out.append(Ended(job_id=jid, result=None, error=e, history=h.history()))
        return out

    def recently_released(self, now: float) -> list[tuple[tuple[str, int], ...]]:
        return [alloc for t, alloc in self.released if now - t < self.release_grace_s]
