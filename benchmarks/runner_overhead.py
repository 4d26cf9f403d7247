"""Tidal's runner vs a plain hand-written Ray Train + DeepSpeed loop: same model, same plan.

Both run as Ray Train V2 TorchTrainers of DeepSpeed engines with the same DeepSpeed config,
alternating in one process (T, P, T, P, ...). The plain loop draws random micro-batches and
reports every `report_every` steps; Tidal's adds what makes a job reconfigurable — the
(seed, step) sampler, the per-step LR, the loss all-reduce that carries the stop flag, the
metrics heartbeat to the run's control actor. Throughput is measured from wall-clock
timestamps after each step on rank 0 over the steady-state steps [warmup, steps), so every
per-step cost is included; checkpoints are written only after the last step in both.

Last line: `overhead_ratio: X` = Tidal samples/s ÷ plain samples/s (goal ≥ 0.98).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from tidal import Plan, Resources, run
from tidal.jobs.reference import shakespeare_gpt
from tidal.platform.argtypes import count


def plain_loop(config: dict[str, Any]) -> None:
    """What a user would write by hand: DeepSpeed engine, random batches, periodic report."""
    import deepspeed
    import ray.train
    import torch
    from torch.utils.data import default_collate

    spec, plan, ds_config = config["spec"], config["plan"], config["ds_config"]
    rank = ray.train.get_context().get_world_rank()
    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    model = spec.model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    data = spec.dataset()
    g = torch.Generator().manual_seed(rank)
    stamps: list[float] = []
    loss = torch.zeros(())
    for step in range(spec.total_steps):
        for _ in range(plan.grad_accum):
            idx = torch.randint(len(data), (plan.micro_batch,), generator=g)
            batch = default_collate([data[int(i)] for i in idx])
            loss = spec.loss(engine, batch)
            engine.backward(loss)
            engine.step()
        stamps.append(time.time())
        if (step + 1) % spec.report_every == 0 and step + 1 < spec.total_steps:
            ray.train.report({"step": step + 1, "loss": float(loss)})
    with tempfile.TemporaryDirectory() as tmp:
        if rank == 0:
            with open(os.path.join(tmp, "stamps.json"), "w") as f:
                json.dump(stamps, f)
        ray.train.report({"step": spec.total_steps, "loss": float(loss)},
                         checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None)


def throughput(stamps: list[float], batch: int, warmup: int) -> float:
    """Samples/s over steps (warmup, last]: (n − 1 − warmup)·B / (t_last − t_warmup)."""
    return (len(stamps) - 1 - warmup) * batch / (stamps[-1] - stamps[warmup])


def run_plain(spec: Any, plan: Plan, warmup: int) -> float:
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.train.v2.api.config import RunConfig, ScalingConfig

    from tidal.jobs.ds_config import deepspeed_config
    from tidal.jobs.storage import storage_root

    trainer = TorchTrainer(
        train_loop_per_worker=plain_loop,
        train_loop_config={"spec": spec, "plan": plan, "ds_config": deepspeed_config(spec, plan)},
        scaling_config=ScalingConfig(num_workers=plan.dp, use_gpu=True,
                                     resources_per_worker={"CPU": 1, "GPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(storage_path=str(storage_root()), name=f"plain-{time.time_ns()}"),  # type: ignore[arg-type]
    )
    result = trainer.fit()
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d, open(os.path.join(d, "stamps.json")) as f:
        stamps = json.load(f)
    return throughput(stamps, spec.global_batch, warmup)


def run_tidal(spec: Any, plan: Plan, warmup: int) -> float:
    r = run(spec, plan, Resources(num_workers=plan.dp, gpus_per_worker=1))
    return throughput([m["time"] for m in r.history], spec.global_batch, warmup)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=count(1), default=3)
    ap.add_argument("--steps", type=count(1), default=60)
    ap.add_argument("--warmup", type=count(0), default=10)
    args = ap.parse_args()
    ray.init(address="local", num_cpus=4, num_gpus=4, log_to_driver=False)  # its own, not a running one
    spec = shakespeare_gpt(total_steps=args.steps, checkpoint_every=10 * args.steps, report_every=10)
    plan = Plan(dp=2, zero_stage=1, micro_batch=8, grad_accum=2)
    print(f"model {spec.name} (d128, 4 layers, seq 64), global batch {spec.global_batch}, "
          f"plan {plan.short()}, {args.steps} steps, steady state after step {args.warmup}")
    tidal_sps: list[float] = []
    plain_sps: list[float] = []
    for i in range(args.rounds):
        tidal_sps.append(run_tidal(spec, plan, args.warmup))
        plain_sps.append(run_plain(spec, plan, args.warmup))
        print(f"round {i + 1}: tidal {tidal_sps[-1]:8.1f} samples/s   plain {plain_sps[-1]:8.1f} samples/s   "
              f"ratio {tidal_sps[-1] / plain_sps[-1]:.3f}", flush=True)
    ray.shutdown()
    t_med, p_med = statistics.median(tidal_sps), statistics.median(plain_sps)
    print(f"median: tidal {t_med:.1f}, plain {p_med:.1f} samples/s")
    print(f"overhead_ratio: {t_med / p_med:.3f}")


if __name__ == "__main__":
    main()
