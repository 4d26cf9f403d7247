from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import tiny_gpt_spec
from tidal.jobs import Plan, PlanError, PlanSpace
from tidal.jobs.ds_config import deepspeed_config


def test_renders_batch_and_zero() -> None:
    spec = tiny_gpt_spec()
    cfg = deepspeed_config(spec, Plan(dp=2, zero_stage=2, offload_optimizer=True, micro_batch=2,
                                      grad_accum=2))
    assert cfg["train_batch_size"] == 8
    assert cfg["train_micro_batch_size_per_gpu"] == 2
    assert cfg["gradient_accumulation_steps"] == 2
    assert cfg["zero_optimization"]["stage"] == 2
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "torch_adam" not in cfg["optimizer"]["params"]  # DeepSpeedCPUAdam under offload
    assert cfg["zero_optimization"]["overlap_comm"] is False  # CPU: nothing to overlap with
    assert "bf16" not in cfg


def test_settings_for_the_device() -> None:
    spec = tiny_gpt_spec(plans=PlanSpace())
    plain = Plan(dp=1, zero_stage=3, micro_batch=8)
    cpu, cuda = deepspeed_config(spec, plain, "cpu"), deepspeed_config(spec, plain, "cuda")
    for cfg in (cpu, cuda):  # torch.optim.AdamW(fused=True) on either device
        params = cfg["optimizer"]["params"]
        assert params["torch_adam"] is True and params["fused"] is True
    assert cuda["zero_optimization"]["overlap_comm"] is True
    assert cpu["zero_optimization"]["stage3_param_persistence_threshold"] == 0
    assert "stage3_param_persistence_threshold" not in cuda["zero_optimization"]  # DeepSpeed's default
    off = deepspeed_config(spec, Plan(dp=1, zero_stage=2, offload_optimizer=True, micro_batch=8), "cuda")
    assert off["zero_optimization"]["offload_optimizer"]["pin_memory"] is True
    assert "torch_adam" not in off["optimizer"]["params"]


def _optimizer_on_cpu(plan: Plan) -> Any:
    """The torch optimizer of the engine Tidal builds for `plan` on the CPU (under DeepSpeed's
    wrappers: `tidal.jobs.checkpoint._inner_optimizer`)."""
    import torch

    from tidal.jobs.checkpoint import _inner_optimizer
    from tidal.jobs.engine import build_engine, init_world_of_one

    init_world_of_one()
    return _inner_optimizer(build_engine(tiny_gpt_spec(plans=PlanSpace()), plan, torch.device("cpu")))


def test_offload_runs_deepspeed_cpu_adam() -> None:
    inner = _optimizer_on_cpu(Plan(dp=1, zero_stage=2, offload_optimizer=True, micro_batch=8))
    assert type(inner).__name__ == "DeepSpeedCPUAdam"


def test_plain_plans_run_torch_fused_adamw_on_the_cpu() -> None:
    for stage in (0, 1, 3):
        inner = _optimizer_on_cpu(Plan(dp=1, zero_stage=stage, micro_batch=8))
        assert type(inner).__name__ == "AdamW" and all(g["fused"] for g in inner.param_groups), stage


def test_stage3_param_offload_and_bf16() -> None:
    spec = tiny_gpt_spec(precision="bf16", plans=PlanSpace(offload_param=(False, True)))
    cfg = deepspeed_config(spec, Plan(dp=1, zero_stage=3, offload_param=True, micro_batch=8))
    assert cfg["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert cfg["bf16"]["enabled"] is True


def test_refuses_a_plan_the_job_does_not_allow() -> None:
    with pytest.raises(PlanError):
        deepspeed_config(tiny_gpt_spec(), Plan(dp=4, micro_batch=2))  # max_gpus is 2


def test_offload_step_benchmark_measures_each_optimizer_in_its_own_process() -> None:
    """benchmarks/offload_step.py on a tiny GPT: each optimizer's engine in a fresh process, the
    order alternating between rounds, and `offload_speedup` the ratio of the medians it printed
    (in one process the second engine ran slower, which had inflated the figure)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    tiny = ["--d-model", "64", "--heads", "4", "--layers", "2", "--vocab", "512",
            "--warmup", "1", "--steps", "2"]
    out = subprocess.run([sys.executable, "benchmarks/offload_step.py", *tiny, "--rounds", "2"],
                         cwd=root, check=True, capture_output=True, text=True, timeout=600).stdout
    rounds = re.findall(r"^round (\d)/2: (\w+) +engine\.step\(\) ([\d.]+) s", out, re.M)
    assert [(r, k) for r, k, _ in rounds] == [("1", "DeepSpeedCPUAdam"), ("1", "AdamW"),
                                              ("2", "AdamW"), ("2", "DeepSpeedCPUAdam")], out
    med = dict(re.findall(r"^(\w+) +engine\.step\(\) ([\d.]+) s, optimizer step", out, re.M))
    assert set(med) == {"DeepSpeedCPUAdam", "AdamW"}, out
    lines = out.strip().splitlines()
    assert lines[-2].startswith("optimizer_speedup: ") and lines[-1].startswith("offload_speedup: "), out
    speedup = float(lines[-1].split()[-1])
    assert speedup == pytest.approx(float(med["AdamW"]) / float(med["DeepSpeedCPUAdam"]), rel=0.005, abs=0.01)
    # and each round's own ratio, sorted: how much the figure moves between processes
    per_round = sorted(float(t) / float(c) for (_, _, c), (_, _, t) in ((rounds[0], rounds[1]),
                                                                       (rounds[3], rounds[2])))
    printed = [float(x) for x in lines[-3].removeprefix("offload_speedup per round: ").split(", ")]
    assert printed == pytest.approx(per_round, rel=0.005, abs=0.01), out
