"""Best plan per resources: enumerate a job's plans on a resource shape, predict, rank.

For a shape (GPUs per node, GPU memory, host memory, bandwidths) every plan the job allows is
enumerated (`tidal.jobs.spec.plans_for`: dp = GPUs, each allowed ZeRO stage / offload /
activation checkpointing, each micro-batch that divides the per-GPU batch), its memory is
checked (`memory.infeasibility`) and its throughput predicted by the fitted performance model:

    samples/s = B / T_iter(plan, placement)

`best_plan` avoids scoring every micro-batch: for a fixed (stage, offload, checkpointing),
T_iter falls as the micro-batch grows (fewer per-micro-batch overheads, k_fwd0 · g) while
activation memory grows, so the best micro-batch is the largest that fits; it is found by
binary search over the sorted divisors. `rank_plans` scores everything (the brute force the
tests compare against, and what `tidal plan` prints). `resource_matrix` is Rubick's matrix:
the best plan and its throughput for every GPU count (packed onto as few nodes as possible).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidal.jobs.spec import JobSpec, Plan, Precision, SpecError, plans_for
from tidal.planner.memory import ModelStats, estimate, infeasibility
from tidal.planner.perfmodel import Hardware, PlanPoint, Theta, Workload, predict


@dataclass(frozen=True, kw_only=True)
class ResourceShape:
    gpus_per_node: tuple[int, ...]
    gpu_mem_bytes: float = 80 * 2**30
    host_mem_per_node: float = 1600 * 2**30
    cpu_threads_per_gpu: int = 4
    hw: Hardware = field(default_factory=Hardware)

    @property
    def num_gpus(self) -> int:
        return sum(self.gpus_per_node)

    @property
    def nodes(self) -> int:
        return sum(1 for g in self.gpus_per_node if g > 0)


def packed(num_gpus: int, gpus_per_node: int, **kw: object) -> ResourceShape:
    """`num_gpus` GPUs on as few nodes of `gpus_per_node` GPUs as possible."""
    full, rest = divmod(num_gpus, gpus_per_node)
    shape = (gpus_per_node,) * full + ((rest,) if rest else ())
    return ResourceShape(gpus_per_node=shape, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class JobModel:
    """What the planner knows of a job: its fitted performance model and memory statistics."""

    work: Workload
    theta: Theta
    mem: ModelStats
    precision: Precision = "bf16"


@dataclass(frozen=True, kw_only=True)
class PlanChoice:
    plan: Plan
    samples_per_s: float
    iter_s: float
    peak_gpu_bytes: float
    host_bytes: float
    infeasible: str | None  # None if it fits, else why not

    @property
    def feasible(self) -> bool:
        return self.infeasible is None


def point_of(plan: Plan, shape: ResourceShape) -> PlanPoint:
    return PlanPoint(gpus_per_node=shape.gpus_per_node, dp=plan.dp, tp=plan.tp, pp=plan.pp,
                     zero_stage=plan.zero_stage, offload=plan.offload_optimizer,
                     offload_param=plan.offload_param,
                     act_ckpt=plan.activation_checkpointing, grad_accum=plan.grad_accum,
                     cpu_threads=shape.cpu_threads_per_gpu)


def score(plan: Plan, model: JobModel, shape: ResourceShape) -> PlanChoice:
    gpn = max(shape.gpus_per_node)
    est = estimate(plan, model.mem, gpus_per_node=gpn, nodes=shape.nodes, precision=model.precision)
    why = infeasibility(plan, model.mem, gpu_bytes=shape.gpu_mem_bytes,
                        host_bytes_per_node=shape.host_mem_per_node, gpus_per_node=gpn,
                        nodes=shape.nodes, precision=model.precision)
    t = predict(model.theta, model.work, point_of(plan, shape), shape.hw).iter
    return PlanChoice(plan=plan, samples_per_s=model.work.global_batch / t, iter_s=t,
                      peak_gpu_bytes=est.gpu_peak, host_bytes=est.host_bytes, infeasible=why)


def rank_plans(spec: JobSpec, model: JobModel, shape: ResourceShape) -> list[PlanChoice]:
    """Every allowed plan on `shape`, feasible ones first, fastest first (brute force)."""
    choices = [score(p, model, shape) for p in plans_for(spec, shape.num_gpus)]
    return sorted(choices, key=lambda c: (not c.feasible, *_key(c)))


def _key(c: PlanChoice) -> tuple[float, str]:
    """Order of preference: faster first, then by label (a deterministic tie-break)."""
    return -c.samples_per_s, c.plan.short()


def best_plan(spec: JobSpec, model: JobModel, shape: ResourceShape) -> PlanChoice | None:
    """The fastest feasible plan on `shape`, or None if no allowed plan fits."""
    n = shape.num_gpus
    if spec.global_batch % n or not spec.min_gpus <= n <= spec.max_gpus:
        return None
    groups: dict[tuple[int, bool, bool, bool], list[Plan]] = {}
    for p in plans_for(spec, n):
        groups.setdefault((p.zero_stage, p.offload_optimizer, p.offload_param,
                           p.activation_checkpointing), []).append(p)
    best: PlanChoice | None = None
    for plans in groups.values():
        plans.sort(key=lambda p: p.micro_batch)
        lo, hi = 0, len(plans) - 1  # largest feasible micro-batch: feasibility is monotone
        found: PlanChoice | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            c = score(plans[mid], model, shape)
            if c.feasible:
                found, lo = c, mid + 1
            else:
                hi = mid - 1
        if found is not None and (best is None or _key(found) < _key(best)):
            best = found
    return best


def resource_matrix(spec: JobSpec, model: JobModel, *, gpus_per_node: int,
                    **shape_kw: object) -> dict[int, PlanChoice]:
    """Rubick's resource matrix: GPU count → best feasible plan (packed placement)."""
    out: dict[int, PlanChoice] = {}
    for n in range(spec.min_gpus, spec.max_gpus + 1):
        c = best_plan(spec, model, packed(n, gpus_per_node, **shape_kw))
        if c is not None:
            out[n] = c
    return out


class NoFeasiblePlan(SpecError):
    """No plan the job allows fits any resource shape it could get."""


def require_feasible(spec: JobSpec, model: JobModel, shapes: list[ResourceShape]) -> None:
    """Reject a job that fits no plan on any of `shapes`, naming the closest miss."""
    ranked = [c for shape in shapes for c in rank_plans(spec, model, shape)]
    if any(c.feasible for c in ranked):
        return
    if not ranked:
        raise NoFeasiblePlan("JobSpec", f"job {spec.name}: no allowed plan on {len(shapes)} shape(s)")
    closest = min(ranked, key=lambda c: c.peak_gpu_bytes)
    raise NoFeasiblePlan(
        "JobSpec", f"job {spec.name} fits no plan; the smallest, {closest.plan.short()}, "
                   f"fails on {closest.infeasible}"
    )
