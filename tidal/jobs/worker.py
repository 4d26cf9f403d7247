"""What runs inside each Ray Train worker: build the DeepSpeed engine for a plan, train, report.

Each optimizer step is `tidal.jobs.engine.train_step`: the gradient of the mean loss over the
same B samples under every plan (dp, micro-batch, accumulation). The loss reported for step k
is that same global mean: mean_m(loss_m) all-reduced over ranks / dp. The all-reduce also
carries the stop flag (rank 0 polls the run's control actor without blocking), so stopping
costs no extra collective and all ranks stop after the same step. Rank 0 sends the per-step
metrics to the control actor in batches, at most one call in flight and one per
`heartbeat_s`: on a busy host every actor call takes CPU from training.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tidal.jobs.checkpoint import METRICS_FILE, TrainState, capture_state, model_config, restore_state
from tidal.jobs.data import StepSampler
from tidal.jobs.engine import build_engine, set_host_threads, train_step, yield_cpu_to_serving
from tidal.jobs.spec import JobSpec, Plan, PlanError

log = logging.getLogger("tidal.worker")


class NonFiniteLoss(RuntimeError):
    """The job's loss was NaN or infinite: the job's own error. The run stops at once (every rank
    sees the same all-reduced loss, so all raise together) and keeps its last finite checkpoint;
    nothing after it is saved."""


class LoopHooks:
    """What the training loop needs from its host. `train_loop` plugs in Ray Train (metrics to
    the run's control actor, checkpoints through `ray.train.report`); benchmarks and tests run
    the same loop in a plain process with their own hooks. Methods marked rank 0 are called on
    rank 0 only; `save` and `report` on every rank (checkpoint capture is collective)."""

    def stop_requested(self) -> bool:
        """Rank 0, once per executed step, without blocking: should the run stop now?"""
        return False

    def emit(self, row: dict[str, Any]) -> None:
        """Rank 0: the metrics of one trained step (data position `row["step"]`)."""

    def save(self, state: TrainState | None, row: dict[str, Any]) -> None:
        """Every rank: a checkpoint of the job (the full state on rank 0, None elsewhere)."""

    def report(self, row: dict[str, Any]) -> None:
        """Every rank: a metrics report between checkpoints (every `report_every` steps, if set)."""

    def after_step(self, engine: Any, row: dict[str, Any]) -> None:
        """Every rank: the engine now holds the state after data position `row["step"]` (e.g.
        to evaluate it). Not called for the probe steps that did not win."""

    def finish(self) -> None:
        """Rank 0: the loop ended."""

    def failed(self) -> None:
        """Rank 0: the loop is ending with an error (raised after this returns)."""


def run_loop(engine: Any, spec: JobSpec, plan: Plan, device: torch.device, *, rank: int, world: int,
             dataset: Any, start: TrainState | None, stop_at: int | None, hooks: LoopHooks,
             study_path: str | None = None) -> None:
    """Train from `start` (None: from scratch) until the job's budget of `total_steps` compute
    steps is spent, `stop_at` compute steps are done, or the host asks to stop; every way out
    saves a checkpoint. With `JobSpec.lr` an `AutoLRS`, the steps are driven stage by stage by
    the tuner (`tidal.jobs.autolrs`); otherwise the LR is the job's schedule at each step."""
    step = start.step if start is not None else 0
    extra = dict(start.extra) if start is not None else {}
    loop = _Loop(engine, spec, plan, device, rank=rank, world=world, dataset=dataset, hooks=hooks,
                 step=step, compute=int(extra.get("compute", step)), extra=extra)
    end = spec.total_steps if stop_at is None else min(spec.total_steps, stop_at)
    try:
        if spec.autolrs is None:
            loop.plain(end)
        else:
            loop.autolrs(end, study_path)
    except BaseException:
        if rank == 0:
            hooks.failed()
        raise
    if rank == 0:
        hooks.finish()


class _Loop:
    """The step loop's state: data position, compute steps (probes included), the stop flag."""

    def __init__(self, engine: Any, spec: JobSpec, plan: Plan, device: torch.device, *, rank: int,
                 world: int, dataset: Any, hooks: LoopHooks, step: int, compute: int,
                 extra: dict[str, Any]) -> None:
        self.engine, self.spec, self.plan, self.device = engine, spec, plan, device
        self.rank, self.world, self.dataset, self.hooks = rank, world, dataset, hooks
        self.sampler = StepSampler(len(dataset), spec.global_batch, spec.seed)
        self.step, self.compute, self.extra = step, compute, extra
        self.stop_requested = False  # rank 0's view
        self.stop_requested_globally = False  # every rank's, after a step's all-reduce
        self.tuner: Any = None  # the AutoLRS tuner, whose state every checkpoint carries
        self.flag = torch.zeros(2, dtype=torch.float32, device=device)

    def execute(self, position: int, lr: float) -> tuple[float, bool, float]:
        """One optimizer step at data position `position`: (global mean loss, stop now, seconds).

        The all-reduce of the loss carries rank 0's stop flag, so every rank stops together."""
        t0 = time.perf_counter()
        local = train_step(self.engine, self.spec, self.plan, self.dataset, self.sampler, position,
                           self.rank, self.device, lr)
        if self.rank == 0:
            self.stop_requested = self.stop_requested or self.hooks.stop_requested()
        self.flag[0] = local
        self.flag[1] = 1.0 if self.stop_requested else 0.0
        dist.all_reduce(self.flag)
        self.compute += 1
        stop = bool(self.flag[1] > 0)
        self.stop_requested_globally = self.stop_requested_globally or stop
        return float(self.flag[0]) / self.world, stop, time.perf_counter() - t0

    def row(self, step: int, loss: float, lr: float, dt: float) -> dict[str, Any]:
        b = self.spec.global_batch
        return {"step": step, "loss": loss, "lr": lr, "step_time_s": dt, "samples_per_s": b / dt,
                "samples": step * b, "compute_steps": self.compute, "probe_steps": self.compute - step,
                "time": time.time(), "plan": self.plan.short()}

    def save(self, row: dict[str, Any]) -> None:
        """A checkpoint of the engine's current state at data position `self.step`."""
        self.extra["compute"] = self.compute
        if self.tuner is not None:
            self.extra["autolrs"] = self.tuner.state.to_dict()
        state = capture_state(self.engine, step=self.step, seed=self.spec.seed, rank=self.rank,
                              extra=self.extra)
        if state is not None:
            state.meta = {"job": self.spec.name, "plan": self.plan.to_dict(), "loss": row["loss"],
                          "global_batch": self.spec.global_batch, "compute_steps": self.compute}
            if (shape := model_config(self.engine.module)) is not None:
                state.meta["model"] = shape
        self.hooks.save(state, row)

    def save_without_row(self, lr: float) -> None:
        """A checkpoint at a point no trained step's metrics describe (a search's boundary)."""
        self.save({"step": self.step, "loss": float("nan"), "lr": lr, "compute_steps": self.compute})

    def trained(self, loss: float, lr: float, dt: float, end: int, stop: bool) -> bool:
        """Book one trained step (data position advances); True if the loop must end."""
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"non-finite loss at step {self.step + 1}: {loss}")
        self.step += 1
        row = self.row(self.step, loss, lr, dt)
        if self.rank == 0:
            self.hooks.emit(row)
        self.hooks.after_step(self.engine, row)
        last = self.compute >= end or stop
        if last or self.step % self.spec.checkpoint_every == 0:
            self.save(row)
        elif self.spec.report_every is not None and self.step % self.spec.report_every == 0:
            self.hooks.report(row)
        return last

    def plain(self, end: int) -> None:
        schedule = self.spec.lr_schedule()
        while self.compute < end:
            lr = schedule.at(self.step)
            loss, stop, dt = self.execute(self.step, lr)
            if self.trained(loss, lr, dt, end, stop):
                return

    def broadcast(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.broadcast(t, src=0)
        return float(t[0])

    def snapshot(self) -> TrainState:
        """The full state on every rank (probes restore it locally)."""
        state = capture_state(self.engine, step=self.step, seed=self.spec.seed, rank=self.rank,
                              all_ranks=True)
        assert state is not None
        return state

    def autolrs(self, end: int, study_path: str | None) -> None:
        from tidal.jobs.autolrs import Tuner, TunerState

        cfg = self.spec.autolrs
        assert cfg is not None
        saved = self.extra.get("autolrs")
        # every rank runs the tuner (the same decisions from the same broadcast losses); rank 0
        # alone mirrors the stages into the study file (two ranks creating it at once race:
        # "table studies already exists")
        tuner = self.tuner = Tuner(cfg, seed=self.spec.seed, budget=self.spec.total_steps,
                                   study_path=study_path if self.rank == 0 else None,
                                   state=TunerState.from_dict(saved) if saved else None)
        if tuner.state.ranging and not self.range_test(tuner, end):
            return  # the budget or a stop request ended it, checkpoint saved
        while self.step < tuner.warmup_steps and self.compute < end:  # before the first stage
            lr = tuner.warmup_lr(self.step)
            loss, stop, dt = self.execute(self.step, lr)
            if self.trained(loss, lr, dt, end, stop):
                return
        while self.compute < end:
            if tuner.state.searching and not self.search(tuner, end):
                return  # stopped in the middle of the search, checkpoint saved
            while self.step < tuner.stage_end and self.compute < end:
                lr = tuner.lr_at(self.step)
                loss, stop, dt = self.execute(self.step, lr)
                tuner.observe(lr, loss)
                if self.trained(loss, lr, dt, end, stop):
                    return
            if self.step >= tuner.stage_end:
                tuner.next_stage(self.step, self.compute)  # planned on the budget left
        # the budget ran out right after a search: checkpoint where the winner's probe ended
        self.save_without_row(tuner.lr)

    def range_test(self, tuner: Any, end: int) -> bool:
        """The LR range test (`tidal.jobs.autolrs`): the swept LRs from the initial state, which
        is then restored, so its steps are losing probes. Like a probe it is not cut by a stop
        request (≤ 100 steps), only by reaching `end` compute steps, after which a resume runs it
        again; False: the run ends after it, checkpointed (with its result if it finished)."""
        from tidal.jobs.autolrs import sweep_diverged

        start = self.snapshot()
        losses: list[float] = []
        lrs = tuner.sweep()
        for i, lr in enumerate(lrs):
            loss, _, _ = self.execute(self.step + i, lr)
            losses.append(loss)
            if sweep_diverged(losses) or self.compute >= end:
                break
        restore_state(self.engine, start)
        if len(losses) == len(lrs) or sweep_diverged(losses):
            tuner.tell_range(losses)
        if self.stop_requested_globally or self.compute >= end:
            self.save_without_row(tuner.lr)
            return False
        return True

    def probe(self, position: int, steps: int, lr: float,
              end: int | None) -> list[tuple[float, float, float]]:
        """Up to `steps` steps from `position` with `lr`: (loss, lr, seconds) per step. Cut short
        only by reaching `end` compute steps (None: never): a stop request is honoured when the
        probe ends (≤ τ′ steps later), so a reconfiguration wastes no probe steps and the
        resumed stage spends its budget exactly as an uninterrupted one."""
        rows = []
        for i in range(steps):
            loss, _, dt = self.execute(position + i, lr)
            rows.append((loss, lr, dt))
            if end is not None and self.compute >= end:
                break
        return rows

    def search(self, tuner: Any, end: int) -> bool:
        """Run the stage's remaining probes and pick the winner. False: stopped part-way, the
        stage's starting state checkpointed with the finished trials (a resume redoes only the
        unfinished one)."""
        st = tuner.state
        start = self.snapshot()
        best: tuple[TrainState, list[tuple[float, float, float]]] | None = None
        first = True
        while not tuner.search_done():
            lr = self.broadcast(tuner.ask() if self.rank == 0 else 0.0)
            if not first:
                restore_state(self.engine, start)
            first = False
            rows = self.probe(st.stage_start, st.probe_len, lr, end)
            if len(rows) == st.probe_len and tuner.tell(lr, [r[0] for r in rows]):
                best = (self.snapshot(), rows)
            if self.stop_requested_globally or self.compute >= end:
                restore_state(self.engine, start)
                self.save_without_row(lr)
                return False
        win = tuner.choose()
        if best is not None and best[1][0][1] == win:
            restore_state(self.engine, best[0])
            rows = best[1]
        else:  # the winner's end state is not at hand (probed before a resume, or the observed
            # incumbent, never probed here): its τ′ steps from the stage's start, trained now
            restore_state(self.engine, start)
            rows = self.probe(st.stage_start, st.probe_len, win, None)
        for loss, lr, dt in rows:  # the winner's probe steps are the stage's first steps
            tuner.observe(lr, loss)
            self.step += 1
            row = self.row(self.step, loss, lr, dt)
            if self.rank == 0:
                self.hooks.emit(row)
        self.hooks.after_step(self.engine, row)
        return True


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Everything a worker needs, passed through `train_loop_config`."""

    spec: JobSpec
    plan: Plan
    run_id: str
    resume_from: str | None  # a checkpoint directory, or None for a fresh start
    stop_at_step: int | None  # stop (with a checkpoint) once this many steps are done
    control: Any  # ActorHandle of the run's RunControl
    use_cuda: bool
    threads_per_worker: int
    heartbeat_s: float = 1.0  # rank 0 sends buffered metrics (and learns of a stop) this often
    study_path: str | None = None  # the job's AutoLRS studies (SQLite), if it tunes its LR


def _poll(pending: Any) -> tuple[bool, bool]:
    """(resolved, stop_requested) for an in-flight heartbeat, without blocking."""
    import ray

    ready, _ = ray.wait([pending], timeout=0)
    if not ready:
        return False, False
    return True, bool(ray.get(ready[0]))


def train_loop(config: dict[str, Any]) -> None:
    """The Ray Train V2 training function (`TorchTrainer(train_loop_per_worker=...)`)."""
    import ray
    import ray.train

    cfg: WorkerConfig = config["worker"]
    spec, plan = cfg.spec, cfg.plan
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if world != plan.dp:
        raise PlanError("plan", f"plan {plan.short()} needs {plan.dp} workers, the run has {world}")
    cfg.control.register.remote(rank, ray.get_runtime_context().get_node_id())
    yield_cpu_to_serving(cfg.use_cuda)
    set_host_threads(cfg.threads_per_worker, cfg.use_cuda)
    if cfg.use_cuda:
        device = torch.device("cuda", ctx.get_local_rank() if torch.cuda.device_count() > 1 else 0)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    engine = build_engine(spec, plan, device)
    restart = ray.train.get_checkpoint()  # set when Ray Train restarts us after a failure
    state: TrainState | None = None
    if restart is not None:
        with restart.as_directory() as d:
            state = TrainState.load(d)
    elif cfg.resume_from:
        state = TrainState.load(cfg.resume_from)
    if state is not None:
        # A failure inside restore is fatal for this run (the engine may be half-loaded);
        # the checkpoint itself is never modified, so the job's state is safe.
        restore_state(engine, state)

    hooks = _RayHooks(cfg, rank)
    run_loop(engine, spec, plan, device, rank=rank, world=world, dataset=spec.dataset(), start=state,
             stop_at=cfg.stop_at_step, hooks=hooks, study_path=cfg.study_path)


class _RayHooks(LoopHooks):
    """The loop's host inside Ray Train: rank 0 sends metrics rows to the run's control actor in
    batches (at most one call in flight, one per `heartbeat_s`) and learns of a stop from its
    answer; checkpoints go through `ray.train.report`, with the run's rows so far."""

    def __init__(self, cfg: WorkerConfig, rank: int) -> None:
        self.cfg, self.rank = cfg, rank
        self.pending: Any = None
        self.stop = False
        self.buffered: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []  # every row of this run, for its checkpoints
        self.last_beat = -float("inf")
        self.wall0 = time.time()

    def stop_requested(self) -> bool:
        if self.pending is not None:
            resolved, stop = _poll(self.pending)
            if resolved:
                self.pending = None
                self.stop = self.stop or stop
        if self.pending is None and time.monotonic() - self.last_beat >= self.cfg.heartbeat_s:
            self.pending = self.cfg.control.heartbeat.remote(self.buffered)
            self.buffered, self.last_beat = [], time.monotonic()
        return self.stop

    def emit(self, row: dict[str, Any]) -> None:
        self.buffered.append(row)
        self.rows.append(row)

    def report(self, row: dict[str, Any]) -> None:
        import ray.train

        ray.train.report(_scalars(row))

    def save(self, state: TrainState | None, row: dict[str, Any]) -> None:
        import ray.train

        if self.rank != 0 or state is None:
            ray.train.report(_scalars(row))
            return
        state.meta["wall_s"] = time.time() - self.wall0
        with tempfile.TemporaryDirectory(prefix="tidal-ckpt-") as tmp:
            state.save(tmp)
            # the run's per-step metrics so far: the job's curve survives the loss of everything
            # but its newest checkpoint, older ones being deleted (tidal.jobs.checkpoint.read_metrics)
            (Path(tmp) / METRICS_FILE).write_text(json.dumps(self.rows))
            name = _checkpoint_name(state.step, int(row.get("compute_steps", state.step)))
            ray.train.report(_scalars(row), checkpoint=ray.train.Checkpoint.from_directory(tmp),
                             checkpoint_dir_name=name)

    def _send_buffered(self, timeout: float | None = None) -> None:
        import ray

        if self.buffered:
            ray.get(self.cfg.control.heartbeat.remote(self.buffered), timeout=timeout)

    def finish(self) -> None:
        import ray

        if self.pending is not None:
            ray.get(self.pending)
        self._send_buffered()

    def failed(self) -> None:
        """The rows not sent yet reach the control actor, so a failed job keeps its curve up to
        the step that raised (measured: a loss that went NaN at step 30 left none of its 29 steps,
        which were still buffered). Bounded, and its own errors are dropped: the run ends with
        the loop's error, not this one's."""
        try:
            self._send_buffered(timeout=10)
        except Exception as e:  # the control actor gone or slow: only the curve is lost
            log.warning("rank 0 could not send its last %d metrics rows: %s", len(self.buffered), e)


def _checkpoint_name(step: int, compute: int) -> str:
    """`step_<data position>`, plus `_c<compute steps>` when probes made them differ (an AutoLRS
    job may checkpoint the same position twice: before and after a stage's search)."""
    name = f"step_{step:08d}"
    return name if compute == step else f"{name}_c{compute:08d}"


def _scalars(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
