"""The scheduler's settings and names: what every client needs to find it, and what it runs with.

`SchedulerConfig` validates itself on construction, so a bad setting fails in one line naming
it before an actor starts with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tidal.core.correction import CorrectionConfig
from tidal.core.fields import require_int, require_number
from tidal.core.policy import PolicyConfig
from tidal.planner.jobplan import ProfileConfig
from tidal.serving.loans import LoanConfig

SCHEDULER_NAME = "tidal-scheduler"  # the actor's name, in namespace NAMESPACE
NAMESPACE = "tidal"


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    tick_s: float = 2.0  # seconds between reconcile steps (a submit or a run's end wakes the loop at once)
    state_path: str | None = None  # SQLite file; default $TIDAL_STATE/tidal.sqlite
    profile_samples: int = 4  # plans profiled per job (≤ 8)
    profile_steps: int = 2  # measured steps per profiled plan
    profile_gpus: float = 1.0  # GPUs per profiling worker (0 profiles on CPUs)
    use_cuda: bool = False  # profiles run on CUDA (False: on the CPU, the GPUs logical)
    gpu_mem_gib: float = 80.0  # one GPU's memory: the memory model refuses plans that exceed it
    cpus_per_worker: float = 1.0  # CPUs a training worker reserves beside its GPU
    # what the policy charges a restart or start: None measures it from this scheduler's own runs
    # (`tidal.core.restarts`: median stop + median launch → first step; 30 s until measured); a
    # number pins it
    restart_cost_s: float | None = None
    # Ray Train's own restarts of a crashed worker group; 0: every fault comes back to the
    # scheduler, which requeues the job from its newest checkpoint (counted in `restarts`) and
    # may place it elsewhere (the node may be gone)
    max_failures: int = 0
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # the policy's settings (below)
    # the loan manager, in Serve replicas (one GPU each) per tick: replica_rps=1 makes its rates
    # replica counts; lead_s: checkpoint + stop + a replica's start. Its min_replicas (1) is the
    # availability floor lending never takes: the demand is Serve's need, which is 0 at no traffic
    loans: LoanConfig = field(default_factory=lambda: LoanConfig(replica_rps=1.0, interval_s=2.0,
                                                                 lead_s=15.0))
    max_infra_restarts: int = 10  # requeues after infrastructure failures before a job FAILS
    # a run that executes no step for this long (from its launch before its first) is hung: its
    # workers are killed and the job resumes from its newest checkpoint, an infrastructure failure
    # (`_watch`). Longer than a checkpoint's write and a run's start-up (a large model's load).
    # An admission's sizing that takes longer, or its profiles longer than this per plan plus
    # one, is hung too: killed, and the admission starts again (`Admission.overdue`)
    stall_s: float = 900.0
    max_admission_attempts: int = 3  # admission tasks lost to the cluster before a job is REJECTED
    release_grace_s: float = 20.0  # a stopped run's GPUs count as Tidal's this long (Ray frees them late)
    # each job's predictions corrected by its measured samples/s (None: the model as fitted)
    correction: CorrectionConfig | None = field(default_factory=CorrectionConfig)
    # ask Ray's autoscaler for the nodes waiting jobs need (tidal.core.autoscale.node_request)
    autoscale: bool = True
    # the autoscaler's config (a cluster-launcher YAML, parsed: `tidal start --autoscaling-config`):
    # admission sizes jobs against the alive nodes plus the training nodes it may still launch
    # (`capacity.launchable_gpus`); None: the alive nodes only
    autoscaling_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        """Settings the scheduler cannot run with fail here, in one line naming the setting,
        before an actor starts with them (a negative tick spins the loop; a negative pinned
        restart cost makes every restart look like a gain to the policy)."""
        r = self.restart_cost_s
        if r is not None and not (0.0 <= r < math.inf):
            raise ValueError(f"SchedulerConfig.restart_cost_s must be None (measured) or seconds >= 0, "
                             f"got {r!r}")
        for name, lo, strict in (("tick_s", 0.0, True), ("gpu_mem_gib", 0.0, True),
                                 ("cpus_per_worker", 0.0, True), ("profile_gpus", 0.0, False),
                                 ("release_grace_s", 0.0, False), ("stall_s", 0.0, True)):
            require_number(f"SchedulerConfig.{name}", getattr(self, name), lo, strict=strict)
        for name, lo, hi in (("profile_samples", 1, 8), ("profile_steps", 1, None), ("max_failures", 0, None),
                             ("max_infra_restarts", 0, None), ("max_admission_attempts", 1, None)):
            require_int(f"SchedulerConfig.{name}", getattr(self, name), lo, hi)

    def profiling(self) -> ProfileConfig:
        return ProfileConfig(samples=self.profile_samples, steps=self.profile_steps,
                             gpus_per_worker=self.profile_gpus, use_cuda=self.use_cuda,
                             cpus_per_gpu=self.cpus_per_worker)
