"""Measure a single-worker plan table of the reference GPT with the profiler (real engines).

Writes a CSV with the columns `perfmodel_accuracy.py --measurements` reads:
model,params,zero_stage,offload,act_ckpt,micro_batch,seq,step_s,tokens_per_s,peak_alloc_gib,status
followed by fwd_s,bwd_s,opt_s: the parts of the measured step, as the profiler times them, and
ckpt_ratio: the checkpointed ÷ plain activation bytes the profiler counts from the model
(`tidal.planner.activations`; the same on every row of a model).

On a GPU `peak_alloc_gib` is `torch.cuda.max_memory_allocated()` and `status` is `oom` when the
engine ran out of memory. On a CPU there is no allocator peak and nothing runs out of memory:
`peak_alloc_gib` is the growth of the worker's peak resident set over its baseline, and a row
is labelled `oom` when that exceeds --device-mem-mib, a virtual device capacity (say so when
quoting feasibility accuracy from a CPU table). On a GPU --device-mem-mib does the same with the
allocator peak: a larger GPU measures the rows a smaller one would run out on (an H200 labelling
at an 80-GB H100's 79.2 GiB, 81101 MiB), and a labelled row keeps its times and peak.

--models picks the transformers: `tinygpt` (d 128, 4 layers, seq 64: the CPU table) or GPT-2
shapes (`gpt2-124m`, `gpt2-355m`, `gpt2-774m`, `gpt2-1.5b`: 50257 vocabulary, the standard
widths and depths, an untied output head, so `params` is Ψ + 50257·d above the tied count),
trained on Shakespeare characters (what the tokens are does not change a step's cost). With
RAY_ADDRESS set it profiles on that cluster (its GPUs, logical ones on CPU machines), else on a
local one of its own. Rows are appended to --out as each plan finishes, so a run cut short by
--deadline-min (no new plan starts after it) or by a timeout keeps what it measured.

    python benchmarks/measure_plans.py                                      # CPU, tiny GPT
    python benchmarks/measure_plans.py --cuda --models gpt2-124m,gpt2-355m --seq 1024 \
        --global-batch 16 --micro-batches 2,16 --out gpu.csv                 # one GPU, bf16
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import re
import time
from collections.abc import Mapping
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from tidal.jobs import JobSpec, Plan
from tidal.jobs.reference import GPT2_SHAPES, shakespeare_gpt
from tidal.planner.fitting import model_shape
from tidal.planner.profiler import profile, unschedulable
from tidal.platform.argtypes import amount, count, listed

COLUMNS = ["model", "params", "zero_stage", "offload", "act_ckpt", "micro_batch", "seq",
           "step_s", "tokens_per_s", "peak_alloc_gib", "status"]
PARTS = ["fwd_s", "bwd_s", "opt_s", "ckpt_ratio"]  # optional: the step's parts; the counted ratio
CPU_TABLE = Path("benchmarks/data/tinygpt-cpu-measurements.csv")


def job(model: str, seq: int, global_batch: int, precision: str) -> JobSpec:
    if model == "tinygpt":
        return shakespeare_gpt(seq_len=seq, d_model=128, n_layer=4,
                               global_batch=global_batch, max_gpus=1, precision=precision)
    if model not in GPT2_SHAPES:
        raise SystemExit(f"--models: unknown model {model!r}; known: tinygpt, {', '.join(GPT2_SHAPES)}")
    d, layers, heads = GPT2_SHAPES[model]
    return shakespeare_gpt(name=model, seq_len=seq, d_model=d, n_layer=layers, n_head=heads,
                           vocab_size=50257, global_batch=global_batch, max_gpus=1,
                           precision=precision)


def _plan_key(model: str, plan: Plan, seq: int) -> tuple[object, ...]:
    return (model, plan.zero_stage, plan.offload_optimizer, plan.activation_checkpointing,
            plan.micro_batch, seq)


def _row_key(r: Mapping[str, str]) -> tuple[object, ...]:
    """A table row's `_plan_key`."""
    return (r["model"], int(r["zero_stage"]), r["offload"] == "cpu", r["act_ckpt"] == "1",
            int(r["micro_batch"]), int(r["seq"]))


def _grid(stages: str, micro: list[int], global_batch: int) -> list[Plan]:
    """The plans of --stages × checkpointing off/on × --micro-batches."""
    combos = []
    for tok in stages.split(","):
        if tok not in ("0", "1", "2", "2o", "3", "3o"):
            raise SystemExit(f"--stages: {tok!r} is not one of 0, 1, 2, 2o, 3, 3o")
        combos.append((int(tok[0]), tok.endswith("o")))
    if any(global_batch % m for m in micro):
        raise SystemExit(f"--micro-batches {','.join(map(str, micro))}: each must divide --global-batch "
                         f"{global_batch}")
    return [_plan(stage, off, ac, mb, global_batch)
            for stage, off in combos for ac in (False, True) for mb in micro]


def _plan(stage: int, offload: bool, ckpt: bool, micro_batch: int, global_batch: int) -> Plan:
    """A single-worker plan of the table."""
    return Plan(dp=1, zero_stage=stage, offload_optimizer=offload, activation_checkpointing=ckpt,
                micro_batch=micro_batch, grad_accum=global_batch // micro_batch)


def _plans(tokens: str, global_batch: int) -> list[Plan]:
    """--plans: STAGE[o][a]@MICRO tokens, in their order."""
    out = []
    for tok in tokens.split(","):
        m = re.fullmatch(r"([0-3])(o?)(a?)@(\d+)", tok.strip())
        if m is None or (m.group(2) and m.group(1) == "0"):
            raise SystemExit(f"--plans: {tok!r} is not STAGE[o][a]@MICRO (stage 0-3, 'o' only "
                             f"with stage 1-3), e.g. 2o@16")
        mb = int(m.group(4))
        if mb < 1 or global_batch % mb:
            raise SystemExit(f"--plans: {tok!r}: micro-batch {mb} does not divide --global-batch "
                             f"{global_batch}")
        out.append(_plan(int(m.group(1)), bool(m.group(2)), bool(m.group(3)), mb, global_batch))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None,
                    help="default: benchmarks/data/tinygpt-cpu-measurements.csv on the CPU, "
                         "gpu-measurements.csv with --cuda (never the CPU table)")
    ap.add_argument("--models", default="tinygpt", help="comma-separated: tinygpt, gpt2-124m, ...")
    ap.add_argument("--seq", type=count(1), default=64)
    ap.add_argument("--global-batch", type=count(1), default=32)
    ap.add_argument("--micro-batches", type=listed(count(1)), default=[4, 16, 32], help="comma-separated")
    ap.add_argument("--device-mem-mib", type=amount(), default=None,
                    help="label a row oom when its peak exceeds this: a virtual device on the CPU, a smaller "
                         "GPU on a larger one (default: none, every row that ran is ok)")
    ap.add_argument("--cuda", action="store_true", help="profile on the GPU (bf16)")
    ap.add_argument("--stages", default="0,1,2,2o,3,3o",
                    help="ZeRO stages to measure; 'o' = with CPU optimizer offload")
    ap.add_argument("--plans", default=None,
                    help="comma-separated STAGE[o][a]@MICRO plans, measured in this order instead of "
                         "the shuffled grid ('o': optimizer offload, 'a': activation checkpointing; "
                         "e.g. 1@8,2o@16,3a@2); the models take turns on each")
    ap.add_argument("--deadline-min", type=amount(), default=None, help="start no plan after this")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows already in --out and measure only the missing plans")
    args = ap.parse_args()
    if args.out is None:
        args.out = Path("gpu-measurements.csv") if args.cuda else CPU_TABLE
    plans = _plans(args.plans, args.global_batch) if args.plans else \
        _grid(args.stages, args.micro_batches, args.global_batch)
    models = args.models.split(",")
    specs = [job(m, args.seq, args.global_batch, "bf16" if args.cuda else "fp32") for m in models]
    names = ["tinygpt-d128-l4" if m == "tinygpt" else m for m in models]
    # Measured in a shuffled order (--plans: in its order), the models taking turns, so that a
    # table cut short by the deadline still spans the grid and every model; written back in grid
    # order at the end (the sample selection breaks ties by row order).
    grid = [_plan_key(name, p, args.seq) for name in names for p in plans]
    shuffled = list(plans)
    if not args.plans:
        random.Random(0).shuffle(shuffled)
    work = [(name, spec, plan) for plan in shuffled
            for name, spec in zip(names, specs, strict=True)]
    params = {name: model_shape(spec)[0]
              for name, spec in zip(names, specs, strict=True)}
    for name in names:
        print(f"{name}: {params[name] / 1e6:.1f}M parameters", flush=True)
    t0 = time.monotonic()

    def past_deadline() -> bool:
        return args.deadline_min is not None and time.monotonic() - t0 > 60 * args.deadline_min

    joining = bool(os.environ.get("RAY_ADDRESS"))  # a cluster someone started: its resources
    if args.cuda and not joining:
        import torch

        if not torch.cuda.is_available():  # this machine's own cluster would have no GPU
            raise SystemExit("measure_plans: --cuda, but this machine has no CUDA device "
                             "(set RAY_ADDRESS to profile on a cluster whose nodes have one)")
    # without RAY_ADDRESS a cluster of its own ("local"): a plain ray.init() joins any cluster
    # running on this machine, and its logical GPUs would take --cuda profiles
    if joining:
        ray.init(log_to_driver=False)
    elif args.cuda:
        ray.init(address="local", log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=2, num_gpus=2, log_to_driver=False)
    if why := unschedulable(plans, ray.cluster_resources()):  # Ray would keep it pending: a hang
        ray.shutdown()
        hint = " (--cuda: the cluster's nodes need GPUs)" if args.cuda else ""
        raise SystemExit(f"measure_plans: {why}{hint}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    kept = []
    if args.resume and args.out.exists():
        with args.out.open() as f:
            kept = [r for r in csv.DictReader(f) if r["status"] in ("ok", "oom")]
    done = {_row_key(r) for r in kept}
    n = 0
    with args.out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS + PARTS)
        w.writerows([r[c] for c in COLUMNS] + [r.get(c, "") for c in PARTS] for r in kept)
        for name, spec, plan in work:
            if _plan_key(name, plan, args.seq) in done:
                continue
            if past_deadline():
                print(f"deadline: stopped after {n} rows", flush=True)
                break
            (r,) = profile(spec, [plan], hardware="cuda" if args.cuda else "cpu",
                           use_cuda=args.cuda, steps=3, warmup=1)
            status = r.status if r.status in ("ok", "oom") else "error"
            if status == "ok" and args.device_mem_mib and r.peak_bytes > args.device_mem_mib * 2**20:
                status = "oom"
            ok = r.iter_s > 0
            w.writerow([name, params[name], plan.zero_stage, "cpu" if plan.offload_optimizer else "none",
                        int(plan.activation_checkpointing), plan.micro_batch, args.seq,
                        f"{r.iter_s:.6f}" if ok else "",
                        f"{args.global_batch * args.seq / r.iter_s:.1f}" if ok else "",
                        f"{r.peak_bytes / 2**30:.6f}" if ok else "", status]
                       + [f"{v:.6f}" if ok else "" for v in (r.fwd_s, r.bwd_s, r.opt_s, r.ckpt_ratio)])
            f.flush()
            n += 1
    ray.shutdown()
    _sort(args.out, grid)
    print(f"measured {n} rows, kept {len(kept)}: {args.out}")


def _sort(path: Path, grid: list[tuple[object, ...]]) -> None:
    """Rewrite the table in `grid` order (rows of other runs last, in their order)."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    rank = {k: i for i, k in enumerate(grid)}
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS + PARTS, restval="")
        w.writeheader()
        w.writerows(sorted(rows, key=lambda r: rank.get(_row_key(r), len(rank))))


if __name__ == "__main__":
    main()
