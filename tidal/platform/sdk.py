"""The Python SDK: `submit(spec) -> JobHandle`, `resume(job_id)`, `list_jobs()`, `connect()`.

`connect()` joins the Ray cluster (`RAY_ADDRESS`, or the one this process already joined) and
finds the cluster's one scheduler, the detached actor `tidal-scheduler` in namespace `tidal`.
Only `submit` and `tidal start` start one where none runs, on the head node and on the state
file the cluster recorded (`tidal.platform.registry`); reading, cancelling and resuming never
do: with no scheduler they raise `NoSchedulerError`, one line that says how to start it. The
spec is validated when it is built and dry-run by `submit` (model, one sample, loss, on this
machine's CPU, or on the cluster in the job's runtime_env when that declares packages), and its
code shipped (`tidal.jobs.codeship`); the scheduler stores it PROFILING and returns its id
at once, then profiles and plans it off the actor: it becomes QUEUED, or REJECTED with the
reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray

from tidal.core.policy import Option
from tidal.core.state import TERMINAL as _TERMINAL_STATES
from tidal.jobs.spec import JobSpec
from tidal.platform.config import NAMESPACE, SCHEDULER_NAME, SchedulerConfig
from tidal.platform.registry import HEAD_NODE_RESOURCE, recorded_state_path
from tidal.platform.scheduler import Scheduler
from tidal.platform.store import StoreWriteError

TERMINAL = frozenset(s.value for s in _TERMINAL_STATES)
ANSWER_S = 120.0  # how long a client waits for the scheduler (a restart takes seconds)


class NoSchedulerError(RuntimeError):
    """No Tidal scheduler runs on the cluster, and the call does not start one."""


def find() -> Any | None:
    """The cluster's scheduler actor, or None where none runs (never starts one)."""
    if not ray.is_initialized():
        ray.init()
    try:
        return ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def connect(config: SchedulerConfig | None = None, *, start: bool = True) -> Any:
    """The scheduler actor's handle. Where none runs: with `start`, a new one on the head node,
    with `config` (its state file, if it names none, the one the cluster recorded, else
    `$TIDAL_STATE`'s); without, a NoSchedulerError. A running scheduler keeps its own config."""
    if (actor := find()) is not None:
        return actor
    recorded = recorded_state_path()
    if not start:
        where = f" on its state file {recorded}" if recorded else ""
        raise NoSchedulerError(f"no Tidal scheduler runs on this Ray cluster: `tidal start` starts "
                               f"one{where}")
    config = config or SchedulerConfig()
    if config.state_path is None and recorded:
        config = dataclasses.replace(config, state_path=recorded)
    return ray.remote(Scheduler).options(
        name=SCHEDULER_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        max_restarts=-1, max_task_retries=-1, max_concurrency=16, num_cpus=0,
        resources={HEAD_NODE_RESOURCE: 0.001},
    ).remote(config)


def start_failure(e: BaseException) -> str | None:
    """Why the scheduler actor could not start (its constructor raised: a state file that is not
    one, a bad config), as the constructor's exception line; None for any other error. Ray
    reports it as an ActorDiedError whose message is the whole remote traceback, ending in that
    line; the actor is dead, not restarted, and the next `connect` starts a new one."""
    from ray.exceptions import RayActorError

    if not (isinstance(e, RayActorError) and e.actor_init_failed):
        return None
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"the Tidal scheduler could not start: {lines[-1] if lines else 'no reason given'}"


class SchedulerStartError(RuntimeError):
    """The scheduler actor could not start; the message is `start_failure`'s line."""


def answer_error(e: BaseException) -> BaseException | None:
    """The scheduler's own answer inside a failed call, else None. Its answers to bad input (a
    KeyError: no such job; a ValueError, SpecError included: a bad spec, checkpoint or state)
    reach the caller as Ray's `RayTaskError(SpecError)`, whose text is the actor's whole
    traceback; the answer is its `cause`, the exception the actor raised. So is a state file
    that refused the write a call needed (`StoreWriteError`: full, locked, read-only)."""
    from ray.exceptions import RayTaskError

    cause = e.cause if isinstance(e, RayTaskError) else None
    return cause if isinstance(cause, (KeyError, ValueError, StoreWriteError)) else None


def answer(ref: Any, timeout: float | None = None) -> Any:
    """`ray.get` of a scheduler call: its answer to bad input raised as the exception the actor
    raised (`answer_error`: a SpecError of one line, not a RayTaskError with a traceback); a
    scheduler that could not start as a SchedulerStartError (`scheduler_started`)."""
    with scheduler_started():
        try:
            return ray.get(ref, timeout=timeout)
        except Exception as e:
            if (mine := answer_error(e)) is None:
                raise
            raise mine from None


@contextlib.contextmanager
def scheduler_started() -> Iterator[None]:
    """A scheduler that could not start as a SchedulerStartError of one line (`start_failure`)."""
    try:
        yield
    except Exception as e:
        why = start_failure(e)
        if why is None:
            raise
        raise SchedulerStartError(why) from None


class JobHandle:
    def __init__(self, job_id: str, scheduler: Any) -> None:
        self.job_id = job_id
        self._scheduler = scheduler

    def status(self, answer_s: float = ANSWER_S) -> dict[str, Any]:
        """The job's status row. A scheduler that restarts is waited for (Ray retries the call);
        one that is gone is looked up again by name; one that does not answer within
        `answer_s` is a one-line TimeoutError, never a silent hang."""
        from ray.exceptions import GetTimeoutError, RayActorError

        deadline = time.time() + answer_s
        while True:
            try:  # `answer`: an unknown job is a one-line KeyError, a failed start one line too
                rows: list[dict[str, Any]] = answer(self._scheduler.status.remote(self.job_id),
                                                    timeout=max(1.0, deadline - time.time()))
                return rows[0]
            except GetTimeoutError:
                raise TimeoutError(f"the Tidal scheduler did not answer about {self.job_id} "
                                   f"in {answer_s:.0f} s") from None
            except RayActorError:
                if time.time() > deadline:
                    raise RuntimeError(f"the Tidal scheduler is gone (asked about {self.job_id}); "
                                       "`tidal status` starts a new one from $TIDAL_STATE") from None
                time.sleep(1.0)
                with contextlib.suppress(ValueError):  # not registered again yet
                    self._scheduler = ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)

    def wait(self, timeout: float | None = None, poll_s: float = 2.0,
             on_status: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Block until the job ends (SUCCEEDED, FAILED, CANCELLED or REJECTED); returns its status.
        `on_status` sees every status polled before the end (progress output)."""
        deadline = None if timeout is None else time.time() + timeout
        while True:
            st = self.status()
            if st["state"] in TERMINAL:
                return st
            if on_status is not None:
                on_status(st)
            if deadline is not None and time.time() > deadline:
                raise TimeoutError(f"job {self.job_id} still {st['state']} after {timeout} s")
            time.sleep(poll_s)

    def logs(self) -> list[dict[str, Any]]:
        """Per-step metrics of the job's current run (loss, lr, samples/s, plan)."""
        hist: list[dict[str, Any]] = answer(self._scheduler.history.remote(self.job_id))
        return hist

    def cancel(self) -> None:
        answer(self._scheduler.cancel.remote(self.job_id))

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r})"


def submit(spec: JobSpec, *, config: SchedulerConfig | None = None,
           options: tuple[Option, ...] | None = None, checked: bool = False) -> JobHandle:
    """Submit a job; `options` (a resource matrix, e.g. from `tidal plan`) skips profiling. The
    job's dry run (`tidal.jobs.dryrun`: model, one sample, loss) runs here first, unless the
    caller ran it (`checked`): a broken job is a SpecError naming the field in seconds, before
    anything reaches the cluster. A spec whose runtime_env declares packages (pip, conda, ...)
    is dry-run on the cluster instead, in that env (`codeship.dry_run_remote`). Its code then
    reaches the scheduler shipped (`codeship.ship`: directories kept in the runs' storage, the
    factories sealed)."""
    scheduler = _shipping_to(spec, checked, lambda: connect(config))
    shipped = _ship(spec, scheduler)
    job_id: str = answer(scheduler.submit.remote(shipped, options))
    return JobHandle(job_id, scheduler)


def resume(job_id: str, spec: JobSpec | None = None, *, checked: bool = False) -> JobHandle:
    """Submit ended job `job_id` again from its newest complete checkpoint, as a new job, with
    its own spec or `spec` (dry-run and shipped like `submit`'s; `checked`: the caller ran the
    dry run): `Scheduler.resume`."""
    if spec is None:
        scheduler = connect(start=False)
    else:
        scheduler = _shipping_to(spec, checked, lambda: connect(start=False))
        spec = _ship(spec, scheduler)
    new_id: str = answer(scheduler.resume.remote(job_id, spec))
    return JobHandle(new_id, scheduler)


def _shipping_to(spec: JobSpec, checked: bool, scheduler: Callable[[], Any]) -> Any:
    """The scheduler a spec goes to, after `codeship.check_here` (unless the caller ran it:
    `checked`)."""
    from tidal.jobs.codeship import check_here

    if not checked:
        check_here(spec)
    return scheduler()


def _ship(spec: JobSpec, scheduler: Any) -> JobSpec:
    from tidal.jobs.codeship import declares_packages, dry_run_remote, ship

    shipped = ship(spec, lambda name, data: answer(scheduler.keep_package.remote(name, data)))
    if declares_packages(shipped):
        dry_run_remote(shipped)
    return shipped


def list_jobs() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = answer(connect(start=False).status.remote())
    return rows
