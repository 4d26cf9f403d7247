"""The SDK types of a reconfigurable job: `Plan`, `PlanSpace` and `JobSpec`.

A job is *reconfigurable*: the user states what must stay fixed (model, data, loss, the global
batch in samples, the number of steps, the LR schedule) and what the platform may choose (GPU
count between `min_gpus` and `max_gpus`, and any plan in `plans`). Because the global batch is
fixed and the samples of step k depend on (seed, k) only, every plan trains the same model:
plans differ in speed and memory, never in the result.

Everything is validated when it is built, before any work starts: a bad spec raises a
`SpecError` (a `ValueError`) that names the offending field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tidal.jobs.autolrs import AutoLRS
from tidal.jobs.lr import LRSchedule, constant

ZERO_STAGES = (0, 1, 2, 3)
Precision = Literal["fp32", "bf16"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class SpecError(ValueError):
    """A job spec or plan is invalid. `field` names what is wrong (e.g. `JobSpec.min_gpus`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type[SpecError], tuple[str, str]]:
        # pickled with both arguments: Ray sends an actor's exception to the caller by pickle,
        # and the default (its one formatted arg) cannot be unpickled (UnserializableException)
        return type(self), (self.field, self.message)


class PlanError(SpecError):
    """A plan is invalid, or not allowed / not runnable for a job."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """An execution plan: how a job's fixed global batch is computed on `dp` workers.

    global batch = dp × micro_batch × grad_accum (samples per optimizer step).

    `tp` and `pp` (tensor/pipeline degrees) exist so the planner can reason about 3D plans
    (Rubick and Galvatron plan over them); the runner executes only tp = pp = 1 and says so.
    """

    dp: int
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_param: bool = False
    activation_checkpointing: bool = False
    micro_batch: int = 1
    grad_accum: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "micro_batch", "grad_accum", "tp", "pp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(f"Plan.{name}", f"must be an integer >= 1, got {value!r}")
        if self.zero_stage not in ZERO_STAGES or isinstance(self.zero_stage, bool):
            raise PlanError(
                "Plan.zero_stage",
                f"unknown ZeRO stage {self.zero_stage!r} (expected one of 0, 1, 2, 3)",
            )
        if self.offload_optimizer and self.zero_stage < 2:
            raise PlanError(
                "Plan.offload_optimizer",
                f"optimizer offload needs ZeRO stage 2 or 3, got stage {self.zero_stage}",
            )
        if self.offload_param and self.zero_stage != 3:
            raise PlanError(
                "Plan.offload_param",
                f"parameter offload needs ZeRO stage 3, got stage {self.zero_stage}",
            )

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batch * self.grad_accum

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def runnable(self) -> bool:
        """Whether Tidal's runner can execute this plan (data parallel + ZeRO only)."""
        return self.tp == 1 and self.pp == 1

    def short(self) -> str:
        """A compact label, e.g. `dp2-z2o-ac-mb4x2`."""
        z = f"z{self.zero_stage}" + ("o" if self.offload_optimizer else "")
        z += "p" if self.offload_param else ""
        parts = [f"dp{self.dp}", z]
        if self.tp > 1 or self.pp > 1:
            parts.append(f"tp{self.tp}pp{self.pp}")
        if self.activation_checkpointing:
            parts.append("ac")
        parts.append(f"mb{self.micro_batch}x{self.grad_accum}")
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dp": self.dp,
            "zero_stage": self.zero_stage,
            "offload_optimizer": self.offload_optimizer,
            "offload_param": self.offload_param,
            "activation_checkpointing": self.activation_checkpointing,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "tp": self.tp,
            "pp": self.pp,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class PlanSpace:
    """The plans a job allows. `micro_batches=None` allows every micro-batch size."""

    zero_stages: tuple[int, ...] = ZERO_STAGES
    offload_optimizer: tuple[bool, ...] = (False, True)
    offload_param: tuple[bool, ...] = (False, True)
    activation_checkpointing: tuple[bool, ...] = (False, True)
    micro_batches: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.zero_stages:
            raise SpecError("PlanSpace.zero_stages", "must allow at least one ZeRO stage")
        for s in self.zero_stages:
            if s not in ZERO_STAGES or isinstance(s, bool):
                raise SpecError(
                    "PlanSpace.zero_stages",
                    f"unknown ZeRO stage {s!r} (expected a subset of 0, 1, 2, 3)",
                )
        for name in ("offload_optimizer", "offload_param", "activation_checkpointing"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, bool) for v in values):
                raise SpecError(f"PlanSpace.{name}", f"must be a non-empty tuple of bools, got {values!r}")
        if self.micro_batches is not None and (
            not self.micro_batches
            or any(not isinstance(m, int) or isinstance(m, bool) or m < 1 for m in self.micro_batches)
        ):
            raise SpecError(
                "PlanSpace.micro_batches",
                f"must be None or a non-empty tuple of integers >= 1, got {self.micro_batches!r}",
            )

    def allows(self, plan: Plan) -> str | None:
        """None if `plan` is in this space, else the reason it is not."""
        if plan.zero_stage not in self.zero_stages:
            return f"ZeRO stage {plan.zero_stage} not in allowed {self.zero_stages}"
        if plan.offload_optimizer not in self.offload_optimizer:
            return "optimizer offload not allowed"
        if plan.offload_param not in self.offload_param:
            return "parameter offload not allowed"
        if plan.activation_checkpointing not in self.activation_checkpointing:
            return "activation checkpointing setting not allowed"
        if self.micro_batches is not None and plan.micro_batch not in self.micro_batches:
            return f"micro-batch {plan.micro_batch} not in allowed {self.micro_batches}"
        return None

    def micro_batch_choices(self, per_worker_batch: int) -> list[int]:
        """Allowed micro-batch sizes that divide a worker's share of the global batch."""
        divisors = [m for m in range(1, per_worker_batch + 1) if per_worker_batch % m == 0]
        if self.micro_batches is None:
            return divisors
        return [m for m in divisors if m in self.micro_batches]


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A reconfigurable training job.

    model:    factory returning a fresh `torch.nn.Module` (called on every worker, after the
              RNG is seeded with `seed`, so every worker and every plan starts from the same
              weights). Plans with activation checkpointing need a module that implements
              `set_activation_checkpointing(enabled: bool)` or a Hugging Face model that
              supports it (`tidal.jobs.actckpt`).
    dataset:  factory returning a map-style dataset (`__len__`, `__getitem__`) whose items
              `torch.utils.data.default_collate` can batch.
    loss:     `loss(model, batch) -> scalar tensor`, the *mean* loss over the micro-batch.
    global_batch: samples per optimizer step, fixed for the whole job under every plan.
    min_gpus / max_gpus: the GPU counts (= data-parallel degrees) the platform may give it.
    plans:    the plan space the platform may choose from.
    plan:     the user's own plan (the guarantee is stated against it), optional.
    guaranteed: if True, the scheduler keeps the job at least at the throughput of
              `plan` on `requested_gpus` (Rubick's guarantee).
    checkpoint_every: steps between checkpoints (each is a `ray.train.report`).
    keep_checkpoints: the checkpoints each run keeps in storage, the newest (Ray Train's
              `CheckpointConfig.num_to_keep`; None keeps all). Each holds the full fp32 state
              (12 bytes a parameter: 18 GB for a 1.5B model), so keeping all of them filled a
              disk; two, so that a half-written newest one leaves a complete one. The scheduler
              also removes a job's earlier runs once a newer run holds its checkpoint.
    report_every: None (default), or also send metrics to Ray Train every this many steps.
              Tidal's own metrics (every step's loss, LR, time) reach the scheduler without
              them. Each `ray.train.report` waits for Ray Train's controller to take the
              previous one, and it polls every 2 s (`RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`):
              measured here, reports every 5 steps made a 8 ms step cost 0.37 s.
    lr:       a float (constant), an `LRSchedule`, or "autolrs" / `AutoLRS(...)`: the LR is
              found by a range test, tuned stage by stage and annealed to zero by the end of
              the budget inside the job (`tidal.jobs.autolrs`); its range test's and probes'
              steps count against `total_steps`, the job's budget of optimizer steps.
    resume_from: None (from step 0), or a Tidal checkpoint directory (a `step_*` directory
              under `$TIDAL_STORAGE` that an earlier job wrote) to start from: its weights,
              Adam moments, step (the data position) and in-job tuner state, under this spec's
              plan space, LR and `total_steps`. `tidal resume JOB` submits an ended job again
              from its newest complete checkpoint this way. The scheduler checks it when the
              job is submitted (`tidal.jobs.storage.resume_point`).
    runtime_env: None, or a Ray `runtime_env` dict (`working_dir`, `py_modules`, `pip`,
              `env_vars`, ...) every process that runs the job's code gets: the dry run, the
              admission's sizing and profiles, every Train worker. A local `working_dir` or
              `py_modules` directory is zipped when the job is submitted and kept in the runs'
              storage (`tidal.jobs.codeship`), so a node that has never seen the code, a
              job that queues for hours and a restarted Ray all find it. `tidal submit FILE.py`
              sets `working_dir` to FILE's directory unless the spec names one.
    """

    name: str
    model: Callable[[], Any]
    dataset: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    global_batch: int
    total_steps: int
    min_gpus: int = 1
    max_gpus: int = 1
    plans: PlanSpace = field(default_factory=PlanSpace)
    plan: Plan | None = None
    requested_gpus: int | None = None
    guaranteed: bool = False
    lr: float | LRSchedule | AutoLRS | str = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    precision: Precision = "fp32"
    seed: int = 0
    checkpoint_every: int = 50
    keep_checkpoints: int | None = 2
    report_every: int | None = None
    eval_dataset: Callable[[], Any] | None = None
    resume_from: str | None = None
    runtime_env: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise SpecError(
                "JobSpec.name",
                f"must be 1-63 characters of letters, digits, '_', '.', '-', got {self.name!r}",
            )
        for name in ("model", "dataset", "loss"):
            value = getattr(self, name)
            if value is None:
                raise SpecError(f"JobSpec.{name}", "missing factory (got None)")
            if not callable(value):
                raise SpecError(f"JobSpec.{name}", f"must be callable, got {type(value).__name__}")
        if self.eval_dataset is not None and not callable(self.eval_dataset):
            raise SpecError("JobSpec.eval_dataset", "must be callable or None")
        if self.runtime_env is not None and not (
                isinstance(self.runtime_env, dict) and all(isinstance(k, str) for k in self.runtime_env)):
            raise SpecError("JobSpec.runtime_env", "must be a Ray runtime_env dict (working_dir, pip, ...) "
                                                   f"or None, got {self.runtime_env!r}")
        if isinstance(self.resume_from, os.PathLike):
            object.__setattr__(self, "resume_from", os.fspath(self.resume_from))
        if self.resume_from is not None and not (isinstance(self.resume_from, str) and self.resume_from):
            raise SpecError("JobSpec.resume_from",
                            f"must be a checkpoint directory (a path) or None, got {self.resume_from!r}")
        counts = ("global_batch", "total_steps", "min_gpus", "max_gpus", "checkpoint_every")
        optional = tuple(n for n in ("report_every", "keep_checkpoints") if getattr(self, n) is not None)
        for name in counts + optional:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"JobSpec.{name}", f"must be an integer >= 1, got {value!r}")
        if self.min_gpus > self.max_gpus:
            raise SpecError(
                "JobSpec.min_gpus",
                f"min_gpus ({self.min_gpus}) > max_gpus ({self.max_gpus})",
            )
        if self.min_gpus > self.global_batch:
            raise SpecError("JobSpec.min_gpus", f"min_gpus ({self.min_gpus}) > global_batch "
                                                f"({self.global_batch}): every GPU needs a sample per step")
        if not isinstance(self.plans, PlanSpace):
            raise SpecError("JobSpec.plans", f"must be a PlanSpace, got {type(self.plans).__name__}")
        if self.precision not in ("fp32", "bf16"):
            raise SpecError("JobSpec.precision", f"must be 'fp32' or 'bf16', got {self.precision!r}")
        if isinstance(self.lr, str) and self.lr != "autolrs":
            raise SpecError("JobSpec.lr", f"the only named LR tuner is 'autolrs', got {self.lr!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float, LRSchedule, AutoLRS, str)):
            raise SpecError("JobSpec.lr",
                            f"must be a float, an LRSchedule, 'autolrs' or an AutoLRS, got {self.lr!r}")
        if isinstance(self.lr, (int, float)) and not self.lr > 0:
            raise SpecError("JobSpec.lr", f"must be > 0, got {self.lr!r}")
        if not (0 <= self.betas[0] < 1 and 0 <= self.betas[1] < 1):
            raise SpecError("JobSpec.betas", f"must lie in [0, 1), got {self.betas!r}")
        if self.weight_decay < 0:
            raise SpecError("JobSpec.weight_decay", f"must be >= 0, got {self.weight_decay!r}")
        if self.grad_clip < 0:
            raise SpecError("JobSpec.grad_clip", f"must be >= 0 (0 disables), got {self.grad_clip!r}")
        if self.requested_gpus is not None and not (
            self.min_gpus <= self.requested_gpus <= self.max_gpus
        ):
            raise SpecError(
                "JobSpec.requested_gpus",
                f"{self.requested_gpus} is outside [min_gpus, max_gpus] = "
                f"[{self.min_gpus}, {self.max_gpus}]",
            )
        if not self.feasible_plans_exist():
            mbs = "any" if self.plans.micro_batches is None else str(self.plans.micro_batches)
            raise SpecError(
                "JobSpec.global_batch",
                f"no micro_batch × grad_accum × dp produces global_batch={self.global_batch} "
                f"with dp in [{self.min_gpus}, {self.max_gpus}] and micro_batch in {mbs}",
            )
        if self.plan is not None:
            reason = self.plan_error(self.plan)
            if reason is not None:
                raise PlanError("JobSpec.plan", reason)
        if self.guaranteed and (self.plan is None or self.requested_gpus is None):
            raise SpecError(
                "JobSpec.guaranteed",
                "a guaranteed job needs its own `plan` and `requested_gpus` (the guarantee is "
                "the throughput of that plan on those GPUs)",
            )

    # -- plan checks --------------------------------------------------------------------------

    def dp_degrees(self) -> list[int]:
        """Data-parallel degrees that can produce the global batch."""
        return [
            dp
            for dp in range(self.min_gpus, self.max_gpus + 1)
            if self.global_batch % dp == 0
            and self.plans.micro_batch_choices(self.global_batch // dp)
        ]

    def feasible_plans_exist(self) -> bool:
        return bool(self.dp_degrees())

    def plan_error(self, plan: Plan) -> str | None:
        """None if the job may run `plan`, else why not."""
        if plan.global_batch != self.global_batch:
            return (
                f"plan {plan.short()} computes a global batch of {plan.global_batch} "
                f"(dp × micro_batch × grad_accum), the job's is {self.global_batch}"
            )
        if not self.min_gpus <= plan.num_gpus <= self.max_gpus:
            return (
                f"plan {plan.short()} uses {plan.num_gpus} GPUs, outside [min_gpus, max_gpus] = "
                f"[{self.min_gpus}, {self.max_gpus}]"
            )
        if not plan.runnable:
            return f"plan {plan.short()} uses tensor/pipeline parallelism, which the runner cannot execute"
        return self.plans.allows(plan)

    def check_plan(self, plan: Plan) -> None:
        reason = self.plan_error(plan)
        if reason is not None:
            raise PlanError("plan", reason)

    @property
    def autolrs(self) -> AutoLRS | None:
        """The AutoLRS settings if the job tunes its LR, else None."""
        if isinstance(self.lr, AutoLRS):
            return self.lr
        return AutoLRS() if self.lr == "autolrs" else None

    def lr_schedule(self) -> LRSchedule:
        """The LR per step; for an AutoLRS job, the LR the optimizer is built with (the tuner
        sets every step's LR itself)."""
        tuner = self.autolrs
        if tuner is not None:
            return constant(tuner.initial_lr)
        if isinstance(self.lr, LRSchedule):
            return self.lr
        assert isinstance(self.lr, (int, float))
        return constant(float(self.lr))


def plans_for(spec: JobSpec, dp: int, *, stages: Sequence[int] | None = None) -> list[Plan]:
    """Every plan the job allows on `dp` workers (runnable plans only), in a stable order."""
    if spec.global_batch % dp != 0:
        return []
    per_worker = spec.global_batch // dp
    out: list[Plan] = []
    for stage in stages if stages is not None else spec.plans.zero_stages:
        if stage not in spec.plans.zero_stages:
            continue
        for off_opt in spec.plans.offload_optimizer:
            if off_opt and stage < 2:
                continue
            for off_par in spec.plans.offload_param:
                if off_par and stage != 3:
                    continue
                for ac in spec.plans.activation_checkpointing:
                    for mb in spec.plans.micro_batch_choices(per_worker):
                        out.append(
                            Plan(dp=dp, zero_stage=stage, offload_optimizer=off_opt,
                                 offload_param=off_par, activation_checkpointing=ac,
                                 micro_batch=mb, grad_accum=per_worker // mb)
                        )
    return [p for p in out if spec.plan_error(p) is None]
