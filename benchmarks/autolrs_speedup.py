"""AutoLRS as a user gets it against a published recipe and a grid-tuned cosine, on a tiny GPT.

Every method trains the same model from the same seed on the same data order with the same
global batch through the job's own training loop (`tidal.jobs.worker.run_loop`, one DeepSpeed
engine, ZeRO-0, world of one), so AutoLRS's range test and probes run exactly as in a job.
Runs go to `--workers` processes (one CPU thread each).

    recipe     nanoGPT's Shakespeare-character recipe, the schedule a user would copy: AdamW with
               β2 = 0.99, peak LR 1e-3, linear warm-up over the first 2% of the steps, cosine
               decay to 1e-4 at the final step
    grid       warm-up (5%) + cosine to peak/100, at each of `--grid`'s peak LRs (six by default,
               2× apart): the tuning a user would otherwise run, six times the compute
    target     the validation loss the grid's best cosine reaches at its final step
    autolrs    `lr="autolrs"`: the defaults, nothing from the grid, a budget of `--steps` compute
               steps (range test and probes included), the main arm
    helped     (single runs) AutoLRS given the grid's range and the cosine's warm-up, no anneal,
               and twice the budget (the configuration of the earlier yardsticks)

Figures (validation loss evaluated every `--steps`/25 steps; AutoLRS's steps count its probes):

    autolrs_speedup_vs_recipe  steps the recipe needs to reach its own final validation loss
                               ÷ AutoLRS's compute steps to that loss (the AutoLRS paper's protocol)
    tuning_compute_ratio       every step the grid spent ÷ AutoLRS's compute steps to the target
    autolrs_vs_tuned           the best cosine's steps ÷ AutoLRS's compute steps to the target
    autolrs_final_vs_tuned     the target minus AutoLRS's final validation loss at the same
                               compute steps (≥ 0: AutoLRS ends at least as well as the grid's best)

`--family` runs every member of `FAMILY` (model shapes, the demo's among them; global batches;
budgets of 400 to 3,000 steps) on seeds 0 and 1 with the unhelped arm, one line each, worst case
last. Writes `results/autolrs.png` (loss and LR against compute steps) or
`results/autolrs_family.png`, and the rows as JSON next to it.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from tidal.jobs.autolrs import AutoLRS, plot_schedule
from tidal.jobs.lr import LRSchedule, WarmupCosine
from tidal.platform.argtypes import amount, count

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Member:
    """One benchmark case: the GPT's d_model × n_layer (4 heads, sequence 64), batch, budget, seed."""

    d_model: int
    n_layer: int
    batch: int
    steps: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.d_model}x{self.n_layer} b{self.batch} {self.steps} steps seed {self.seed}"

    @property
    def every(self) -> int:
        return max(10, self.steps // 25)


# the demo's GPT (128x2, batch 16, 1,000 steps) among them; each shape at another batch and budget
FAMILY = [Member(d, n, b, s, seed) for seed in (0, 1)
          for d, n, b, s in [(128, 2, 16, 1000), (128, 4, 32, 400), (96, 6, 16, 1200), (64, 2, 16, 3000)]]


def _init_worker() -> None:
    import torch

    from tidal.jobs.engine import init_world_of_one

    torch.set_num_threads(1)
    init_world_of_one()


def train(label: str, member: Member, lr: float | LRSchedule | AutoLRS, steps: int,
          **spec_fields: Any) -> Rows:
    """One run of `steps` compute steps; rows of the loop, with `val_loss` every `member.every`
    data steps and at the end (in a worker process)."""
    import torch

    from tidal.jobs.engine import build_engine
    from tidal.jobs.reference import evaluate, shakespeare_gpt
    from tidal.jobs.spec import Plan
    from tidal.jobs.worker import LoopHooks, run_loop

    spec = shakespeare_gpt(name="autolrs-bench", total_steps=steps, global_batch=member.batch, max_gpus=1,
                           lr=lr, checkpoint_every=10**9, report_every=10**9, seq_len=64,
                           d_model=member.d_model, n_layer=member.n_layer, n_head=4, seed=member.seed,
                           **spec_fields)
    plan = Plan(dp=1, zero_stage=0, micro_batch=member.batch, grad_accum=1)
    engine = build_engine(spec, plan, torch.device("cpu"))
    rows: Rows = []
    t0 = time.time()

    class Recorder(LoopHooks):
        last_eval = 0

        def emit(self, row: dict[str, Any]) -> None:
            rows.append(dict(row))

        def after_step(self, engine: Any, row: dict[str, Any]) -> None:
            last = row["compute_steps"] >= steps
            if row["step"] // member.every > self.last_eval // member.every or last:
                self.last_eval = row["step"]
                engine.module.eval()
                rows[-1]["val_loss"] = evaluate(spec, engine.module, batches=16, batch_size=64)
                engine.module.train()
                if last:
                    print(f"  {member.name}  {label:<16} compute {row['compute_steps']:>5}  "
                          f"val {rows[-1]['val_loss']:.4f}  ({time.time() - t0:.0f} s)", flush=True)

    run_loop(engine, spec, plan, torch.device("cpu"), rank=0, world=1, dataset=spec.dataset(),
             start=None, stop_at=None, hooks=Recorder(), study_path=None)
    return rows


def steps_to(rows: Rows, target: float, key: str = "compute_steps") -> float:
    """`key` (compute steps, or data steps: `step`) at the first evaluation whose validation
    loss is <= target (inf: never)."""
    for r in rows:
        if r.get("val_loss") is not None and r["val_loss"] <= target + 1e-9:
            return float(r[key])
    return math.inf


def final(rows: Rows) -> float:
    return float(next(r["val_loss"] for r in reversed(rows) if r.get("val_loss") is not None))


def ratio(a: float, b: float) -> float:
    """a ÷ b, 0 when b was never reached."""
    return 0.0 if math.isinf(b) else a / b


def runs_of(member: Member, grid: list[float], helped: bool,
            autolrs: dict[str, Any]) -> dict[str, tuple[Any, int, dict[str, Any]]]:
    """Every run a member needs: label → (lr, compute steps, extra spec fields)."""
    n = member.steps
    runs: dict[str, tuple[Any, int, dict[str, Any]]] = {
        "recipe": (WarmupCosine(peak=1e-3, warmup=max(1, round(0.02 * n)), total=n, floor=1e-4), n,
                   {"betas": (0.9, 0.99)}),
        **{f"cosine {p:.2g}": (WarmupCosine(peak=p, warmup=max(1, n // 20), total=n, floor=p / 100), n, {})
           for p in grid},
        "autolrs": (AutoLRS(**autolrs) if autolrs else "autolrs", n, {}),
    }
    if helped:  # the grid's range and warm-up, twice the budget, no anneal: the earlier arm
        runs["helped"] = (AutoLRS(lr_min=min(grid), lr_max=max(grid), first_stage=max(20, n // 10),
                                  max_stage=n, warmup_steps=max(1, n // 20), anneal=0), 2 * n, {})
    return runs


def figures(member: Member, runs: dict[str, Rows], grid: list[float], arm: str = "autolrs") -> dict[str, Any]:
    """The yardsticks of one AutoLRS arm against the member's recipe and grid."""
    n = member.steps
    cos = {k: v for k, v in runs.items() if k.startswith("cosine")}
    best = min(cos, key=lambda k: final(cos[k]))
    target = final(cos[best])
    auto = runs[arm]
    at_budget = [r for r in auto if r["compute_steps"] <= n]
    recipe_final = final(runs["recipe"])
    grid_steps = sum(r[-1]["compute_steps"] for r in cos.values())
    reached = steps_to(auto, target)
    return {
        "member": member.name, "steps": n, "arm": arm, "target": target, "best": best,
        "best_at_grid_edge": best in (f"cosine {min(grid):.2g}", f"cosine {max(grid):.2g}"),
        "autolrs_final": final(at_budget), "recipe_final": recipe_final,
        "autolrs_final_vs_tuned": target - final(at_budget),
        "autolrs_speedup_vs_recipe": ratio(steps_to(runs["recipe"], recipe_final),
                                           steps_to(auto, recipe_final)),
        "tuning_compute_ratio": ratio(grid_steps, reached),
        "autolrs_vs_tuned": ratio(steps_to(cos[best], target), reached),
        "probe_steps": next(r["probe_steps"] for r in reversed(at_budget)),
        "free_probe_speedup": ratio(steps_to(cos[best], target), steps_to(auto, target, key="step")),
    }


def run_all(members: list[Member], grid: list[float], helped: bool, workers: int,
            baselines: Path | None, autolrs: dict[str, Any]) -> dict[Member, dict[str, Rows]]:
    """Every run of every member, the longest first, on `workers` processes. With `baselines`,
    the recipe's and the grid's runs (which do not depend on AutoLRS) are read from that folder
    where an earlier run left them, and written there otherwise."""
    out: dict[Member, dict[str, Rows]] = {m: {} for m in members}
    jobs = []
    for m in members:
        for label, spec in runs_of(m, grid, helped, autolrs).items():
            kept = baselines / f"{m.name} {label}.json".replace(" ", "_") if baselines else None
            if kept is not None and label not in ("autolrs", "helped") and kept.exists():
                out[m][label] = json.loads(kept.read_text())
            else:
                jobs.append((m, label, spec, kept))
    jobs.sort(key=lambda j: -j[2][1] * j[0].d_model * j[0].n_layer * j[0].batch)
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker) as pool:
        futures = {pool.submit(train, label, m, lr, steps, **fields): (m, label, kept)
                   for m, label, (lr, steps, fields), kept in jobs}
        for f, (m, label, kept) in futures.items():
            out[m][label] = f.result()
            if kept is not None and label not in ("autolrs", "helped"):
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(json.dumps(out[m][label], default=str))
    return out


def describe(f: dict[str, Any]) -> str:
    return (f"{f['member']:<36} {f['arm']:<8} final {f['autolrs_final']:.4f} vs {f['target']:.4f} "
            f"({f['best']}{', grid edge' if f['best_at_grid_edge'] else ''}): "
            f"final_vs_tuned {f['autolrs_final_vs_tuned']:+.4f}  "
            f"vs_recipe {f['autolrs_speedup_vs_recipe']:.3f}  "
            f"vs_tuned {f['autolrs_vs_tuned']:.3f}  tuning {f['tuning_compute_ratio']:.2f}  "
            f"losing probes {f['probe_steps']} ({f['probe_steps'] / f['steps']:.1%})")


def plot_family(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 1.5), sharey=True)
    names = [r["member"] for r in rows]
    y = np.arange(len(rows))
    a.barh(y, [r["autolrs_final_vs_tuned"] for r in rows], color="tab:blue")
    a.axvline(-0.02, color="k", ls="--", lw=0.8, label="goal: ≥ −0.02 nats")
    a.set_xlabel("grid-best cosine's final loss − AutoLRS's (nats)")
    a.legend(fontsize=8)
    b.barh(y, [r["autolrs_speedup_vs_recipe"] for r in rows], color="tab:green")
    b.axvline(1.5, color="k", ls="--", lw=0.8, label="goal: ≥ 1.5")
    b.set_xlabel("recipe's steps to its final loss ÷ AutoLRS's")
    b.legend(fontsize=8)
    a.set_yticks(y, names, fontsize=8)
    fig.suptitle('lr="autolrs" (no hints) on the family')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=count(20), default=400, help="every method's budget (compute steps)")
    ap.add_argument("--seed", type=int, default=0, help="model initialisation and data order of every method")
    ap.add_argument("--model", default="128x4", help="the GPT's d_model x n_layer (4 heads, sequence 64)")
    ap.add_argument("--batch", type=count(1), default=32, help="global batch")
    ap.add_argument("--grid", type=amount(), nargs="+", help="the cosines' peak LRs",
                    default=[float(x) for x in np.geomspace(5e-4, 1.6e-2, 6)])
    ap.add_argument("--family", action="store_true", help="every member of FAMILY, unhelped arm")
    ap.add_argument("--workers", type=count(1), default=2, help="processes (one thread each)")
    ap.add_argument("--baselines", type=Path, default=None,
                    help="a folder to keep the recipe's and the grid's runs in and reuse them from")
    ap.add_argument("--autolrs", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="AutoLRS settings for the main arm instead of the defaults (e.g. peak_fraction=0.5)")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    try:
        d_model, n_layer = (int(x) for x in args.model.split("x"))
    except ValueError:
        ap.error(f"--model: expected D_MODELxN_LAYER (e.g. 128x4), got {args.model!r}")
    if d_model % 4 or min(d_model, n_layer) < 1:
        ap.error(f"--model: d_model must be a positive multiple of the 4 heads, got {args.model!r}")
    try:
        autolrs = {k: ast.literal_eval(v) for k, v in (x.split("=", 1) for x in args.autolrs)}
        AutoLRS(**autolrs)
    except (ValueError, SyntaxError, TypeError) as e:
        ap.error(f"--autolrs: {e}")
    members = FAMILY if args.family else [Member(d_model, n_layer, args.batch, args.steps, args.seed)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs = run_all(members, sorted(args.grid), helped=not args.family, workers=args.workers,
                   baselines=args.baselines, autolrs=autolrs)
    print(f"\n{len(members)} member(s), {time.time() - t0:.0f} s\n")
    found = [figures(m, runs[m], sorted(args.grid)) for m in members]
    if args.family:
        # worst last: by the margin to the nearer of the two goals (≥ −0.02 nats, ≥ 1.5)
        found.sort(key=lambda f: (min(f["autolrs_final_vs_tuned"] + 0.02,
                                      (f["autolrs_speedup_vs_recipe"] - 1.5) / 10), f["member"]),
                   reverse=True)
        for f in found:
            print(describe(f))
        plot_family(found, out / "autolrs_family.png")
        (out / "autolrs_family.json").write_text(json.dumps({"figures": found, "runs": {
            m.name: runs[m] for m in members}}, default=str))
        print(f"wrote {out / 'autolrs_family.png'}")
        worst_final = min(found, key=lambda f: f["autolrs_final_vs_tuned"])
        worst_recipe = min(found, key=lambda f: f["autolrs_speedup_vs_recipe"])
        print(f"worst autolrs_speedup_vs_recipe: {worst_recipe['autolrs_speedup_vs_recipe']:.3f} "
              f"({worst_recipe['member']})")
        print(f"worst autolrs_final_vs_tuned: {worst_final['autolrs_final_vs_tuned']:+.4f} "
              f"({worst_final['member']})")
        return 0
    m, f = members[0], found[0]
    h = figures(m, runs[m], sorted(args.grid), arm="helped")
    print(describe(f))
    print(describe(h))
    shown = {"recipe (nanoGPT)": runs[m]["recipe"], f"{f['best']} (grid best)": runs[m][f["best"]],
             'lr="autolrs"': runs[m]["autolrs"], "autolrs, helped": runs[m]["helped"]}
    plot_schedule(shown, out / "autolrs.png", target=f["target"])
    (out / "autolrs.json").write_text(json.dumps({"figures": f, "helped": h, "runs": runs[m]}, default=str))
    print(f"wrote {out / 'autolrs.png'}")
    print(f"helped: autolrs_speedup_vs_recipe {h['autolrs_speedup_vs_recipe']:.3f}  tuning_compute_ratio "
          f"{h['tuning_compute_ratio']:.3f}  autolrs_vs_tuned {h['autolrs_vs_tuned']:.3f}")
    print(f"autolrs_speedup_vs_recipe: {f['autolrs_speedup_vs_recipe']:.3f}")
    print(f"tuning_compute_ratio: {f['tuning_compute_ratio']:.3f}")
    print(f"autolrs_final_vs_tuned: {f['autolrs_final_vs_tuned']:+.4f}")
    print(f"autolrs_vs_tuned: {f['autolrs_vs_tuned']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
