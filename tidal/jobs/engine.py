"""One DeepSpeed engine and one optimizer step, the same under every plan.

One optimizer step under plan (dp, micro_batch mb, grad_accum g), on worker r (`train_step`):

    idx   = sampler.shard(step, r, dp)                  # this worker's B/dp samples of step k
    for m in 0..g-1:  loss_m = loss(model, idx[m·mb:(m+1)·mb]);  engine.backward(loss_m)
    engine.step()                                       # DeepSpeed averages over g and dp

DeepSpeed scales each micro-batch loss by 1/g and averages gradients over dp ranks, so the
update is the gradient of the mean loss over the same B samples under every plan; the RNG of
step k is seeded by (seed, k) alone (`step_seed`). Used by the training loop
(`tidal.jobs.worker`), the profiler, benchmarks and tests alike.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist

from tidal.jobs import actckpt
from tidal.jobs.data import StepSampler
from tidal.jobs.ds_config import deepspeed_config
from tidal.jobs.spec import JobSpec, Plan, PlanError


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


# a training worker's OS priority on logical GPUs (`yield_cpu_to_serving`): the lowest there is.
# Ray starts every worker process at nice 15 (its `worker_niceness`), Serve's replicas too, and an
# unprivileged process can only lower its own priority, so training goes below Serve's
CPU_TRAINING_NICE = 19


def yield_cpu_to_serving(use_cuda: bool) -> None:
    """On logical GPUs, lower this training worker's OS priority to `CPU_TRAINING_NICE`: on one
    machine training's threads share the cores with Serve's replicas, which a real GPU would
    isolate from them, and inference must not pay for a loan (a starved replica makes Serve ask
    for more replicas at a third of their capacity, and misses the SLO). Linux keeps a priority
    per thread, so every thread the process has is lowered (those it starts later inherit it).
    Called in Ray Train's worker actors only, whose processes end with the run; a pooled task
    worker (a profile) would keep the priority for the tasks it runs next."""
    if not use_cuda:
        renice_threads(CPU_TRAINING_NICE, lower_only=True)


def renice_threads(nice: int, *, lower_only: bool = False, pid: int | None = None) -> bool:
    """Set every thread of this process (or of process `pid`) to `nice` (`lower_only`: leave
    those already lower in priority); threads started later inherit their creator's. False if
    the OS refused (raising a priority needs root or CAP_SYS_NICE) or has no per-thread
    priorities."""
    import os

    if not hasattr(os, "setpriority"):
        return False
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{'self' if pid is None else pid}/task")]
    except OSError:  # no procfs (this thread only), or the process is gone
        threads = [0] if pid is None else []
    for tid in threads:
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            if now != nice and not (lower_only and now >= nice):
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except PermissionError:
            return False
        except OSError:  # a thread that ended meanwhile
            pass
    return True


def set_host_threads(cpus: float, use_cuda: bool) -> int:
    """Set and return this worker's CPU threads: torch's intra-op pool and the OpenMP pool of
    DeepSpeed's CPU Adam (a C++ op with its own `libgomp`, which reads `OMP_NUM_THREADS` when
    the op loads; Ray sets that variable to the task's CPUs, 1 for a one-CPU worker).

    On the CPU (logical GPUs) a worker gets the CPUs it reserved. On a GPU a worker gets at least
    its share of the node's CPUs, CPUs ÷ GPUs as the node declared them to Ray (`ray start
    --num-cpus/--num-gpus`; not `torch.cuda.device_count()`, which Ray narrows to the worker's own
    GPUs): Ray reserves one CPU per GPU worker, but a GPU node's cores are there to feed its GPUs,
    and under optimizer offload the Adam step of every parameter runs on them (CPU Adam on one
    thread is t times slower than on t)."""
    import os

    import ray

    n = max(1, int(cpus))
    if use_cuda:
        here = ray.get_runtime_context().get_node_id()
        res: dict[str, float] = next(
            (node["Resources"] for node in ray.nodes() if node["NodeID"] == here), {})
        n = max(n, int(res.get("CPU", 1) // max(1.0, res.get("GPU", 1))))
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
    return n


def step_seed(seed: int, step: int) -> int:
    """The RNG seed of optimizer step k: a function of (seed, k) only."""
    return (seed * 1_000_003 + step * 7919 + 12345) % (2**63 - 1)


def build_engine(spec: JobSpec, plan: Plan, device: torch.device,
                 config: dict[str, Any] | None = None) -> Any:
    """A DeepSpeed engine for `plan`; every rank builds the same initial weights from `seed`.
    `config`: the DeepSpeed config, default `deepspeed_config` for the device."""
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    torch.manual_seed(spec.seed)
    model = spec.model()
    if plan.activation_checkpointing:
        try:
            actckpt.set_enabled(model, True)
        except ValueError as e:
            raise PlanError("Plan.activation_checkpointing", str(e)) from None
    model.to(device)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config=config or deepspeed_config(spec, plan, "cuda" if device.type == "cuda" else "cpu")
    )
    return engine


def to_device(batch: Any, device: torch.device) -> Any:
    """A batch (a tensor, or lists, tuples and dicts of them) moved to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def set_lr(engine: Any, lr: float) -> None:
    """Every parameter group of the engine's optimizer at learning rate `lr`."""
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


def train_step(engine: Any, spec: JobSpec, plan: Plan, dataset: Any, sampler: StepSampler,
               step: int, rank: int, device: torch.device, lr: float | None = None) -> torch.Tensor:
    """One optimizer step at data position `step` with learning rate `lr` (default: the job's
    schedule); returns this rank's mean micro-batch loss (a 0-d tensor)."""
    from torch.utils.data import default_collate

    torch.manual_seed(step_seed(spec.seed, step))
    set_lr(engine, spec.lr_schedule().at(step) if lr is None else lr)
    idx = sampler.shard(step, rank, plan.dp)
    total = torch.zeros((), dtype=torch.float32, device=device)
    for m in range(plan.grad_accum):
        chunk = idx[m * plan.micro_batch : (m + 1) * plan.micro_batch]
        batch = to_device(default_collate([dataset[int(i)] for i in chunk]), device)
        loss = spec.loss(engine, batch)
        engine.backward(loss)
        engine.step()
        total += loss.detach().float()
    return total / plan.grad_accum
