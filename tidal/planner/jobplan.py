"""The planner's one entry: `plan_job(spec, cluster, cfg) -> JobPlan`.

Both `tidal plan` (which prints the ranked plans on N GPUs) and the scheduler's admission (which
runs it as a Ray task off the actor and queues the job with its resource matrix) call it:

    check_fits(spec, cluster)            cheap, no model: GPU counts the job could ever get
    plans    = profile_plans(spec, ...)  ≤ cfg.samples plans on 1..min(N, cfg.max_profile_gpus)
    records  = profile(spec, plans)      real DeepSpeed engines, cached per (workload, plan, hw)
    fitted   = fit_job(spec, records)    performance + memory models
    require_feasible(...)                NoFeasiblePlan (a SpecError) naming the closest miss
    options  = [best_plan(spec, fitted, packed(n)) for each GPU count n]   Rubick's matrix
    guarantee = samples/s of the spec's own plan on requested_gpus (guaranteed jobs)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tidal.core.fields import require_int, require_number
from tidal.core.policy import Option
from tidal.jobs.spec import JobSpec, Plan, SpecError, plans_for
from tidal.planner.fitting import Fitted, fit_job, sample_plans
from tidal.planner.planner import ResourceShape, best_plan, packed, require_feasible, score
from tidal.planner.profiler import profile, uncached


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The GPUs a job may ever get: every GPU node's size (not what is free now)."""

    node_gpus: tuple[int, ...]
    gpu_mem_gib: float = 80.0

    @property
    def total(self) -> int:
        return sum(self.node_gpus)

    @property
    def per_node(self) -> int:
        return max(self.node_gpus, default=0)


@dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    samples: int = 4  # plans profiled per job (≤ 8)
    steps: int = 2  # measured steps per profile
    gpus_per_worker: float = 1.0  # GPUs per profiling worker (0 profiles on CPUs)
    use_cuda: bool = False
    max_profile_gpus: int | None = 2  # profiles run on at most this many GPUs (None: the cluster)
    cpus_per_gpu: float = 1.0  # what a training worker takes beside its GPU (the options' CPUs)

    def __post_init__(self) -> None:
        """Refuse, naming the field, what would only fail inside the profiling workers (steps 0:
        an IndexError per plan) or ask Ray for negative resources."""
        require_int("ProfileConfig.samples", self.samples, 1, 8)
        require_int("ProfileConfig.steps", self.steps, 1)
        m = self.max_profile_gpus
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"ProfileConfig.max_profile_gpus must be None (the cluster) or an integer >= 1, "
                             f"got {m!r}")
        require_number("ProfileConfig.gpus_per_worker", self.gpus_per_worker, 0.0, strict=False)
        require_number("ProfileConfig.cpus_per_gpu", self.cpus_per_gpu, 0.0, strict=False)

    @property
    def hardware(self) -> str:
        return "cuda" if self.use_cuda else "cpu"


@dataclass(frozen=True, kw_only=True)
class JobPlan:
    options: tuple[Option, ...]  # best plan and samples/s per GPU count, GPUs increasing
    guarantee: float | None  # a guaranteed job's samples/s with its own plan on requested_gpus
    fitted: Fitted


def gpu_counts(spec: JobSpec, cluster: Cluster) -> list[int]:
    """The GPU counts the job may run on here: within [min_gpus, max_gpus], at most the cluster's
    GPUs, and dividing the global batch (data-parallel workers split it evenly)."""
    top = min(spec.max_gpus, cluster.total)
    return [n for n in range(spec.min_gpus, top + 1) if spec.global_batch % n == 0 and plans_for(spec, n)]


def check_fits(spec: JobSpec, cluster: Cluster) -> None:
    """The cheap checks (no model built): a SpecError naming the field when the job can never run
    on this cluster."""
    if not cluster.node_gpus:
        raise SpecError("cluster", "the Ray cluster has no node with GPUs")
    if spec.min_gpus > cluster.total:
        raise SpecError("JobSpec.min_gpus", f"needs {spec.min_gpus} GPUs, the cluster has {cluster.total}")
    if not gpu_counts(spec, cluster):
        raise SpecError("JobSpec.global_batch",
                        f"no GPU count in [{spec.min_gpus}, {min(spec.max_gpus, cluster.total)}] divides "
                        f"the global batch {spec.global_batch} with a plan the job allows")


def profile_plans(spec: JobSpec, cluster: Cluster, cfg: ProfileConfig) -> list[Plan]:
    """The plans to profile (`fitting.sample_plans`: chosen for a well-posed fit)."""
    top = min(spec.max_gpus, cluster.total)
    if cfg.max_profile_gpus is not None:  # never below the job's own minimum: it runs on no fewer
        top = min(top, max(cfg.max_profile_gpus, spec.min_gpus))
    return sample_plans(spec, top, cfg.samples, cluster.per_node)


def to_measure(spec: JobSpec, cluster: Cluster, cfg: ProfileConfig) -> list[tuple[Plan, str]]:
    """The profiles `plan_job` would measure (the others are cached), each with its cache entry's
    name (`profiler.uncached`); builds the model once."""
    return uncached(spec, profile_plans(spec, cluster, cfg), hardware=cfg.hardware, steps=cfg.steps)


def plan_job(spec: JobSpec, cluster: Cluster, cfg: ProfileConfig, *,
             node_ids: tuple[str, ...] | None = None, progress: bool = False,
             require: bool = True) -> JobPlan:
    """Profile, fit and plan the job (see the module docstring). `node_ids` pins the profile
    workers (worker i to node_ids[i]: capacity the scheduler reserved for them); `progress`
    prints a line per profile; `require=False` returns empty options instead of raising
    NoFeasiblePlan (`tidal plan` shows every plan with why it does not fit)."""
    check_fits(spec, cluster)
    plans = profile_plans(spec, cluster, cfg)
    records = profile(spec, plans, hardware=cfg.hardware, use_cuda=cfg.use_cuda, steps=cfg.steps,
                      progress=progress, gpus_per_worker=cfg.gpus_per_worker, node_ids=node_ids)
    fitted = fit_job(spec, records, gpus_per_node=cluster.per_node)
    mem = cluster.gpu_mem_gib * 2**30
    shapes = [packed(n, cluster.per_node, gpu_mem_bytes=mem) for n in gpu_counts(spec, cluster)]
    if require:
        require_feasible(spec, fitted.model, shapes)  # raises NoFeasiblePlan with the reason
    options = []
    for shape in shapes:
        c = best_plan(spec, fitted.model, shape)
        if c is not None:
            options.append(Option(gpus=shape.num_gpus, plan=c.plan, samples_per_s=c.samples_per_s,
                                  cpus_per_gpu=cfg.cpus_per_gpu))
    broken = [o for o in options if not 0.0 < o.samples_per_s < math.inf]  # NaN fails both
    if broken:  # the scheduler's policy refuses such options: reject the job, not every round
        raise SpecError("profile", f"the model fitted from the profiles predicts {broken[0].samples_per_s} "
                                   f"samples/s for {broken[0].plan.short()}")
    guarantee = None
    if spec.guaranteed and spec.plan is not None and spec.requested_gpus is not None:
        own: ResourceShape = packed(spec.requested_gpus, cluster.per_node, gpu_mem_bytes=mem)
        guarantee = score(spec.plan, fitted.model, own).samples_per_s
    return JobPlan(options=tuple(options), guarantee=guarantee, fitted=fitted)
