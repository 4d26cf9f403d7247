"""The Python SDK: `submit(spec) -> JobHandle`, `list_jobs()`, `connect()`.

`connect()` joins the Ray cluster (`RAY_ADDRESS`, or the one this process already joined) and
gets — or starts — the detached scheduler actor `tidal-scheduler` in namespace `tidal`. The
spec is validated when it is built; `submit` sends it to the scheduler, which profiles and
plans it and rejects it with the reason if no plan fits the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray

from tidal.jobs.spec import JobSpec
from tidal.platform.policy import Option
from tidal.platform.scheduler import NAMESPACE, SCHEDULER_NAME, Scheduler, SchedulerConfig


def connect(config: SchedulerConfig | None = None) -> Any:
    """The scheduler actor's handle, starting the actor if the cluster has none."""
    if not ray.is_initialized():
        ray.init()
    actor_cls = ray.remote(Scheduler)
    return actor_cls.options(
        name=SCHEDULER_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        max_restarts=-1, max_task_retries=-1, max_concurrency=16, num_cpus=0,
    ).remote(config)


class JobHandle:
    def __init__(self, job_id: str, scheduler: Any) -> None:
        self.job_id = job_id
        self._scheduler = scheduler

    def status(self) -> dict[str, Any]:
        rows: list[dict[str, Any]] = ray.get(self._scheduler.status.remote(self.job_id))
        return rows[0]

    def wait(self, timeout: float | None = None, poll_s: float = 2.0,
             on_status: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Block until the job ends (SUCCEEDED, FAILED or CANCELLED); returns its status.
        `on_status` sees every status polled before the end (progress output)."""
        deadline = None if timeout is None else time.time() + timeout
        while True:
            st = self.status()
            if st["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return st
            if on_status is not None:
                on_status(st)
            if deadline is not None and time.time() > deadline:
                raise TimeoutError(f"job {self.job_id} still {st['state']} after {timeout} s")
            time.sleep(poll_s)

    def logs(self) -> list[dict[str, Any]]:
        """Per-step metrics of the job's current run (loss, lr, samples/s, plan)."""
        hist: list[dict[str, Any]] = ray.get(self._scheduler.history.remote(self.job_id))
        return hist

    def cancel(self) -> None:
        ray.get(self._scheduler.cancel.remote(self.job_id))

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r})"


def submit(spec: JobSpec, *, config: SchedulerConfig | None = None,
           options: tuple[Option, ...] | None = None) -> JobHandle:
    """Submit a job; `options` (a resource matrix, e.g. from `tidal plan`) skips profiling. The
    job's dry run (`tidal.jobs.dryrun`: model, one sample, loss) runs here first: a broken job is
    a SpecError naming the field in seconds, before anything reaches the cluster."""
    from tidal.jobs.dryrun import dry_run

    dry_run(spec)
    scheduler = connect(config)
    job_id: str = ray.get(scheduler.submit.remote(spec, options))
    return JobHandle(job_id, scheduler)


def list_jobs() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ray.get(connect().status.remote())
    return rows
