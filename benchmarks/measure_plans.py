"""Measure a single-worker plan table of the reference GPT with the profiler (real engines).

Writes a CSV with the columns `perfmodel_accuracy.py --measurements` reads:
model,params,zero_stage,offload,act_ckpt,micro_batch,seq,step_s,tokens_per_s,peak_alloc_gib,status

On a GPU `peak_alloc_gib` is `torch.cuda.max_memory_allocated()` and `status` is `oom` when the
engine ran out of memory. On a CPU there is no allocator peak and nothing runs out of memory:
`peak_alloc_gib` is the growth of the worker's peak resident set over its baseline, and a row
is labelled `oom` when that exceeds --device-mem-mib, a virtual device capacity (say so when
quoting feasibility accuracy from a CPU table).
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from tidal.jobs import Plan
from tidal.jobs.reference import shakespeare_gpt
from tidal.planner.profiler import profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/data/tinygpt-cpu-measurements.csv"))
    ap.add_argument("--micro-batches", default="4,16,32")
    ap.add_argument("--device-mem-mib", type=float, default=None,
                    help="virtual device capacity for CPU rows (default: none, every row ok)")
    ap.add_argument("--cuda", action="store_true", help="profile on the GPU (bf16)")
    args = ap.parse_args()
    ray.init(log_to_driver=False) if args.cuda else ray.init(num_cpus=2, num_gpus=2, log_to_driver=False)
    d, layers, seq = 128, 4, 64
    spec = shakespeare_gpt(seq_len=seq, d_model=d, n_layer=layers, global_batch=32, max_gpus=1,
                           precision="bf16" if args.cuda else "fp32")
    name = f"tinygpt-d{d}-l{layers}"
    params = sum(p.numel() for p in spec.model().parameters())
    plans = []
    for stage, off in [(0, False), (1, False), (2, False), (2, True), (3, False), (3, True)]:
        for ac in (False, True):
            for mb in (int(m) for m in args.micro_batches.split(",")):
                plans.append(Plan(dp=1, zero_stage=stage, offload_optimizer=off,
                                  activation_checkpointing=ac, micro_batch=mb, grad_accum=32 // mb))
    records = profile(spec, plans, hardware="cuda" if args.cuda else "cpu", use_cuda=args.cuda,
                      steps=3, warmup=1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "params", "zero_stage", "offload", "act_ckpt", "micro_batch", "seq",
                    "step_s", "tokens_per_s", "peak_alloc_gib", "status"])
        for r in records:
            status = r.status if r.status in ("ok", "oom") else "error"
            if status == "ok" and args.device_mem_mib and r.peak_bytes > args.device_mem_mib * 2**20:
                status = "oom"
            ok = r.iter_s > 0
            w.writerow([name, params, r.plan.zero_stage, "cpu" if r.plan.offload_optimizer else "none",
                        int(r.plan.activation_checkpointing), r.plan.micro_batch, seq,
                        f"{r.iter_s:.6f}" if ok else "", f"{32 * seq / r.iter_s:.1f}" if ok else "",
                        f"{r.peak_bytes / 2**30:.6f}" if ok else "", status])
    print(f"wrote {len(records)} rows to {args.out}")
    ray.shutdown()


if __name__ == "__main__":
    main()
