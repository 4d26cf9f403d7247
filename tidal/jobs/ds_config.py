"""Render a `Plan` (and the job's optimizer settings) as a DeepSpeed config dict.

The optimizer is always `torch.optim.AdamW` (`"torch_adam": true`): the same update rule under
every ZeRO stage and offload choice, so switching plans mid-job cannot change the numerics, and
on CPU machines it avoids JIT-compiling FusedAdam / DeepSpeedCPUAdam (minutes, see
STACK-NOTES.md). With optimizer offload DeepSpeed would insist on its own CPU Adam;
`zero_force_ds_cpu_optimizer: false` lets the torch optimizer run on the offloaded partition.

The LR in the config is a placeholder: the runner sets each group's LR before every step from
the job's schedule (`tidal.jobs.lr`), so no DeepSpeed scheduler is configured.
"""

from __future__ import annotations

from typing import Any

from tidal.jobs.spec import JobSpec, Plan


def deepspeed_config(spec: JobSpec, plan: Plan) -> dict[str, Any]:
    spec.check_plan(plan)
    zero: dict[str, Any] = {"stage": plan.zero_stage}
    if plan.zero_stage >= 1:
        # Deterministic reduction order; overlap only matters for throughput on real GPUs.
        zero.update({"contiguous_gradients": True, "overlap_comm": False})
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if plan.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    if plan.zero_stage == 3:
        # Gather every parameter for the forward of this small model; no persistence threshold
        # tricks, so the partitioning is the same on every world size.
        zero.update({"stage3_param_persistence_threshold": 0})
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": spec.grad_clip,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": spec.lr_schedule().at(0),
                "betas": list(spec.betas),
                "eps": 1e-8,
                "weight_decay": spec.weight_decay,
                "torch_adam": True,
            },
        },
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if spec.precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config
