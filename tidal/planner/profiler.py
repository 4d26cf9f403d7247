"""Profile a job for a few steps under sample plans, on real DeepSpeed engines in Ray.

Each plan runs in a fresh process (STACK-NOTES: engines built one after another in one
process keep memory alive, so later peak readings would be wrong): a Ray task that exits
after one call for dp = 1, a Ray Train `TorchTrainer` for dp > 1. Every step is timed in parts:

    forward   Σ over micro-batches of loss(model, batch)
    backward  Σ of engine.backward (gradient reduction under ZeRO-2/3 happens in its hooks)
    optimizer the engine.step at the accumulation boundary (clip, Adam, ZeRO all-gather)
    iteration the whole step

after `warmup` unmeasured steps; the step with the median iteration time is kept, with its
parts (so they add up within one step). On a GPU every time stamp waits for the device
(`torch.cuda.synchronize()`): kernels run asynchronously, and without it the forward would
measure only its launches and the backward would absorb its kernels (the price: a
launch-bound model loses some CPU/GPU overlap, so its profiled step is a little slower than
training's). Peak memory is
`torch.cuda.max_memory_allocated()` on a GPU; on a CPU it is the worker's peak resident set
(`ru_maxrss`) minus its resident set just before the engine was built, i.e. what the engine,
its optimizer and training added. Results are cached per (workload, plan, hardware) in
`profile_cache()` as JSON: a workload is the model, the shape of its samples, the loss,
the global batch and the precision (`workload_key`), so the jobs of a sweep profile once.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tidal.jobs import actckpt
from tidal.jobs.data import StepSampler, cache_dir
from tidal.jobs.sealed import opened
from tidal.jobs.spec import JobSpec, Plan

PROFILE_FORMAT = 6  # bump when what a record means changes: old cache entries are not reused
# (3: GPU parts timed with a device synchronize at every stamp; 4: ckpt_ratio; 5: plain plans'
# optimizer step is torch's fused AdamW on the CPU too, `tidal.jobs.ds_config`; 6: keyed by the
# workload, not the job's name)


@dataclass(frozen=True, kw_only=True)
class ProfileRecord:
    plan: Plan
    status: str  # "ok", "oom", or "error: ..."
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    opt_s: float = 0.0
    iter_s: float = 0.0
    peak_bytes: float = 0.0
    device: str = "cpu"
    ckpt_ratio: float = 0.0  # checkpointed ÷ plain activations, counted (0: not counted)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["plan"] = self.plan.to_dict()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProfileRecord:
        return cls(**{**d, "plan": Plan.from_dict(d["plan"])})


def _rss_bytes() -> float:
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0  # Linux: KiB


def _current_rss_bytes() -> float:
    with open("/proc/self/statm") as f:
        return float(f.read().split()[1]) * resource.getpagesize()


def measure(spec: JobSpec, plan: Plan, *, rank: int, steps: int, warmup: int,
            use_cuda: bool) -> ProfileRecord:
    """Time `warmup + steps` optimizer steps of `plan` in this process (torch.distributed up)."""
    import deepspeed  # noqa: F401  (imported before the baseline: not the engine's memory)
    import torch
    from torch.utils.data import default_collate

    from tidal.jobs.engine import build_engine, set_lr, to_device

    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")

    def now() -> float:
        if use_cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    data = spec.dataset()
    sampler = StepSampler(len(data), spec.global_batch, spec.seed)
    base = _current_rss_bytes()
    if use_cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        engine = build_engine(spec, plan, device)
        parts: list[tuple[float, float, float, float]] = []
        for step in range(warmup + steps):
            set_lr(engine, spec.lr_schedule().at(step))
            idx = sampler.shard(step, rank, plan.dp)
            fwd = bwd = opt = 0.0
            t_step = now()
            for m in range(plan.grad_accum):
                chunk = idx[m * plan.micro_batch : (m + 1) * plan.micro_batch]
                batch = to_device(default_collate([data[int(i)] for i in chunk]), device)
                t0 = now()
                loss = spec.loss(engine, batch)
                t1 = now()
                engine.backward(loss)
                t2 = now()
                engine.step()
                t3 = now()
                fwd, bwd, opt = fwd + t1 - t0, bwd + t2 - t1, opt + t3 - t2
            if step >= warmup:
                parts.append((fwd, bwd, opt, now() - t_step))
    except torch.cuda.OutOfMemoryError:
        return ProfileRecord(plan=plan, status="oom", device="cuda")
    peak = float(torch.cuda.max_memory_allocated()) if use_cuda else _rss_bytes() - base
    # after the peak is read: one more forward of one sample, counted (`activations`)
    one = to_device(default_collate([data[int(sampler.shard(0, rank, plan.dp)[0])]]), device)
    ratio = _ckpt_ratio(spec, engine, one)
    # the parts of the median step (medians of each part would not add up to a step)
    fwd, bwd, opt, it = sorted(parts, key=lambda p: p[3])[len(parts) // 2]
    return ProfileRecord(plan=plan, status="ok", fwd_s=fwd, bwd_s=bwd, opt_s=opt, iter_s=it,
                         peak_bytes=peak, device="cuda" if use_cuda else "cpu", ckpt_ratio=ratio)


def _ckpt_ratio(spec: JobSpec, engine: Any, one: Any) -> float:
    """`activations.count_saved` on the engine's model for one sample, with checkpointing off
    for that forward (and restored after); 0.0 if it cannot be counted. Every rank calls it
    (under ZeRO-3 the forward gathers parameters from all of them)."""
    from tidal.planner.activations import count_saved

    model = engine.module
    was = actckpt.is_enabled(model)
    try:
        actckpt.set_enabled(model, False)
        count = count_saved(model, lambda: spec.loss(engine, one))
    except Exception:  # the count is a refinement: a model it cannot follow keeps the textbook tie
        return 0.0
    finally:
        actckpt.set_enabled(model, was)
    return count.ckpt_ratio if count is not None else 0.0


def _single(spec: JobSpec, plan: Plan, steps: int, warmup: int, use_cuda: bool) -> dict[str, Any]:
    """Body of the dp = 1 Ray task: a world of one, then `measure`."""
    from tidal.jobs.engine import init_world_of_one, set_host_threads

    set_host_threads(PROFILE_CPUS_PER_WORKER, use_cuda)
    init_world_of_one("nccl" if use_cuda else "gloo")
    try:
        return measure(spec, plan, rank=0, steps=steps, warmup=warmup, use_cuda=use_cuda).to_json()
    except Exception as e:  # reported as the row's status, not a crash of the profile
        return ProfileRecord(plan=plan, status=f"error: {type(e).__name__}: {e}"[:300]).to_json()


def _multi_loop(config: dict[str, Any]) -> None:
    """Ray Train loop for dp > 1: every rank measures, rank 0 reports its record."""
    import tempfile

    import ray.train

    from tidal.jobs.engine import set_host_threads

    ctx = ray.train.get_context()
    set_host_threads(PROFILE_CPUS_PER_WORKER, config["use_cuda"])
    rec = measure(config["spec"], config["plan"], rank=ctx.get_world_rank(), steps=config["steps"],
                  warmup=config["warmup"], use_cuda=config["use_cuda"])
    rank0 = ctx.get_world_rank() == 0
    with tempfile.TemporaryDirectory() as tmp:
        if rank0:
            Path(tmp, "record.json").write_text(json.dumps(rec.to_json()))
        ray.train.report({"status": rec.status},
                         checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank0 else None)


PROFILE_CPUS_PER_WORKER = 1.0  # each profile worker's logical CPUs (a task, or a Train worker)


def profile_needs(plans: Sequence[Plan], gpus_per_worker: float = 1.0) -> dict[str, float]:
    """Ray resources the largest of these profiles takes at once (one worker per data-parallel
    rank, `PROFILE_CPUS_PER_WORKER` CPUs and `gpus_per_worker` GPUs each)."""
    dp = max((p.dp for p in plans), default=0)
    return {"CPU": dp * PROFILE_CPUS_PER_WORKER, "GPU": dp * gpus_per_worker}


def unschedulable(plans: Sequence[Plan], cluster: Mapping[str, float], *,
                  gpus_per_worker: float = 1.0) -> str | None:
    """Why the largest of these profiles can never start on a cluster with `cluster`'s total
    resources (`ray.cluster_resources()`), or None. Ray keeps such a task or placement group
    pending, without an error, until the cluster grows: on a fixed cluster that is a hang."""
    need = profile_needs(plans, gpus_per_worker)
    short = [f"{need[r]:g} {r}s (has {cluster.get(r, 0.0):g})" for r in need
             if need[r] > cluster.get(r, 0.0) + 1e-9]
    if not short:
        return None
    return (f"profiling a {max(p.dp for p in plans)}-worker plan needs {' and '.join(short)}: "
            f"{PROFILE_CPUS_PER_WORKER:g} CPU and {gpus_per_worker:g} GPU per worker")


def profile_plan(spec: JobSpec, plan: Plan, *, gpus_per_worker: float = 1.0, steps: int = 3,
                 warmup: int = 1, use_cuda: bool = False,
                 node_ids: tuple[str, ...] | None = None) -> ProfileRecord:
    """Profile one plan; `node_ids` (one per worker, at least `plan.dp`) pins its workers."""
    import ray

    spec.check_plan(plan)
    pin = tuple(node_ids[: plan.dp]) if node_ids else None
    if pin is not None and len(pin) < plan.dp:
        raise ValueError(f"profile of {plan.short()}: {len(pin)} node ids for {plan.dp} workers")
    if plan.dp == 1:
        opts: dict[str, Any] = {"num_cpus": PROFILE_CPUS_PER_WORKER, "num_gpus": gpus_per_worker}
        if spec.runtime_env:  # the job's code and packages (else: its caller's env, inherited)
            opts["runtime_env"] = spec.runtime_env
        if pin is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(pin[0], soft=False)
        task = ray.remote(max_calls=1)(_single).options(**opts)
        return ProfileRecord.from_json(ray.get(task.remote(spec, plan, steps, warmup, use_cuda)))
    from tidal.jobs.runner import Resources, make_trainer
    from tidal.jobs.storage import storage_root

    name = f"profile-{spec.name}-{plan.short()}-{time.time_ns()}"
    trainer = make_trainer(
        _multi_loop,
        {"spec": spec, "plan": plan, "steps": steps, "warmup": warmup, "use_cuda": use_cuda},
        Resources(num_workers=plan.dp, gpus_per_worker=gpus_per_worker,
                  cpus_per_worker=PROFILE_CPUS_PER_WORKER, node_ids=pin),
        use_cuda=use_cuda, name=name, runtime_env=spec.runtime_env,
    )
    try:
        result = trainer.fit()
        assert result.checkpoint is not None
        with result.checkpoint.as_directory() as d:
            return ProfileRecord.from_json(json.loads(Path(d, "record.json").read_text()))
    except Exception as e:  # a failed profile is a row with its reason, not a crash
        return ProfileRecord(plan=plan, status=f"error: {type(e).__name__}: {e}"[:300])
    finally:  # the record was all its run kept: every profile used to leave its directory behind
        shutil.rmtree(storage_root() / name, ignore_errors=True)


def meta_model(spec: JobSpec) -> Any:
    """The job's model built on the meta device, to read its shapes: no memory and no
    initialisation (a GPT-2 1.5B takes seconds to build for real); a model that cannot be built
    there is built on the CPU."""
    import torch

    try:
        with torch.device("meta"):
            return spec.model()
    except Exception:
        return spec.model()


def _cache_paths(spec: JobSpec, plans: list[Plan], hardware: str, steps: int,
                 cache: Path | None) -> list[Path]:
    """Each plan's cache file: a hash of (format, the workload (`workload_key`), plan, hardware,
    steps). The model is built once for all of them, on the meta device."""
    workload = workload_key(spec, meta_model(spec))
    root = cache / "profiles" if cache else profile_cache()
    out = []
    for plan in plans:
        raw = json.dumps([PROFILE_FORMAT, workload, plan.to_dict(), hardware, steps], sort_keys=True,
                         default=str)
        out.append(root / f"{hashlib.sha256(raw.encode()).hexdigest()[:24]}.json")
    return out


def profile_cache() -> Path:
    """Where profiles are kept: `$TIDAL_PROFILE_CACHE`, else `$TIDAL_CACHE/profiles`. On a cluster
    of several nodes, a directory every node mounts lets one node's profile serve the others'
    admissions (each node keeps its own otherwise)."""
    env = os.environ.get("TIDAL_PROFILE_CACHE")
    return Path(env) if env else cache_dir() / "profiles"


def workload_key(spec: JobSpec, model: Any) -> list[Any]:
    """What a profile measures besides its plan and hardware: the model (its class, its own
    config, its parameters' shapes, its code: `code_digest`), one sample's tensor shapes and dtypes
    (a sequence length lives in the data, not the weights), the loss, the global batch and the
    precision. Not the job's name, seed or LR: the jobs of a sweep share their profiles. Keyed by
    the job's name before, 16 jobs of one model submitted at once were each profiled, one after
    another (~15 s each on 2 cores), before most of them ran."""
    from tidal.jobs.checkpoint import model_config

    kind = type(model)
    try:
        sample = _signature(spec.dataset()[0])
    except Exception as e:  # its profiles fail and say why (a failed profile is not cached)
        sample = f"unreadable: {type(e).__name__}"
    loss_fn = opened(spec.loss)  # a sealed loss (`tidal.jobs.sealed`): the function it holds
    fn = getattr(loss_fn, "func", loss_fn)  # a functools.partial: the function it calls
    loss = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    return [f"{kind.__module__}.{kind.__qualname__}", model_config(model),
            [tuple(p.shape) for p in model.parameters()], sample, loss,
            spec.global_batch, spec.precision, code_digest(model, fn)]


def code_digest(model: Any, loss: Any) -> str:
    """A hash of the code a profile runs outside PyTorch: the source of each module class of the
    model that PyTorch does not define, of the `forward` each module really calls (a patched
    one included: `Attention.forward = flash_forward`, or one set on an instance), and of the
    loss. Two models of one class, config and shapes whose code differs then measure apart.
    Code without a source file to read (a job file's classes reach the admission task pickled
    by value) is its bytecode (`_bytecode`); a built-in is its name."""
    import inspect

    def source(obj: Any) -> str:
        try:
            return inspect.getsource(obj)
        except (OSError, TypeError):
            fns = ([v for _, v in sorted(vars(obj).items()) if inspect.isfunction(v)]
                   if isinstance(obj, type) else [obj])
            code = [_bytecode(f.__code__) for f in fns if hasattr(f, "__code__")]
            return f"{getattr(obj, '__qualname__', type(obj).__qualname__)}:{''.join(code)}"

    seen: dict[tuple[type, int], str] = {}  # each (class, forward) read once, however many modules
    for m in model.modules():
        kind = type(m)
        if kind.__module__.split(".")[0] == "torch":
            continue
        fwd = m.__dict__.get("forward", getattr(kind, "forward", None))
        fwd = getattr(fwd, "__func__", fwd)  # a bound method: its function
        if (kind, id(fwd)) not in seen:
            seen[kind, id(fwd)] = source(kind) + (source(fwd) if fwd is not None else "")
    text = "\n".join(sorted(set(seen.values()))) + source(loss)  # in no process's own order
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _bytecode(code: Any) -> str:
    """A code object as text that is the same in every process (its instructions, names and
    constants, nested functions' code included; not its file, lines or address)."""
    consts = [_bytecode(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts]
    return f"{code.co_code.hex()}|{code.co_names}|{code.co_varnames}|{consts}"


def _signature(item: Any) -> Any:
    """A sample's structure with each tensor as its shape and dtype, each number as its type."""
    import torch

    if isinstance(item, torch.Tensor):
        return [list(item.shape), str(item.dtype)]
    if isinstance(item, dict):
        return {str(k): _signature(v) for k, v in sorted(item.items(), key=lambda kv: str(kv[0]))}
    if isinstance(item, (list, tuple)):
        return [_signature(v) for v in item]
    return type(item).__name__


def uncached(spec: JobSpec, plans: list[Plan], *, hardware: str = "cpu", steps: int = 3,
             cache: Path | None = None) -> list[tuple[Plan, str]]:
    """The plans `profile` would have to measure (the others are in the cache), each with its
    cache entry's name: two jobs whose lists share a name would measure the same profile."""
    paths = _cache_paths(spec, plans, hardware, steps, cache)
    return [(p, path.name) for p, path in zip(plans, paths, strict=True) if not path.exists()]


def profile(spec: JobSpec, plans: list[Plan], *, hardware: str = "cpu", steps: int = 3,
            warmup: int = 1, gpus_per_worker: float = 1.0, use_cuda: bool = False,
            cache: Path | None = None, progress: bool = True,
            node_ids: tuple[str, ...] | None = None) -> list[ProfileRecord]:
    """Profile each plan (cached on disk per job, model, plan and hardware); `node_ids` pins
    the workers of the measured ones (worker i of a plan to node_ids[i])."""
    paths = _cache_paths(spec, plans, hardware, steps, cache)
    if paths:
        paths[0].parent.mkdir(parents=True, exist_ok=True)
    out = []
    for i, (plan, path) in enumerate(zip(plans, paths, strict=True), 1):
        if path.exists():
            rec = ProfileRecord.from_json(json.loads(path.read_text()))
            how = "cached"
        else:
            rec = profile_plan(spec, plan, gpus_per_worker=gpus_per_worker, steps=steps,
                               warmup=warmup, use_cuda=use_cuda, node_ids=node_ids)
            if not rec.status.startswith("error"):
                path.write_text(json.dumps(rec.to_json()))
            how = "measured"
        if progress:
            print(f"  profile {i}/{len(plans)} {plan.short():<22} {rec.status:<4} "
                  f"iter {rec.iter_s * 1e3:8.1f} ms  peak {rec.peak_bytes / 2**20:8.1f} MiB  ({how})",
                  flush=True)
        out.append(rec)
    return out
