"""Render a `Plan` (and the job's optimizer settings) as a DeepSpeed config dict, with the
settings that suit the device it runs on.

The optimizer is AdamW with the job's betas, eps and weight decay everywhere; which kernel runs
it depends on where the optimizer state lives:

* **optimizer offload** (ZeRO-Offload, any device): DeepSpeed's `DeepSpeedCPUAdam` (SIMD C++;
  `make setup` prebuilds its op, `DS_BUILD_CPU_ADAM=1`, so no engine JIT-compiles it).
  `torch.optim.AdamW` on the host was 10× slower on an H100 (GPT-2 124M, micro-batch 16: 1.98 s
  per step against DeepSpeed's 0.20 s; `benchmarks/data/gpt2-h100-measurements.csv`), and
  `benchmarks/offload_step.py` measures the gap on this machine's CPU.
* **on a CUDA device**: `torch.optim.AdamW(fused=True)` (one kernel for all tensors; needs no
  DeepSpeed op build), `overlap_comm` (gradient reduction overlapped with the backward),
  pinned host memory for offloaded tensors, and DeepSpeed's default ZeRO-3 persistence
  threshold (small parameters stay gathered).
* **on the CPU** (logical-GPU clusters, tests): `torch.optim.AdamW(fused=True)` too (torch's
  fused CPU kernel), no overlap, no pinning, and ZeRO-3 gathers every parameter (persistence
  threshold 0), so the partitioning is the same on every world size. The fused kernel is several
  times faster than the single-tensor loop `torch.optim.AdamW` runs on CPU tensors by default,
  and changes no loss curve beyond rounding (docs/log/gpu.md has the figures).

Tidal's checkpoints hold the full fp32 weights and both Adam moments with the step count
(`tidal.jobs.checkpoint`), so a job moves between plans whose optimizer kernels differ; all are
AdamW in fp32 and agree to float rounding (the reconfiguration tests hold them to ≤ 1e-3
relative on loss curves).

The LR in the config is a placeholder: the runner sets each group's LR before every step from
the job's schedule (`tidal.jobs.lr`), so no DeepSpeed scheduler is configured.
"""

from __future__ import annotations

from typing import Any, Literal

from tidal.jobs.spec import JobSpec, Plan

Device = Literal["cpu", "cuda"]


def deepspeed_config(spec: JobSpec, plan: Plan, device: Device = "cpu") -> dict[str, Any]:
    spec.check_plan(plan)
    cuda = device == "cuda"
    zero: dict[str, Any] = {"stage": plan.zero_stage}
    if plan.zero_stage >= 1:
        zero.update({"contiguous_gradients": True, "overlap_comm": cuda})
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
    if plan.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
    if plan.zero_stage == 3 and not cuda:
        zero.update({"stage3_param_persistence_threshold": 0})
    params: dict[str, Any] = {
        "lr": spec.lr_schedule().at(0),
        "betas": list(spec.betas),
        "eps": 1e-8,
        "weight_decay": spec.weight_decay,
    }
    if not plan.offload_optimizer:  # DeepSpeedCPUAdam under offload (DeepSpeed's own choice)
        params.update(torch_adam=True, fused=True)  # module docstring: on either device
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": spec.grad_clip,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "AdamW", "params": params},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if spec.precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config
