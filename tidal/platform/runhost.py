"""The run host: the one process of a cluster that drives its training runs, apart from the scheduler.

A run is a Ray Train `TorchTrainer.fit()` (`tidal.jobs.runner.launch`), and Ray Train's
controller and workers belong to the process that called `fit()`: when it dies, they die. Driven
from the scheduler actor, every run died with it, and a scheduler that Ray restarted (or that
`tidal start` brought back) found only checkpoints, and moved every running job (measured: back
in 2.1 s, then both running jobs relaunched, ~10 s each). So the runs are driven here, in one
detached actor per cluster (`tidal-runs`, namespace `tidal`, on the head node beside the
scheduler), and the scheduler's executor only asks it to launch, stop, report and hand back what
ended. A scheduler that dies leaves its runs training; its next life adopts the ones its state
file says run (`RunTracker.recover`) and stops the ones it does not know.

The host holds one `RunHandle` per job, from its launch until the scheduler collects its end
(`ended`). The host is a threaded actor: the handles' questions to their runs' `RunControl`
block on answers (with timeouts), and one run's slow answer must not hold up another's. If the
host itself dies, its runs die with it and the executor hands each back ended with that error
(a fault of the cluster: the job resumes from its newest checkpoint); the next launch starts a
new host.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import ray

from tidal.jobs.runner import Resources, RunHandle, launch, workers_have_cuda
from tidal.jobs.spec import JobSpec, Plan
from tidal.platform.config import NAMESPACE
from tidal.platform.outcome import Ended, infrastructure_failure
from tidal.platform.registry import HEAD_NODE_RESOURCE

RUN_HOST_NAME = "tidal-runs"  # the actor's name, in namespace NAMESPACE


class RunBusy(RuntimeError):
    """The host still holds the job's previous run (a launch that timed out, a run being
    discarded): not the job's fault, so the scheduler tries the launch again at its next tick
    (`outcome.infrastructure_failure` knows it by name)."""


class RunHost:
    """The actor's body (`start_host` wraps it). Keys are job ids: a job has at most one run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, RunHandle] = {}
        self._launching: set[str] = set()  # jobs whose run is starting (outside the lock)
        self._discarded: set[str] = set()  # runs no scheduler knows: stopped, their end dropped

    def launch(self, job_id: str, spec: JobSpec, plan: Plan, resources: Resources, checkpoint: str | None,
               run_id: str, max_failures: int) -> float:
        """Start the job's run (`tidal.jobs.runner.launch`, which validates before anything
        starts); returns its launch time. A job whose last run has not been collected yet, or
        is being launched, is a RunBusy: two runs of one job would write one run directory. The
        lock is not held while the run starts (a first launch probes for CUDA, seconds): the
        other runs' questions are answered meanwhile."""
        with self._lock:
            if job_id in self._runs or job_id in self._launching:
                held = self._runs[job_id].run_id if job_id in self._runs else "being launched"
                raise RunBusy(f"{job_id} already has a run here ({held})")
            self._launching.add(job_id)
        try:
            h = launch(spec, plan, resources, checkpoint, run_id=run_id, max_failures=max_failures,
                       job_key=job_id)
            with self._lock:
                self._runs[job_id] = h  # before it stops being "launching": no gap for a second
        finally:
            with self._lock:
                self._launching.discard(job_id)
        return h.launched_at

    def prepare(self, gpus_per_worker: float) -> bool:
        """Ahead of the first launch: answers once the host is up (its imports done) and has
        probed whether workers granted `gpus_per_worker` GPUs see CUDA, which every launch needs
        to know (`runner.workers_have_cuda`, cached here)."""
        return workers_have_cuda(gpus_per_worker)

    def runs(self) -> dict[str, tuple[str, float, float | None]]:
        """Every run not collected yet: job → (run id, launch time, when a stop was asked or
        None), for a scheduler that adopts them."""
        with self._lock:
            return {j: (h.run_id, h.launched_at, h.stop_requested_at) for j, h in self._runs.items()
                    if j not in self._discarded}

    def _get(self, job_id: str) -> RunHandle | None:
        with self._lock:
            return self._runs.get(job_id)

    def stop(self, job_id: str) -> bool:
        """Ask the job's run to stop at its next step boundary with a checkpoint; False if none."""
        h = self._get(job_id)
        if h is not None:
            h.stop()
        return h is not None

    def registered(self, job_id: str) -> bool:
        h = self._get(job_id)
        return h is not None and h.registered()

    def quiet_s(self, job_id: str) -> float | None:
        h = self._get(job_id)
        return h.quiet_s() if h is not None else None

    def abort_hung(self, job_id: str, why: str) -> None:
        h = self._get(job_id)
        if h is not None:
            h.abort_hung(why)

    def progress(self, job_id: str) -> dict[str, Any] | None:
        h = self._get(job_id)
        return h.progress() if h is not None else None

    def history(self, job_id: str) -> list[dict[str, Any]]:
        h = self._get(job_id)
        return h.history() if h is not None else []

    def discard(self, job_id: str) -> None:
        """A run no scheduler knows (launched by a life that died before it recorded the launch):
        asked to stop, and its end dropped rather than handed to anyone."""
        h = self._get(job_id)
        if h is not None:
            self._discarded.add(job_id)
            h.stop()

    def ended(self) -> list[Ended]:
        """Every run that ended since the last call, removed from the host: its result, or the
        error it ended with, the steps it reported, and whether the error is the cluster's fault
        (`executor.infrastructure_failure`, judged here on the whole exception: its cause chain
        does not survive pickling)."""
        with self._lock:
            done = [(j, h) for j, h in self._runs.items() if h.done()]
            for j, _ in done:
                del self._runs[j]
        out = []
        for j, h in done:
            if j in self._discarded:
                self._discarded.discard(j)
                continue
            try:
                out.append(Ended(job_id=j, result=h.result(), error=None))
            except Exception as e:
                out.append(Ended(job_id=j, result=None, error=_portable(e), history=h.history(),
                                 infrastructure=infrastructure_failure(e)))
        return out


def _portable(e: Exception) -> Exception:
    """`e`, or where it does not pickle, a RuntimeError with its type and text."""
    try:
        pickle.loads(pickle.dumps(e))
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")
    return e


def start_host() -> Any:
    """The cluster's run host, started on the head node where none runs."""
    return ray.remote(RunHost).options(
        name=RUN_HOST_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        max_concurrency=32, num_cpus=0, resources={HEAD_NODE_RESOURCE: 0.001},
    ).remote()


def find_host() -> Any | None:
    """The cluster's run host, or None where none runs (starts none)."""
    try:
        return ray.get_actor(RUN_HOST_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def stop_host() -> bool:
    """Kill the cluster's run host, and with it every run it drives (a test's end); whether
    one ran."""
    h = find_host()
    if h is not None:
        ray.kill(h, no_restart=True)
    return h is not None
