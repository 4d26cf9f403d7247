"""Speed of best-plan queries: Rubick's resource matrix (best plan for 1..64 GPUs) of one job.

A GPT-2-1.5B-sized job with global batch 512 (every GPU count that divides it has several
micro-batch choices), all ZeRO stages, offloads and checkpointing allowed, on 8-GPU nodes.
Prints the matrix time and, last, `plans_per_second: X` (best-plan queries per second; goal: a
full matrix for one job in under one second).
"""

from __future__ import annotations

import time
from functools import partial

from tidal.jobs import JobSpec, PlanSpace
from tidal.jobs.models import GPTConfig, TinyGPT, lm_loss
from tidal.planner.memory import ModelStats
from tidal.planner.perfmodel import Theta, Workload
from tidal.planner.planner import JobModel, resource_matrix


def main() -> None:
    spec = JobSpec(name="gpt2-1.5b", model=partial(TinyGPT, GPTConfig(vocab_size=50257)),
                   dataset=list, loss=lm_loss, global_batch=512, total_steps=1000, min_gpus=1,
                   max_gpus=64, plans=PlanSpace(offload_param=(False, True)))
    psi = 1.558e9
    model = JobModel(work=Workload(params=psi, global_batch=512, seq_hid=1600 * 1024 * 48),
                     theta=Theta(k_fwd=0.03, k_fwd0=0.002, k_opt=5e-11, k_cpu=2e-9, eta=0.4, eta_x=0.1),
                     mem=ModelStats(params=int(psi), largest_layer_params=int(psi / 48), n_layer=48,
                                    act_bytes_per_sample=2.5 * 2**30, const_bytes=2 * 2**30))
    rounds, queries = 5, 0
    t0 = time.perf_counter()
    for _ in range(rounds):
        matrix = resource_matrix(spec, model, gpus_per_node=8)
        queries += spec.max_gpus - spec.min_gpus + 1
    dt = time.perf_counter() - t0
    for n in (1, 2, 4, 8, 16, 32, 64):
        c = matrix.get(n)
        print(f"{n:>3} GPUs: " + (f"{c.plan.short():<22} {c.samples_per_s:8.1f} samples/s  "
                                 f"{c.peak_gpu_bytes / 2**30:5.1f} GiB" if c else "no feasible plan"))
    print(f"resource matrix (1-64 GPUs): {1000 * dt / rounds:.1f} ms")
    print(f"plans_per_second: {queries / dt:.0f}")


if __name__ == "__main__":
    main()
