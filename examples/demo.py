"""Tidal's local demo: one reconfigurable DeepSpeed job on a local Ray cluster.

A tiny GPT learns Shakespeare on 2 (logical) GPUs; half-way through a phase the GPUs are
"needed elsewhere": the run is asked to stop at the next step boundary, checkpoints, and
continues on 1 GPU under another plan (ZeRO-3 + activation checkpointing); then it grows back
to 2 GPUs with ZeRO-2 and CPU optimizer offload. The loss curve continues as if nothing
happened, because the global batch and the data order do not depend on the plan.

Runs on an embedded local Ray cluster (4 logical GPUs on a CPU machine), or on the cluster at
RAY_ADDRESS. Writes results/demo_loss.png and prints a summary.

    make demo                      # set-up + this script
    python examples/demo.py --steps 120
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import ray

from tidal import Plan, Resources, RunResult, WarmupCosine, launch
from tidal.jobs.checkpoint import TrainState
from tidal.jobs.data import load_shakespeare
from tidal.jobs.reference import evaluate, generate, load_model, shakespeare_gpt


def follow(handle, *, stop_after: int | None, label: str) -> RunResult:  # type: ignore[no-untyped-def]
    """Print progress every few seconds; ask the run to stop once it reaches `stop_after`."""
    last_print = 0.0
    while not handle.done():
        p = handle.progress()
        if p and time.time() - last_print > 3:
            print(f"  [{label}] step {p['step']:4d}  loss {p['loss']:.3f}  "
                  f"{p['samples_per_s']:7.1f} samples/s  lr {p['lr']:.2e}", flush=True)
            last_print = time.time()
        if stop_after is not None and p and p["step"] >= stop_after:
            handle.stop()
            stop_after = None
        time.sleep(0.25)
    return handle.result()  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=90)
    ap.add_argument("--out", type=Path, default=Path("results"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        ray.init(num_cpus=4, num_gpus=4, log_to_driver=False)
    print(f"Ray cluster: {ray.cluster_resources()}")

    steps = args.steps
    spec = shakespeare_gpt(total_steps=steps, checkpoint_every=max(10, steps // 3),
                           lr=WarmupCosine(peak=3e-3, warmup=steps // 10, total=steps, floor=3e-4))
    phases = [
        ("2 GPUs", Plan(dp=2, zero_stage=1, micro_batch=8, grad_accum=2), steps // 3),
        ("1 GPU", Plan(dp=1, zero_stage=3, activation_checkpointing=True, micro_batch=16,
                       grad_accum=2), 2 * steps // 3),
        ("2 GPUs", Plan(dp=2, zero_stage=2, offload_optimizer=True, micro_batch=16), None),
    ]
    t0 = time.time()
    results: list[RunResult] = []
    ckpt = None
    for label, plan, stop_after in phases:
        print(f"\n== {label}: plan {plan.short()} from step {results[-1].final_step if results else 0}")
        handle = launch(spec, plan, Resources(num_workers=plan.dp, gpus_per_worker=1), ckpt)
        r = follow(handle, stop_after=stop_after, label=plan.short())
        results.append(r)
        ckpt = r.checkpoint
        if r.finished:
            break
    total_s = time.time() - t0
    assert ckpt is not None

    state = TrainState.load(ckpt)
    model = load_model(spec, state.params)
    val = evaluate(spec, model)
    sample = generate(model, load_shakespeare(), "ROMEO.\n", 160)

    hist = [m for r in results for m in r.history]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for r, c in zip(results, colors, strict=False):
        ax.plot([m["step"] for m in r.history], r.losses, color=c, label=r.plan.short())
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (global batch mean)")
    ax.set_title(f"{spec.name}: one job, {len(results)} plans, val loss {val:.3f}")
    ax2 = ax.twinx()
    ax2.plot([m["step"] for m in hist], [m["lr"] for m in hist], color="gray", ls=":", label="lr")
    ax2.set_ylabel("learning rate")
    ax.legend(loc="upper right")
    fig.tight_layout()
    png = args.out / "demo_loss.png"
    fig.savefig(png, dpi=120)

    print("\n=== Tidal demo summary ===")
    print(f"{'plan':<22}{'GPUs':>5}{'steps':>12}{'samples/s':>11}{'wall s':>8}")
    for r in results:
        print(f"{r.plan.short():<22}{r.plan.dp:>5}{r.start_step:>5} → {r.final_step:<4}"
              f"{r.mean_samples_per_s():>11.1f}{r.wall_s:>8.1f}")
    print(f"loss {hist[0]['loss']:.3f} → {hist[-1]['loss']:.3f} over {len(hist)} steps; "
          f"held-out loss {val:.3f}; total {total_s:.0f} s")
    print(f"final checkpoint: {ckpt}")
    print(f"plot: {png}")
    print(f"sample:\n{sample}")
    ray.shutdown()
    ok = results[-1].finished and hist[-1]["loss"] < hist[0]["loss"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
