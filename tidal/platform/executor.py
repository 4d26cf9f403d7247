"""The executor: the only part of the control plane that starts and stops runs.

It launches a job's run (a Ray Train `TorchTrainer` of DeepSpeed workers, `tidal.jobs.runner`)
on exactly the nodes a decision names, asks runs to stop at their next step boundary with a
checkpoint, and hands the scheduler every run that ended (`collect`) with how it ended
(`outcome`). The runs themselves are driven by the cluster's run host (`runhost`), so they
outlive a scheduler that dies; a restarted one `adopt`s them. It also finds a lost run's newest
complete checkpoint in storage; what becomes of the job is the scheduler's call
(`tidal.core.state`).
"""

from __future__ import annotations

import glob
import logging
import re
import shutil
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import ray

from tidal.core.policy import Allocation
from tidal.jobs.checkpoint import read_complete_meta, read_metrics
from tidal.jobs.runner import Resources
from tidal.jobs.spec import JobSpec
from tidal.jobs.storage import storage_root
from tidal.platform.outcome import Ended
from tidal.platform.runhost import find_host, start_host

ASK_S = 15.0  # how long the loop waits for the run host's answer about one run
LAUNCH_S = 300.0  # ... to a launch (the first one probes whether workers see CUDA) or a collection

log = logging.getLogger(__name__)

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


class Executor:
    """The scheduler's side of the runs: which jobs have a run, and the questions it asks the run
    host about them (`tidal.platform.runhost`), each with a timeout so that a slow host never
    holds the loop. A question the host does not answer in time gets "not known"."""

    def __init__(self, *, cpus_per_worker: float, max_failures: int, release_grace_s: float) -> None:
        self.cpus_per_worker = cpus_per_worker
        self.max_failures = max_failures  # Ray Train restarts a crashed worker group this often
        self.release_grace_s = release_grace_s
        self.jobs: set[str] = set()  # the jobs with a run on the host, until `collect` hands it back
        self._host: Any = None
        self._warming: threading.Thread | None = None
        # (time, GPUs per node) of runs that just ended: Ray frees a placement group a little later
        self.released: deque[tuple[float, tuple[tuple[str, int], ...]]] = deque(maxlen=1000)

    def host(self) -> Any:
        """The cluster's run host (started on the head node where none runs)."""
        if self._host is None:
            self._host = start_host()
        return self._host

    def warm(self) -> None:
        """Start the run host and its CUDA probe in the background, once, ahead of the first
        launch: a job is coming (submitted, or queued in a restarted scheduler's store). Launches
        happen under the scheduler's lock, which `submit` waits on, and a cold host
        makes the first one seconds long (a fresh process's imports, then the probe's fresh
        worker). A warm-up that fails changes nothing: the launch starts the host and probes
        itself."""
        if self._warming is not None:
            return

        def up() -> None:
            try:
                h = start_host()
                ray.get(h.prepare.remote(1), timeout=LAUNCH_S)  # every run has one GPU per worker
            except Exception as e:  # the launch will meet it, and say it
                log.warning("the run host did not warm up: %s", e)

        self._warming = threading.Thread(target=up, name="tidal-warm-runhost", daemon=True)
        self._warming.start()

    def _ask(self, method: str, *args: Any, default: Any = None, timeout: float = ASK_S) -> Any:
        """The host's answer to `method(*args)`, or `default` when it does not answer in time or
        is gone (`collect` then finds its runs ended)."""
        try:
            return ray.get(getattr(self.host(), method).remote(*args), timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return default

    def adopt(self) -> dict[str, tuple[str, float, float | None]]:
        """The runs the host drives that no scheduler has collected (job → run id, launch time,
        when a stop was asked); a restarted scheduler `track`s those its store says run."""
        if self._host is None and (found := find_host()) is None:
            return {}  # no host: nothing to adopt, and none is started until the first launch
        self._host = self._host or found
        runs: dict[str, tuple[str, float, float | None]] = self._ask("runs", default={}, timeout=LAUNCH_S)
        return runs

    def track(self, job_id: str) -> None:
        """The job's run, launched by an earlier scheduler, is this one's from now on."""
        self.jobs.add(job_id)

    def discard(self, job_id: str) -> None:
        """A run no record knows: asked to stop, its end never handed to the scheduler."""
        self._ask("discard", job_id)

    def launch(self, job_id: str, spec: JobSpec, alloc: Allocation, checkpoint: str | None,
               run_id: str) -> float:
        """Start the job's run of `alloc.plan` with one worker per GPU, worker i on the i-th GPU's
        node (`Resources.node_ids`), from `checkpoint`; returns its launch time. Raises what the
        launch raised (a plan the spec refuses, a checkpoint of the whole job)."""
        node_ids = tuple(n for n, g in alloc.gpus_by_node for _ in range(g))
        res = Resources(num_workers=alloc.plan.dp, gpus_per_worker=1, cpus_per_worker=self.cpus_per_worker,
                        node_ids=node_ids)
        try:
            at = ray.get(self.host().launch.remote(job_id, spec, alloc.plan, res, checkpoint, run_id,
                                                   self.max_failures), timeout=LAUNCH_S)
        except ray.exceptions.RayTaskError as e:
            raise e.cause if isinstance(e.cause, Exception) else e from None
        except ray.exceptions.RayActorError:
            self._host = None  # the host died: the next launch starts another
            raise
        except ray.exceptions.GetTimeoutError:
            self.discard(job_id)  # if it starts after all, it is stopped and dropped
            raise
        self.jobs.add(job_id)
        return float(at)

    def stop(self, job_id: str) -> bool:
        """Ask the job's run to stop at its next step boundary with a checkpoint; False if it has
        no run here."""
        if job_id not in self.jobs:
            return False
        self._ask("stop", job_id)
        return True

    def has_run(self, job_id: str) -> bool:
        return job_id in self.jobs

    def registered(self, job_id: str) -> bool:
        """Whether the job's run has registered its workers with Ray's autoscaling coordinator
        (`tidal.core.autoscale`); False if it has no run here."""
        return job_id in self.jobs and bool(self._ask("registered", job_id, default=False))

    def quiet_s(self, job_id: str) -> float | None:
        """Seconds since the job's run last executed a step, or since its launch before its
        first; None when not known (`RunHandle.quiet_s`)."""
        return self._ask("quiet_s", job_id) if job_id in self.jobs else None

    def abort_hung(self, job_id: str, why: str) -> None:
        """Abort the job's hung run; `collect` hands it back ended with `RunHung(why)`."""
        if job_id in self.jobs:
            self._ask("abort_hung", job_id, why)

    def progress(self, job_id: str) -> dict[str, Any] | None:
        return self._ask("progress", job_id) if job_id in self.jobs else None

    def history(self, job_id: str) -> list[dict[str, Any]]:
        if job_id not in self.jobs:
            return []
        steps: list[dict[str, Any]] = self._ask("history", job_id, default=[])
        return steps

    def collect(self, allocations: dict[str, list[list[Any]] | None]) -> list[Ended]:
        """Every run that ended since the last call; `allocations` (job → GPUs per node) marks
        their GPUs as just released. A host that died ended all its runs, with that error."""
        if not self.jobs:
            return []
        try:
            out: list[Ended] = ray.get(self.host().ended.remote(), timeout=LAUNCH_S)
        except ray.exceptions.GetTimeoutError:
            return []
        except ray.exceptions.RayActorError as e:
            self._host = None
            out = [Ended(job_id=j, result=None, error=e, infrastructure=True) for j in self.jobs]
        out = [x for x in out if x.job_id in self.jobs]  # `discard`ed runs are dropped by the host
        now = time.time()
        for x in out:
            self.jobs.discard(x.job_id)
            self.released.append((now, tuple((n, int(g)) for n, g in allocations.get(x.job_id) or [])))
        return out

    def recently_released(self, now: float) -> list[tuple[tuple[str, int], ...]]:
        return [alloc for t, alloc in self.released if now - t < self.release_grace_s]
