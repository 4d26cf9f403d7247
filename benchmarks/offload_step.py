"""The offloaded optimizer step on the CPU: DeepSpeed's CPU Adam against `torch.optim.AdamW`.

    python benchmarks/offload_step.py            # GPT-2 124M shape; last line: offload_speedup: X

Both engines are built the way Tidal builds them (`tidal.jobs.engine.build_engine`, a ZeRO-2 +
optimizer-offload plan, world of one): one with today's config (`DeepSpeedCPUAdam`), the other
with the optimizer Tidal used before (`torch_adam: true`, `zero_force_ds_cpu_optimizer: false`:
`torch.optim.AdamW` on the host). Each engine takes --warmup steps, then --steps timed ones,
each after a forward and backward of one sequence, and reports two medians:

* `engine.step()`: what a training step pays, the optimizer's step on the offloaded fp32
  partition plus DeepSpeed's gradient clipping and its two copies of the new weights back
  (staging buffer, then the model's partition), which both optimizers pay alike;
* the optimizer's own `step()` inside that call (the kernel).

Each engine runs in a fresh process, --rounds times, the order alternating (CPU Adam first,
then torch first, ...). In one process the second engine's step measured 1.5-2.4 s for torch
AdamW against 0.86 s in a process of its own (2026-12-03, 2 cores): the first engine's memory
made the second's allocations slower, which inflated the ratio whenever torch came second.
Even in processes of their own torch AdamW's step varies from process to process (0.79-1.34 s
on one 2-core host the same evening; steady within a process), CPU Adam's hardly (0.245-0.253
s): torch's single-tensor loop allocates ~650 MB of temporaries a step, whose page faults are
most of its time and depend on the host's memory state (with transparent huge pages,
`THP_MEM_ALLOC_ENABLE=1`, it was slower still: 1.6-1.9 s). Hence three rounds by default and
the per-round ratios printed. Prints `optimizer_speedup` (the kernels) and, last,
`offload_speedup` = torch ÷ CPU Adam of the medians of `engine.step()`, all measured in this run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from tidal.platform.argtypes import count

KINDS = ("cpu_adam", "torch")


def measure(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One engine in this process: median seconds of `engine.step()` and of the optimizer's own
    step inside it."""
    import torch

    from tidal.jobs import Plan
    from tidal.jobs.ds_config import deepspeed_config
    from tidal.jobs.engine import build_engine, init_world_of_one
    from tidal.jobs.reference import shakespeare_gpt

    init_world_of_one()
    spec = shakespeare_gpt(name="offload-step", seq_len=64, d_model=args.d_model, n_layer=args.layers,
                           n_head=args.heads, vocab_size=args.vocab, global_batch=1, max_gpus=1)
    plan = Plan(dp=1, zero_stage=2, offload_optimizer=True, micro_batch=1)
    config = deepspeed_config(spec, plan, "cpu")
    if kind == "torch":  # the optimizer Tidal ran under offload before
        config["optimizer"]["params"]["torch_adam"] = True
        config["zero_force_ds_cpu_optimizer"] = False
    engine = build_engine(spec, plan, torch.device("cpu"), config)
    inner = engine.optimizer.optimizer
    inner_step, inner_times = inner.step, []

    def timed_step(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        out = inner_step(*a, **kw)
        inner_times.append(time.perf_counter() - t0)
        return out

    inner.step = timed_step  # the engine calls self.optimizer.step(): time the kernel inside it
    x, y = (t.unsqueeze(0) for t in spec.dataset()[0])
    step_times = []
    for k in range(args.warmup + args.steps):
        engine.backward(spec.loss(engine, (x, y)))
        t0 = time.perf_counter()
        engine.step()
        if k >= args.warmup:
            step_times.append(time.perf_counter() - t0)
    return {"optimizer": type(inner).__name__, "threads": torch.get_num_threads(),
            "params": sum(p.numel() for p in engine.module.parameters()),
            "step_s": statistics.median(step_times), "opt_s": statistics.median(inner_times[args.warmup:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=count(1), default=768)
    ap.add_argument("--layers", type=count(1), default=12)
    ap.add_argument("--heads", type=count(1), default=12)
    ap.add_argument("--vocab", type=count(1), default=50257, help="GPT-2's: 124M parameters at the defaults")
    ap.add_argument("--warmup", type=count(0), default=2)
    ap.add_argument("--steps", type=count(1), default=7)
    ap.add_argument("--rounds", type=count(1), default=3,
                    help="fresh processes per optimizer, order alternating (odd: a true median)")
    ap.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args)))
        return
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for r in range(args.rounds):
        for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
            child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", kind],
                                   capture_output=True, text=True)
            if child.returncode != 0:  # the child's own last line says what went wrong
                last = (child.stderr.strip().splitlines() or ["no output"])[-1]
                raise SystemExit(f"offload_step: the {kind} engine's process failed: {last}")
            m = json.loads(child.stdout.strip().splitlines()[-1])
            runs[kind].append(m)
            print(f"round {r + 1}/{args.rounds}: {m['optimizer']:<16} engine.step() {m['step_s']:.4g} s, "
                  f"its optimizer step {m['opt_s']:.4g} s ({m['params'] / 1e6:.3g}M parameters, "
                  f"{m['threads']} threads)", flush=True)
    med = {k: {f: statistics.median(m[f] for m in runs[k]) for f in ("step_s", "opt_s")} for k in KINDS}
    for k in KINDS:
        print(f"{runs[k][0]['optimizer']:<16} engine.step() {med[k]['step_s']:.4g} s, "
              f"optimizer step {med[k]['opt_s']:.4g} s (median of {args.rounds} processes)")
    ratios = sorted(t["step_s"] / c["step_s"] for t, c in zip(runs["torch"], runs["cpu_adam"], strict=True))
    print(f"offload_speedup per round: {', '.join(f'{x:.2f}' for x in ratios)}")
    print(f"optimizer_speedup: {med['torch']['opt_s'] / med['cpu_adam']['opt_s']:.2f}")
    print(f"offload_speedup: {med['torch']['step_s'] / med['cpu_adam']['step_s']:.2f}")


if __name__ == "__main__":
    main()
