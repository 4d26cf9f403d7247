"""What runs inside each Ray Train worker: build the DeepSpeed engine for a plan, train, report.

One optimizer step under plan (dp, micro_batch mb, grad_accum g), on worker r:

    idx   = sampler.shard(step, r, dp)                  # this worker's B/dp samples of step k
    for m in 0..g-1:  loss_m = loss(model, idx[m·mb:(m+1)·mb]);  engine.backward(loss_m)
    engine.step()                                       # DeepSpeed averages over g and dp

DeepSpeed scales each micro-batch loss by 1/g and averages gradients over dp ranks, so the
update is the gradient of the mean loss over the same B samples under every plan. The loss
reported for step k is that same global mean: mean_m(loss_m) all-reduced over ranks / dp.
The all-reduce also carries the stop flag (rank 0 polls the run's control actor without
blocking), so stopping costs no extra collective and all ranks stop after the same step.
Rank 0 sends the per-step metrics to the control actor in batches, at most one call in flight
and one per `heartbeat_s`: on a busy host every actor call takes CPU from training.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tidal.jobs.checkpoint import METRICS_FILE, TrainState, capture_state, restore_state
from tidal.jobs.data import StepSampler
from tidal.jobs.ds_config import deepspeed_config
from tidal.jobs.spec import JobSpec, Plan, PlanError

log = logging.getLogger("tidal.worker")


def init_world_of_one(backend: str = "gloo") -> None:
    """A torch.distributed group of this process alone (rank 0 of 1) on a free local port:
    what a DeepSpeed engine needs outside Ray Train (single-worker profiles, unit tests)."""
    import os
    import socket

    import deepspeed

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    deepspeed.init_distributed(dist_backend=backend)


def step_seed(seed: int, step: int) -> int:
    """The RNG seed of optimizer step k: a function of (seed, k) only."""
    return (seed * 1_000_003 + step * 7919 + 12345) % (2**63 - 1)


def build_engine(spec: JobSpec, plan: Plan, device: torch.device) -> Any:
    """A DeepSpeed engine for `plan`; every rank builds the same initial weights from `seed`."""
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    torch.manual_seed(spec.seed)
    model = spec.model()
    if plan.activation_checkpointing:
        setter = getattr(model, "set_activation_checkpointing", None)
        if setter is None:
            raise PlanError(
                "Plan.activation_checkpointing",
                f"model {type(model).__name__} has no set_activation_checkpointing(bool)",
            )
        setter(True)
    model.to(device)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=deepspeed_config(spec, plan)
    )
    return engine


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def set_lr(engine: Any, lr: float) -> None:
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


def train_step(engine: Any, spec: JobSpec, plan: Plan, dataset: Any, sampler: StepSampler,
               step: int, rank: int, device: torch.device) -> torch.Tensor:
    """One optimizer step; returns this rank's mean micro-batch loss (a 0-d tensor)."""
    from torch.utils.data import default_collate

    torch.manual_seed(step_seed(spec.seed, step))
    set_lr(engine, spec.lr_schedule().at(step))
    idx = sampler.shard(step, rank, plan.dp)
    total = torch.zeros((), dtype=torch.float32, device=device)
    for m in range(plan.grad_accum):
        chunk = idx[m * plan.micro_batch : (m + 1) * plan.micro_batch]
        batch = _to_device(default_collate([dataset[int(i)] for i in chunk]), device)
        loss = spec.loss(engine, batch)
        engine.backward(loss)
        engine.step()
        total += loss.detach().float()
    return total / plan.grad_accum


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
    torch.set_num_threads(max(1, cfg.threads_per_worker))
    if cfg.use_cuda:
        device = torch.device("cuda", ctx.get_local_rank() if torch.cuda.device_count() > 1 else 0)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    engine = build_engine(spec, plan, device)
    start = 0
    extra: dict[str, Any] = {}
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
        start, extra = state.step, state.extra

    dataset = spec.dataset()
    sampler = StepSampler(len(dataset), spec.global_batch, spec.seed)
    end = spec.total_steps if cfg.stop_at_step is None else min(spec.total_steps, cfg.stop_at_step)
    pending: Any = None
    buffered: list[dict[str, Any]] = []
    since_checkpoint: list[dict[str, Any]] = []  # rank 0's metrics, saved with the next checkpoint
    stop_requested = False
    flag = torch.zeros(2, dtype=torch.float32, device=device)
    wall0 = time.time()
    last_beat = -float("inf")
    step = start
    while step < end:
        t0 = time.perf_counter()
        local = train_step(engine, spec, plan, dataset, sampler, step, rank, device)
        if rank == 0 and pending is not None:
            resolved, stop = _poll(pending)
            if resolved:
                pending = None
                stop_requested = stop_requested or stop
        flag[0] = local
        flag[1] = 1.0 if stop_requested else 0.0
        dist.all_reduce(flag)
        loss = float(flag[0]) / world
        stop_now = bool(flag[1] > 0)
        step += 1
        dt = time.perf_counter() - t0
        metrics = {
            "step": step, "loss": loss, "lr": spec.lr_schedule().at(step - 1),
            "step_time_s": dt, "samples_per_s": spec.global_batch / dt,
            "samples": step * spec.global_batch, "time": time.time(), "plan": plan.short(),
        }
        if rank == 0:
            buffered.append(metrics)
            since_checkpoint.append(metrics)
            if pending is None and time.monotonic() - last_beat >= cfg.heartbeat_s:
                pending = cfg.control.heartbeat.remote(buffered)
                buffered, last_beat = [], time.monotonic()
        last = step >= end or stop_now
        if last or step % spec.checkpoint_every == 0:
            _report_with_checkpoint(engine, spec, plan, step, rank, metrics, extra, wall0, since_checkpoint)
            since_checkpoint = []
        elif step % spec.report_every == 0:
            ray.train.report(_scalars(metrics))
        if stop_now:
            break
    if rank == 0:
        if pending is not None:
            ray.get(pending)
        if buffered:
            ray.get(cfg.control.heartbeat.remote(buffered))


def _scalars(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}


def _report_with_checkpoint(engine: Any, spec: JobSpec, plan: Plan, step: int, rank: int,
                            metrics: dict[str, Any], extra: dict[str, Any], wall0: float,
                            recent: list[dict[str, Any]]) -> None:
    import ray.train

    state = capture_state(engine, step=step, seed=spec.seed, rank=rank, extra=extra)
    if rank != 0:
        ray.train.report(_scalars(metrics))
        return
    assert state is not None
    state.meta = {"job": spec.name, "plan": plan.to_dict(), "loss": metrics["loss"],
                  "global_batch": spec.global_batch, "wall_s": time.time() - wall0}
    with tempfile.TemporaryDirectory(prefix="tidal-ckpt-") as tmp:
        state.save(tmp)
        # the per-step metrics since the previous checkpoint: the job's curve survives the loss
        # of everything but its checkpoints (tidal.jobs.checkpoint.read_metrics)
        (Path(tmp) / METRICS_FILE).write_text(json.dumps(recent))
        ray.train.report(_scalars(metrics), checkpoint=ray.train.Checkpoint.from_directory(tmp),
                         checkpoint_dir_name=f"step_{step:08d}")
