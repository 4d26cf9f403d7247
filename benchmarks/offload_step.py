"""The offloaded optimizer step on the CPU: DeepSpeed's CPU Adam against `torch.optim.AdamW`.

    python benchmarks/offload_step.py            # GPT-2 124M shape; last line: offload_speedup: X

Both engines are built the way Tidal builds them (`tidal.jobs.worker.build_engine`, a ZeRO-2 +
optimizer-offload plan, world of one): the first with today's config (`DeepSpeedCPUAdam`), the
second with the optimizer Tidal used before (`torch_adam: true`,
`zero_force_ds_cpu_optimizer: false`: `torch.optim.AdamW` on the host). Each takes --warmup
steps, then --steps timed ones; the time is `engine.step()` alone (the optimizer step on the
offloaded fp32 partition, plus DeepSpeed's copy of the new weights back), measured after a
forward and backward of one sequence. Prints both medians and `offload_speedup` = torch ÷ CPU
Adam, measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tidal.jobs import Plan
from tidal.jobs.ds_config import deepspeed_config
from tidal.jobs.reference import shakespeare_gpt
from tidal.jobs.spec import JobSpec
from tidal.jobs.worker import build_engine, init_world_of_one


def time_steps(spec: JobSpec, plan: Plan, torch_adam: bool, warmup: int, steps: int) -> tuple[str, float]:
    config = deepspeed_config(spec, plan, "cpu")
    if torch_adam:  # the optimizer Tidal ran under offload before
        config["optimizer"]["params"]["torch_adam"] = True
        config["zero_force_ds_cpu_optimizer"] = False
    engine = build_engine(spec, plan, torch.device("cpu"), config)
    kind = type(engine.optimizer.optimizer).__name__
    data = spec.dataset()
    x, y = (t.unsqueeze(0) for t in data[0])
    times = []
    for k in range(warmup + steps):
        loss = spec.loss(engine, (x, y))
        engine.backward(loss)
        t0 = time.perf_counter()
        engine.step()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    del engine
    return kind, statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257, help="GPT-2's: 124M parameters at the defaults")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=7)
    args = ap.parse_args()
    init_world_of_one()
    spec = shakespeare_gpt(name="offload-step", seq_len=64, d_model=args.d_model, n_layer=args.layers,
                           n_head=12, vocab_size=args.vocab, global_batch=1, max_gpus=1)
    params = sum(p.numel() for p in spec.model().parameters())
    plan = Plan(dp=1, zero_stage=2, offload_optimizer=True, micro_batch=1)
    print(f"model: {params / 1e6:.0f}M parameters; plan {plan.short()}; {torch.get_num_threads()} threads")
    results = {}
    for torch_adam in (False, True):
        kind, s = time_steps(spec, plan, torch_adam, args.warmup, args.steps)
        results[torch_adam] = s
        print(f"{kind:<18} optimizer step {s:.3f} s (median of {args.steps})", flush=True)
    print(f"offload_speedup: {results[True] / results[False]:.2f}")


if __name__ == "__main__":
    main()
