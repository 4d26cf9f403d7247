"""Run a job under one plan as a Ray Train V2 `TorchTrainer` of DeepSpeed workers.

    run(spec, plan, resources, checkpoint=None) -> RunResult        (blocking)
    launch(spec, plan, resources, checkpoint=None) -> RunHandle     (returns at once)

A run trains from `checkpoint` (or from scratch) until the job's last step, until
`stop_at_step`, or until `RunHandle.stop()` asks it to stop at the next step boundary; every
way out ends with a plan-independent checkpoint (`tidal.jobs.checkpoint`), so the scheduler
reconfigures a job as stop → `run(spec, new_plan, new_resources, checkpoint=...)`.

A stop that finds no step trained yet does not wait for one: starting a worker group, building
the DeepSpeed engines and loading the checkpoint took over 90 s on a busy 2-core host (the demo:
a loan's recall waited that long for a run that had not trained a step). Such a run holds
nothing its launch checkpoint does not, so the stop aborts Ray Train's controller
(`TrainController.abort`: the worker group and its placement group go) and the run ends with
that checkpoint, `RunResult.aborted` set. The control actor learns the controller's handle
from a controller callback when the controller starts; a stop asked for before that aborts it
as soon as it registers.

Each run has a small control actor (`RunControl`, zero CPUs). Rank 0 sends it per-step
metrics in batches, never blocking on it, and learns from its answer whether a stop was asked
for; the driver reads progress and the loss curve from it. Ray Train's own `report` carries
the checkpoints, which land under the run's storage, and metrics only if the spec asks
(`report_every`: each report waits for Ray Train's controller, which polls every 2 s), storage
being `$TIDAL_STORAGE`, default `~/.cache/tidal/runs`; a multi-node cluster needs it on a shared
filesystem or in cloud storage). A run keeps its newest `JobSpec.keep_checkpoints` there.

Workers use `resources_per_worker = {CPU: c, GPU: g}`. With `gpus_per_worker > 0` and no CUDA
on the workers (a CPU machine with *logical* GPUs, `ray.init(num_gpus=N)`), the GPUs are
reserved as placement-group resources but training runs on CPU with gloo; with CUDA it runs on
the GPU with NCCL. The same code path serves both.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import ray

from tidal.jobs.codeship import keep_in_storage, ship
from tidal.jobs.spec import JobSpec, Plan, PlanError, SpecError
from tidal.jobs.storage import check_storage, checkpoint_progress, storage_root
from tidal.jobs.worker import WorkerConfig, train_loop

Device = Literal["auto", "cpu", "cuda"]


_NO_ANSWER = object()  # `RunHandle._ask`'s default where None is an answer


class RunHung(RuntimeError):
    """A run the driver found hung (no step for too long) and aborted; the job resumes from its
    newest checkpoint (`tidal.platform.outcome.infrastructure_failure`)."""


@dataclass(frozen=True, kw_only=True)
class Resources:
    """What a run's workers get. One worker per data-parallel rank.

    node_ids pins worker i to node node_ids[i] (Ray node ids, through Train V2's per-worker
    `label_selector` on `ray.io/node-id`); None lets Ray pack the placement group.
    """

    num_workers: int
    gpus_per_worker: float = 0.0
    cpus_per_worker: float = 1.0
    memory_per_worker: int | None = None  # bytes
    node_ids: tuple[str, ...] | None = None
    device: Device = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise SpecError("Resources.num_workers", f"must be an integer >= 1, got {self.num_workers!r}")
        if self.gpus_per_worker < 0 or self.cpus_per_worker < 0:
            raise SpecError("Resources", "gpus_per_worker and cpus_per_worker must be >= 0")
        if self.node_ids is not None and len(self.node_ids) != self.num_workers:
            raise SpecError(
                "Resources.node_ids",
                f"needs one node per worker: {len(self.node_ids)} ids for {self.num_workers} workers",
            )
        if self.device == "cuda" and self.gpus_per_worker <= 0:
            raise SpecError("Resources.device", "device='cuda' needs gpus_per_worker > 0")

    def per_worker(self) -> dict[str, float]:
        res: dict[str, float] = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker > 0:
            res["GPU"] = self.gpus_per_worker
        if self.memory_per_worker:
            res["memory"] = float(self.memory_per_worker)
        return res


@ray.remote(num_cpus=0)
class RunControl:
    """Per-run mailbox: metrics in from rank 0, a stop request in from the driver, the handle of
    Ray Train's controller (to abort a run stopped before its first step: module docstring)."""

    def __init__(self) -> None:
        self._stop = False
        self._stop_time: float | None = None
        self._history: dict[int, dict[str, Any]] = {}
        self._workers: dict[int, str] = {}
        self._controller: Any = None
        self._aborted = False
        self._beat: float | None = None  # when rank 0 last called in (time.monotonic, this actor's)
        self._hung: str | None = None  # why the driver found the run hung (`abort_hung`)

    def set_controller(self, controller: Any) -> None:
        """Called once by the `_controller_handle` callback from inside the controller as it starts."""
        self._controller = controller
        self._abort_if_untrained()
        if self._hung is not None:
            controller.abort.remote()

    def quiet_s(self) -> float | None:
        """Seconds since rank 0 last called in (it does once per step it executes, probes
        included, at most every `heartbeat_s`); None before its first call. Measured on this
        actor's clock, so the driver's need not agree with it."""
        return None if self._beat is None else time.monotonic() - self._beat

    def abort_hung(self, why: str) -> None:
        """The driver found the run hung (no step for too long): abort Ray Train's controller,
        which kills the workers, now or as soon as it registers; the run then ends with
        `RunHung(why)`, a fault of the cluster (resumed from the newest checkpoint)."""
        if self._hung is None:
            self._hung = why
            if self._controller is not None:
                self._controller.abort.remote()

    def hung(self) -> str | None:
        return self._hung

    def _abort_if_untrained(self) -> None:
        """A stop asked for before any step was reported: abort the run now, not after its
        first step (its launch checkpoint is all it has)."""
        if self._stop and not self._history and self._controller is not None and not self._aborted:
            self._aborted = True
            self._controller.abort.remote()  # exits the controller: no answer to wait for

    def aborted(self) -> bool:
        return self._aborted

    def started(self) -> bool:
        """Whether the controller has started: Ray Train calls its scaling policy's
        `after_controller_start`, which registers the run's workers with the autoscaling
        coordinator, before the callback that sets the controller here."""
        return self._controller is not None

    def register(self, rank: int, node_id: str) -> None:
        """Each worker says where it really runs (the executor verifies placements with it)."""
        self._workers[rank] = node_id

    def workers(self) -> dict[int, str]:
        return dict(self._workers)

    def request_stop(self) -> float:
        if not self._stop:
            self._stop, self._stop_time = True, time.time()
        self._abort_if_untrained()
        assert self._stop_time is not None
        return self._stop_time

    def heartbeat(self, metrics: list[dict[str, Any]]) -> bool:
        self._beat = time.monotonic()
        if self._aborted:
            return True  # steps reported after the abort are not the run's: the run has none
        for m in metrics:  # a restarted worker group may resend steps: keep the latest
            self._history[int(m["step"])] = m
        return self._stop

    def history(self) -> list[dict[str, Any]]:
        return [self._history[k] for k in sorted(self._history)]

    def latest(self) -> dict[str, Any] | None:
        return self._history[max(self._history)] if self._history else None


@dataclass(kw_only=True)
class RunResult:
    spec_name: str
    plan: Plan
    run_id: str
    start_step: int
    final_step: int
    finished: bool  # reached the job's total_steps
    checkpoint: str | None  # directory of the last checkpoint
    history: list[dict[str, Any]] = field(default_factory=list)
    worker_nodes: dict[int, str] = field(default_factory=dict)  # rank → Ray node id it ran on
    wall_s: float = 0.0
    stop_requested_at: float | None = None
    aborted: bool = False  # stopped before its first step: ended with its launch checkpoint

    @property
    def losses(self) -> list[float]:
        return [m["loss"] for m in self.history]

    def mean_samples_per_s(self, skip: int = 1) -> float:
        """Samples/s over the run's steps, skipping the first `skip` (warm-up) steps."""
        steps = self.history[skip:] or self.history
        if not steps:
            return 0.0
        return sum(m["samples_per_s"] * m["step_time_s"] for m in steps) / sum(
            m["step_time_s"] for m in steps
        )


_cuda_probe: dict[float, bool] = {}


def workers_have_cuda(gpus: float) -> bool:
    """Whether a worker granted `gpus` GPUs sees CUDA (cached per process). The first call
    runs a probe task, which waits for a free GPU and imports torch in a fresh worker (seconds):
    a process that launches runs can call it ahead (`RunHost.prepare`)."""
    if gpus not in _cuda_probe:

        @ray.remote(num_cpus=0, num_gpus=gpus)
        def probe() -> bool:
            import torch

            return bool(torch.cuda.is_available())

        _cuda_probe[gpus] = bool(ray.get(probe.remote(), timeout=120))
    return _cuda_probe[gpus]


class RunHandle:
    """A launched run: `stop()` asks it to checkpoint and stop; `result()` waits for it."""

    def __init__(self, *, spec: JobSpec, plan: Plan, resources: Resources,
                 checkpoint: str | None, stop_at_step: int | None, run_id: str | None,
                 max_failures: int, job_key: str | None) -> None:
        self.spec, self.plan, self.resources = spec, plan, resources
        self.run_id = run_id or f"{spec.name}-{uuid.uuid4().hex[:8]}"
        self.checkpoint = checkpoint
        self.start_step = checkpoint_progress(checkpoint)[0] if checkpoint else 0
        study = (str(storage_root() / "autolrs" / f"{job_key or spec.name}.sqlite")
                 if spec.autolrs is not None else None)
        use_cuda = resources.device == "cuda" or (
            resources.device == "auto"
            and resources.gpus_per_worker > 0
            and workers_have_cuda(resources.gpus_per_worker)
        )
        self.control = RunControl.options(  # type: ignore[attr-defined]
            name=f"tidal-run-{self.run_id}", namespace="tidal"
        ).remote()
        worker = WorkerConfig(
            spec=spec, plan=plan, run_id=self.run_id, resume_from=checkpoint,
            stop_at_step=stop_at_step, control=self.control, use_cuda=use_cuda,
            threads_per_worker=max(1, int(resources.cpus_per_worker)), study_path=study,
        )
        self._trainer = make_trainer(train_loop, {"worker": worker}, resources, use_cuda=use_cuda,
                                     name=self.run_id, max_failures=max_failures,
                                     callbacks=[_controller_handle(self.control)],
                                     keep_checkpoints=spec.keep_checkpoints, runtime_env=spec.runtime_env)
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._failed_history: list[dict[str, Any]] = []
        self._stop_time: float | None = None
        self._registered = False
        self._t0 = time.time()
        self._thread = threading.Thread(target=self._fit, name=f"tidal-{self.run_id}", daemon=True)
        self._thread.start()

    @property
    def launched_at(self) -> float:
        """When the run was launched (`time.time()` of the launching process)."""
        return self._t0

    @property
    def stop_requested_at(self) -> float | None:
        """When `stop()` was first called (None: never)."""
        return self._stop_time

    def _fit(self) -> None:
        try:
            try:
                result = self._trainer.fit()
            except BaseException:
                if (why := self._hung()) is not None:
                    raise RunHung(why) from None
                if not self._aborted():
                    raise
                self._result = RunResult(
                    spec_name=self.spec.name, plan=self.plan, run_id=self.run_id,
                    start_step=self.start_step, final_step=self.start_step, finished=False,
                    checkpoint=self.checkpoint, history=[], worker_nodes={},
                    wall_s=time.time() - self._t0, stop_requested_at=self._stop_time, aborted=True,
                )
                return
            history = ray.get(self.control.history.remote())
            workers = ray.get(self.control.workers.remote())
            ckpt = result.checkpoint.path if result.checkpoint is not None else None
            final, compute = checkpoint_progress(ckpt) if ckpt else (self.start_step, self.start_step)
            self._result = RunResult(
                spec_name=self.spec.name, plan=self.plan, run_id=self.run_id,
                start_step=self.start_step, final_step=final,
                finished=compute >= self.spec.total_steps, checkpoint=ckpt, history=history,
                worker_nodes=workers,
                wall_s=time.time() - self._t0, stop_requested_at=self._stop_time,
            )
        except BaseException as e:  # surfaced by result()
            self._error = e
            self._failed_history = self._reported()  # the steps before the error (`history()`)
        finally:
            ray.kill(self.control)

    def _ask(self, method: str, default: Any, timeout: float = 10.0) -> Any:
        """`RunControl.<method>()`'s answer, or `default` when the actor is gone or does not
        answer within `timeout` seconds (every question the driver asks it)."""
        try:
            return ray.get(getattr(self.control, method).remote(), timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return default

    def _reported(self) -> list[dict[str, Any]]:
        """What rank 0 reported to the run's `RunControl` (nothing if it is gone)."""
        hist: list[dict[str, Any]] = self._ask("history", [])
        return hist

    def _aborted(self) -> bool:
        return bool(self._ask("aborted", False, timeout=30))

    def _hung(self) -> str | None:
        why: str | None = self._ask("hung", None, timeout=30)
        return why

    def quiet_s(self) -> float | None:
        """Seconds since the run's rank 0 last called in (`RunControl.quiet_s`), or since its
        launch before its first call; None (not known) when the run is done or its control actor
        does not answer: a slow actor must not make a healthy run look hung."""
        if self.done():
            return None
        quiet = self._ask("quiet_s", _NO_ANSWER)
        if quiet is _NO_ANSWER:
            return None
        return time.time() - self._t0 if quiet is None else float(quiet)

    def abort_hung(self, why: str) -> None:
        """End a hung run: its workers are killed and it ends with `RunHung(why)`. Returns at once."""
        if not self.done():
            self.control.abort_hung.remote(why)

    def stop(self) -> None:
        """Ask the run to stop after the current step, with a checkpoint (before its first step:
        at once, aborting it; module docstring). Returns at once."""
        if self._stop_time is None and self._thread.is_alive():
            self._stop_time = ray.get(self.control.request_stop.remote())

    def done(self) -> bool:
        return not self._thread.is_alive()

    def registered(self) -> bool:
        """Whether Ray Train has registered the run's workers with the autoscaling coordinator
        (`RunControl.started`); once True, the answer is kept without asking again."""
        if not self._registered and not self.done():
            self._registered = bool(self._ask("started", False))
        return self._registered

    def progress(self) -> dict[str, Any] | None:
        """The latest step's metrics, or None before the first step."""
        if self.done():
            return self._result.history[-1] if self._result and self._result.history else None
        latest: dict[str, Any] | None = self._ask("latest", None)
        return latest

    def history(self) -> list[dict[str, Any]]:
        """Per-step metrics so far (the whole curve once the run is done; a failed run's up to
        its error)."""
        if self.done():
            return list(self._result.history) if self._result else list(self._failed_history)
        return self._reported()

    def result(self, timeout: float | None = None) -> RunResult:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"run {self.run_id} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def _controller_handle(control: Any) -> Any:
    """A Ray Train controller callback that hands the controller's actor handle to the run's
    `RunControl` as the controller starts (Train V2 has no public handle to a run's controller;
    non-`UserCallback` callbacks in `RunConfig.callbacks` reach the controller as they are)."""
    from ray.train.v2._internal.execution.callback import ControllerCallback

    class ControllerHandle(ControllerCallback):
        def __init__(self, control: Any) -> None:
            self.control = control

        def after_controller_start(self, train_run_context: Any) -> None:
            # no ray.get: this runs on the controller's event loop
            self.control.set_controller.remote(ray.get_runtime_context().current_actor)

    return ControllerHandle(control)


def make_trainer(train_fn: Any, config: dict[str, Any], resources: Resources, *, use_cuda: bool,
                 name: str, max_failures: int = 0, callbacks: list[Any] | None = None,
                 keep_checkpoints: int | None = None, runtime_env: dict[str, Any] | None = None) -> Any:
    """A Ray Train V2 `TorchTrainer` of `resources.num_workers` workers running `train_fn`:
    gloo on CPU / NCCL on CUDA, workers pinned per rank to `resources.node_ids` if given,
    results under `storage_root()/name`, of which Ray Train keeps the newest `keep_checkpoints`
    checkpoints (None: all); its workers run in the job's `runtime_env` (`JobSpec.runtime_env`,
    as `tidal.jobs.codeship` shipped it). The runner and the profiler both build theirs here."""
    # Train V2's classes (what `ray.train` re-exports when V2 is on, the 2.60 default).
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.train.v2.api.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    label_selector = (
        [{"ray.io/node-id": n} for n in resources.node_ids] if resources.node_ids else None
    )
    scaling = ScalingConfig(
        num_workers=resources.num_workers,
        use_gpu=resources.gpus_per_worker > 0,
        resources_per_worker=resources.per_worker(),
        placement_strategy="PACK",
        label_selector=label_selector,
    )
    storage = check_storage()
    return TorchTrainer(
        train_loop_per_worker=train_fn,
        train_loop_config=config,
        scaling_config=scaling,
        torch_config=TorchConfig(backend="nccl" if use_cuda else "gloo"),
        run_config=RunConfig(  # type: ignore[arg-type]  # V2 trainer, V1-typed signature
            name=name,
            storage_path=str(storage),
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=keep_checkpoints),
            callbacks=callbacks,
            worker_runtime_env=runtime_env or {},
        ),
    )


def launch(spec: JobSpec, plan: Plan, resources: Resources, checkpoint: str | None = None, *,
           stop_at_step: int | None = None, run_id: str | None = None,
           max_failures: int = 0, job_key: str | None = None) -> RunHandle:
    """Start a run in the background. All validation happens here, before anything starts.

    `stop_at_step` bounds the run's compute steps (= optimizer steps; for an AutoLRS job they
    include the probes). `job_key` names the job across its runs (the AutoLRS study file);
    default the spec's name."""
    spec.check_plan(plan)
    if resources.num_workers != plan.dp:
        raise PlanError(
            "Resources.num_workers",
            f"plan {plan.short()} needs {plan.dp} workers, resources give {resources.num_workers}",
        )
    start = checkpoint_progress(checkpoint)[1] if checkpoint else 0
    if start >= spec.total_steps:  # `checkpoint_done`, from the progress read once here
        raise SpecError(
            "checkpoint", f"checkpoint is at step {start}: the job ({spec.total_steps} steps) is done"
        )
    if stop_at_step is not None and not start < stop_at_step:
        raise SpecError("stop_at_step", f"must be > the checkpoint's step {start}, got {stop_at_step}")
    # local directories of its runtime_env into the runs' storage, its code sealed: Train's
    # controller never imports the user's modules, its workers find them on any node
    spec = ship(spec, keep_in_storage)
    if not ray.is_initialized():
        ray.init()
    return RunHandle(spec=spec, plan=plan, resources=resources, checkpoint=checkpoint,
                     stop_at_step=stop_at_step, run_id=run_id, max_failures=max_failures,
                     job_key=job_key)


def run(spec: JobSpec, plan: Plan, resources: Resources, checkpoint: str | None = None, *,
        stop_at_step: int | None = None, run_id: str | None = None,
        max_failures: int = 0, job_key: str | None = None) -> RunResult:
    """Run to the end (or to `stop_at_step`) and return the result."""
    return launch(spec, plan, resources, checkpoint, stop_at_step=stop_at_step, run_id=run_id,
                  max_failures=max_failures, job_key=job_key).result()
