"""From a job to a `JobModel`: choose sample plans, profile them, fit both models.

    samples  = selection.select(plans the job allows on 1..N GPUs, k)     (≤ 8, well-posed)
    records  = profiler.profile(spec, samples)                           (real engines, cached)
    perf fit = perfmodel.fit(records' fwd / bwd+sync / opt / iter times)
    mem fit  = memory.fit_memory(records' peaks)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidal.jobs.spec import JobSpec, Plan, SpecError, plans_for
from tidal.planner.memory import fit_memory
from tidal.planner.perfmodel import Fit, Hardware, Sample, Workload, fit
from tidal.planner.planner import JobModel, packed, point_of
from tidal.planner.profiler import ProfileRecord, meta_model, profile
from tidal.planner.selection import select


def model_shape(spec: JobSpec) -> tuple[int, int, int]:
    """(Ψ, largest layer's parameters, number of layers) of the job's model."""
    import torch

    model = meta_model(spec)
    params = [p for p in model.parameters() if p.requires_grad]
    lists = [len(m) for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return sum(p.numel() for p in params), max(p.numel() for p in params), max(lists, default=1)


def sample_plans(spec: JobSpec, max_gpus: int, k: int, gpus_per_node: int) -> list[Plan]:
    """At most k plans to profile, on 1..max_gpus GPUs, chosen for a well-posed fit."""
    candidates: list[tuple[Plan, Any]] = []
    for n in range(spec.min_gpus, min(max_gpus, spec.max_gpus) + 1):
        shape = packed(n, gpus_per_node)
        candidates += [(p, point_of(p, shape)) for p in plans_for(spec, n)]
    return [p for p, _ in select(candidates, lambda c: c[1], k)]


class ProfilesFailed(SpecError):
    """Every profile of the job failed (its rows say why): the job cannot be planned."""


@dataclass(frozen=True, kw_only=True)
class Fitted:
    model: JobModel
    perf: Fit
    records: list[ProfileRecord]


def fit_job(spec: JobSpec, records: list[ProfileRecord], *, gpus_per_node: int,
            hw: Hardware | None = None) -> Fitted:
    ok = [r for r in records if r.status == "ok"]
    if not ok:
        raise ProfilesFailed("JobSpec", f"no profile of job {spec.name} succeeded: "
                           + "; ".join(f"{r.plan.short()}: {r.status}" for r in records))
    # a CPU profile's host and "device" are the same cores: their work adds, never overlaps
    hw = hw or Hardware(cpu_threads_per_gpu=1, async_device=any(r.device == "cuda" for r in ok))
    psi, largest, layers = model_shape(spec)
    work = Workload(params=psi, global_batch=spec.global_batch,
                    grad_bytes=2 if spec.precision == "bf16" else 4)
    samples = [Sample(point=point_of(r.plan, packed(r.plan.dp, gpus_per_node)), iter_s=r.iter_s,
                      fwd_s=r.fwd_s, sync_s=r.bwd_s, opt_s=r.opt_s) for r in ok]
    perf = fit(samples, work, hw)
    # The counted checkpointing ratio describes live tensor bytes, what a GPU's allocator peak
    # measures; a CPU profile's peak is resident-set growth, which does not follow them (on the
    # CPU table checkpointing saves 17% of it where the count says 66%): textbook tie there.
    ratios = sorted(r.ckpt_ratio for r in ok if r.ckpt_ratio > 0 and r.device == "cuda")
    mem = fit_memory([(r.plan, r.peak_bytes) for r in ok], params=psi, largest_layer_params=largest,
                     n_layer=layers, gpus_per_node=gpus_per_node, precision=spec.precision,
                     ckpt_ratio=ratios[len(ratios) // 2] if ratios else None)
    return Fitted(model=JobModel(work=work, theta=perf.theta, mem=mem, precision=spec.precision),
                  perf=perf, records=records)


def profile_and_fit(spec: JobSpec, plans: list[Plan], *, gpus_per_node: int, use_cuda: bool = False,
                    steps: int = 3, progress: bool = True, gpus_per_worker: float = 1.0) -> Fitted:
    """Profile `plans` (from `sample_plans`) and fit both models."""
    records = profile(spec, plans, hardware="cuda" if use_cuda else "cpu", use_cuda=use_cuda,
                      steps=steps, progress=progress, gpus_per_worker=gpus_per_worker)
    return fit_job(spec, records, gpus_per_node=gpus_per_node)
