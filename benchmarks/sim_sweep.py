"""Every policy on the workload family (`tidal.sim.workload.family`), and the sensitivity of
Tidal's constants: does the policy win everywhere, not on one file?

    python benchmarks/sim_sweep.py --traces ../shared/traces/rubick \
        --workloads ../shared/traces/rubick/workload-base.csv ../shared/traces/rubick/workload-bp.csv

For each workload (the shared traces, their variants with 25%/50% guaranteed jobs and 0.5×/2×
arrival rates, nine seeded synthetic ones) it prints avg JCT, makespan, guarantee violation
(`tidal.sim.simulator.metrics`: seconds, summed over guaranteed jobs, from first start to
completion that a job spent stopped or running below the true throughput of its own request;
also by cause: stopped, spread over more nodes than packed, or packed and over-predicted) and
the GPU-seconds left idle while a job waited (`idle_while_waiting_gpu_s`) for each policy, in
the Rubick setting of `sim_compare.py`. Then Tidal's speedups over the
Rubick re-implementation per workload, and their geometric mean and worst case. Then each
workload's makespan bound (`tidal.sim.bounds`: no policy shown the same options can finish
sooner; the job or the work that sets it) and both policies' makespans over it: where the
re-implementation is at the bound, no policy has a makespan speedup left to win. Then the
sensitivity: the same two figures with each of Tidal's constants (`PolicyConfig`) moved one
at a time; the defaults are chosen by the family's worst case, not by one workload; and the
same figures (Tidal and the Rubick re-implementation both re-run, same workloads) under the
truth's other extrapolation rules (`tidal.sim.tables`, step 4: what an unmeasured shape outside
the measured GPU counts runs at; `--extrapolation` sets the headline's); and, last, Tidal shown
the truth table itself as its model (`tidal.sim.views.PerfectPlanner`; the Rubick
re-implementation keeps the fitted model): where that row meets a goal the headline misses, the
gap is the model's error; where it misses too, the gap is the policy's; and both policies shown
the truth (their decisions alone, neither gaining nor losing by the model's errors). Last lines:
`sweep_geomean_jct_speedup_vs_rubick`, `sweep_geomean_makespan_speedup_vs_rubick`,
`sweep_min_makespan_speedup_vs_rubick`, `sweep_guarantee_violation_not_worse`, the makespans'
geomean over the bound (`sweep_geomean_makespan_over_bound_tidal`, `..._rubick`), the highest
makespan geomean speedup any policy could reach (`sweep_max_geomean_makespan_speedup_vs_rubick`:
the re-implementation's over the bound), the workloads where the re-implementation is within 1%
of the bound (`sweep_rubick_within_1pct_of_bound`), and `sweep_min_jct_speedup_vs_rubick`.
`--seeds N` runs the family for N seeds (other synthetic workloads, guarantee draws and profile
noise) and takes every figure over all of them: one seed's worst case can be one instance's
luck (a change that lowers seed 0's worst JCT case can raise seeds 1 and 2's). `--copies K`
goes further: each workload is also run (Tidal and the Rubick re-implementation) on K-1 copies
whose arrivals are jittered by up to `--jitter-s` (30 s, half a round: `tidal.sim.workload.
jittered`), a workload no scheduler would call different; it prints each copy's speedups and
their median per workload, and before the last line the geomean and worst case of those medians
(`sweep_median_of_copies_...`), the worst single copy (`sweep_every_copy_min_...`) and the
copies on which Tidal's violation is no worse. A worst case that a 30-s jitter moves by 0.2 is
one instance's chain of decisions; the median over copies is the policy's.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from statistics import median

from tidal.core.policy import PolicyConfig
from tidal.platform.argtypes import count
from tidal.sim.bounds import MakespanBound, makespan_bound
from tidal.sim.simulator import POLICIES, VIOLATION_CAUSES, SimConfig, Simulator
from tidal.sim.tables import EXTRAPOLATIONS, Truth
from tidal.sim.views import PerfectPlanner, SimPlanner
from tidal.sim.workload import SimJob, check_jobs, family, jittered

METRICS = (("avg_jct_s", "JCT"), ("makespan_s", "makespan"), ("guarantee_violation_s", "violation"),
           ("idle_while_waiting_gpu_s", "idle·wait GPU-s"))
# one constant at a time, around the default (PolicyConfig). aging_s 310 and horizon_s 620 (3%
# off) are the noise floor: a change that small should move nothing, and what it moves is how
# much of a worst case one instance's chain of decisions makes (docs/log/policy.md, 2026-11-29)
SENSITIVITY: dict[str, tuple[float | bool | str, ...]] = {
    "aging_s": (150.0, 310.0, 600.0, 1200.0), "horizon_s": (300.0, 620.0, 1200.0, 2400.0),
    "guarantee_margin": (0.0, 0.1, 0.3), "grow_into_idle": (False,), "max_restarts": (10, 40),
    "admission_preempts": ("later", "any"), "aging_width_cap": (2.0, 8.0, math.inf),
    "settle_s": (1200.0, 2400.0)}
PERFECT = "truth as Tidal's model"
BOTH_PERFECT = "truth as both models"


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def ratios(m: dict[str, dict[str, float]]) -> tuple[float, float, bool]:
    """Tidal's JCT and makespan speedups over the Rubick re-implementation, and whether its
    guarantee violation is no worse."""
    t, r = m["tidal"], m["rubick"]
    return (r["avg_jct_s"] / t["avg_jct_s"], r["makespan_s"] / t["makespan_s"],
            t["guarantee_violation_s"] <= r["guarantee_violation_s"] + 1e-6)


def run(jobs: list[SimJob], truth: Truth, planner: SimPlanner, policy: str,
        cfg: SimConfig) -> dict[str, float]:
    return Simulator(jobs, truth, planner, POLICIES[policy], cfg).run().metrics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, required=True)
    ap.add_argument("--workloads", type=Path, nargs="*", default=[],
                    help="shared workload CSVs (the first also gets the guarantee and rate variants)")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1,
                    help="run the family for seeds seed, seed+1, ... (synthetic workloads, guarantee "
                         "draws, profile noise): the figures are over every workload of every seed")
    ap.add_argument("--jobs", type=count(1), default=400, help="jobs per synthetic workload")
    ap.add_argument("--extrapolation", choices=EXTRAPOLATIONS, default="flat",
                    help="the truth's rule outside the measured GPU counts (tidal.sim.tables)")
    ap.add_argument("--no-sensitivity", action="store_true")
    ap.add_argument("--copies", type=int, default=1,
                    help="also run Tidal and the Rubick re-implementation on copies-1 copies of each "
                         "workload with arrivals jittered by up to --jitter-s (tidal.sim.workload.jittered) "
                         "and print the median of each workload's ratios over the copies")
    ap.add_argument("--jitter-s", type=float, default=30.0,
                    help="the copies' arrival jitter, seconds either way (default: half a 60-s round)")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.copies < 1:
        ap.error(f"--copies must be >= 1, got {args.copies}")
    if not (args.jitter_s > 0 and math.isfinite(args.jitter_s)):
        ap.error(f"--jitter-s must be a positive number of seconds, got {args.jitter_s}")
    policies = list(dict.fromkeys(["tidal", "rubick", *args.policies]))
    seeds = range(args.seed, args.seed + args.seeds)
    cfg = SimConfig()
    try:  # bad input: one line naming it, before any model is fitted
        truth = Truth(args.traces, args.extrapolation)
        # (name, jobs, seed): each seed's family, its names tagged with the seed when there are several
        shared = [str(p) for p in args.workloads]
        workloads = [(name if len(seeds) == 1 else f"{name}@{s}", jobs, s) for s in seeds
                     for name, jobs in family(truth, shared, seed=s, jobs=args.jobs)]
        for _, jobs, _ in workloads:
            check_jobs(jobs, truth.apps(), cfg.gpus)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    planners = {s: SimPlanner(truth=truth, seed=s) for s in seeds}
    t0 = time.time()
    results: dict[str, dict[str, dict[str, float]]] = {}
    # per workload, Tidal's (JCT, makespan) speedups and whether its violation is not worse, on
    # the workload itself (copy 0) and on its jittered copies
    copies: dict[str, list[tuple[float, float, bool]]] = {}
    for i, (name, jobs, seed) in enumerate(workloads):
        results[name] = {p: run(jobs, truth, planners[seed], p, cfg) for p in policies}
        copies[name] = [ratios(results[name])] + [
            ratios({p: run(jittered(jobs, args.jitter_s, seed=1000 * seed + k), truth, planners[seed], p, cfg)
                    for p in ("tidal", "rubick")}) for k in range(1, args.copies)]
        print(f"[{i + 1}/{len(workloads)}] {name}: {len(jobs)} jobs ({time.time() - t0:.0f} s)", flush=True)
    print(f"\n{'workload':<36}{'policy':<13}" + "".join(f"{label:>14}" for _, label in METRICS))
    for name, by_policy in results.items():
        for p, m in by_policy.items():
            print(f"{name:<36}{p:<13}" + "".join(f"{m[k]:>14,.0f}" for k, _ in METRICS))
    # the makespan no policy shown these options can beat (`tidal.sim.bounds`): how much of the
    # Rubick re-implementation's makespan is left to gain at all
    bounds: dict[str, MakespanBound] = {
        name: makespan_bound(jobs, truth, partial(planners[seed].options, kind="co"), cfg)
        for name, jobs, seed in workloads}
    jct = {n: c[0][0] for n, c in copies.items()}
    mk = {n: c[0][1] for n, c in copies.items()}
    viol_ok = {n: c[0][2] for n, c in copies.items()}
    print(f"\n{'workload':<36}{'JCT speedup':>14}{'makespan sp.':>14}  violation tidal / rubick "
          f"(each: {' + '.join(VIOLATION_CAUSES)})")

    def causes(m: dict[str, float]) -> str:
        return " + ".join(f"{m[f'guarantee_violation_{c}_s']:,.0f}" for c in VIOLATION_CAUSES)

    for n in results:
        v = results[n]
        print(f"{n:<36}{jct[n]:>14.3f}{mk[n]:>14.3f}  {v['tidal']['guarantee_violation_s']:,.0f} / "
              f"{v['rubick']['guarantee_violation_s']:,.0f}" + ("" if viol_ok[n] else "  WORSE")
              + (f"  ({causes(v['tidal'])} / {causes(v['rubick'])})" if v["tidal"]["guarantee_violation_s"]
                 or v["rubick"]["guarantee_violation_s"] else ""))

    print(f"\n{'workload':<36}{'makespan bound':>15}{'set by':>22}" + "".join(f"{p + ' ÷ bound':>16}"
                                                                         for p in ("tidal", "rubick")))
    over = {p: {n: results[n][p]["makespan_s"] / bounds[n].makespan_s for n in results}
            for p in ("tidal", "rubick")}
    for n, b in bounds.items():
        print(f"{n:<36}{b.makespan_s:>15,.0f}{b.set_by:>22}" + "".join(f"{over[p][n]:>16.3f}" for p in over)
              + ("  BELOW THE BOUND" if min(over[p][n] for p in over) < 1 - 1e-9 else ""))

    if args.copies > 1:  # the same figures, each workload's the median over its copies
        print(f"\narrival jitter ±{args.jitter_s:g} s, {args.copies} copies of each workload (copy 0: "
              "the workload itself):\nTidal's speedups over the Rubick re-implementation, each copy, "
              "then the median")
        for n, cs in copies.items():
            line = "   ".join(f"{what} " + " ".join(f"{x[k]:.3f}" for x in cs)
                               + f"  median {median(x[k] for x in cs):.3f}"
                               for k, what in ((0, "JCT"), (1, "makespan")))
            worse = sum(not x[2] for x in cs)
            print(f"{n:<36}{line}" + (f"  violation worse on {worse}" if worse else ""))

    if not args.no_sensitivity:
        print("\nsensitivity of Tidal's constants (one at a time; JCT and makespan speedup vs rubick)")
        print(f"{'constant':<30}{'geomean JCT':>14}{'min JCT':>10}{'geomean mk':>14}{'min mk':>10}"
              f"{'viol. not worse':>17}")
        base = PolicyConfig()
        rows: list[tuple[str, PolicyConfig, Truth]] = [("default", base, truth)]
        rows += [(f"{k}={v}", replace(base, **{k: v}), truth)  # type: ignore[arg-type]
                 for k, vals in SENSITIVITY.items() for v in vals]
        rows += [(f"truth: {e} extrapolation", base, Truth(args.traces, e))
                 for e in EXTRAPOLATIONS if e != args.extrapolation]
        # Tidal shown the truth table as its model (the Rubick re-implementation keeps the fitted
        # one): what Tidal loses to the model's error against what it loses to its own decisions;
        # then both shown it: the two policies' decisions alone, no model error on either side
        rows += [(PERFECT, base, truth), (BOTH_PERFECT, base, truth)]
        perfect = dict.fromkeys(seeds, PerfectPlanner(truth=truth))  # no noise: one for every seed
        for label, pc, world in rows:
            if label == "default":
                js, ms, ok = list(jct.values()), list(mk.values()), sum(viol_ok.values())
            else:
                c = replace(cfg, policy=pc)
                views = perfect if label in (PERFECT, BOTH_PERFECT) else planners
                runs = {n: run(jobs, world, views[sd], "tidal", c) for n, jobs, sd in workloads}
                ref = results if world is truth and label != BOTH_PERFECT else {
                    n: {"rubick": run(jobs, world, views[sd], "rubick", cfg)} for n, jobs, sd in workloads}
                rs = [ratios({"tidal": r, "rubick": ref[n]["rubick"]}) for n, r in runs.items()]
                js, ms, ok = [x[0] for x in rs], [x[1] for x in rs], sum(x[2] for x in rs)
            print(f"{label:<30}{geomean(js):>14.3f}{min(js):>10.3f}{geomean(ms):>14.3f}{min(ms):>10.3f}"
                  f"{f'{ok}/{len(js)}':>17}", flush=True)

    print(f"\nsweep_workloads: {len(results)}")
    print(f"sweep_geomean_jct_speedup_vs_rubick: {geomean(list(jct.values())):.3f}")
    print(f"sweep_geomean_makespan_speedup_vs_rubick: {geomean(list(mk.values())):.3f}")
    print(f"sweep_min_makespan_speedup_vs_rubick: {min(mk.values()):.3f}")
    print(f"sweep_guarantee_violation_not_worse: {sum(viol_ok.values())}/{len(viol_ok)}")
    for p in over:
        print(f"sweep_geomean_makespan_over_bound_{p}: {geomean(list(over[p].values())):.3f}")
    # Tidal at the bound on every workload: the highest makespan speedup any policy could reach
    print(f"sweep_max_geomean_makespan_speedup_vs_rubick: {geomean(list(over['rubick'].values())):.3f}")
    near = sum(x < 1.01 for x in over["rubick"].values())
    print(f"sweep_rubick_within_1pct_of_bound: {near}/{len(over['rubick'])}")
    if args.copies > 1:
        med = {k: [median(x[k] for x in cs) for cs in copies.values()] for k in (0, 1)}
        print(f"sweep_copies: {args.copies} (arrival jitter ±{args.jitter_s:g} s)")
        print(f"sweep_median_of_copies_geomean_jct_speedup_vs_rubick: {geomean(med[0]):.3f}")
        print(f"sweep_median_of_copies_min_jct_speedup_vs_rubick: {min(med[0]):.3f}")
        print(f"sweep_median_of_copies_geomean_makespan_speedup_vs_rubick: {geomean(med[1]):.3f}")
        print(f"sweep_median_of_copies_min_makespan_speedup_vs_rubick: {min(med[1]):.3f}")
        every = [x for cs in copies.values() for x in cs]
        print(f"sweep_every_copy_min_jct_speedup_vs_rubick: {min(x[0] for x in every):.3f}")
        print(f"sweep_every_copy_min_makespan_speedup_vs_rubick: {min(x[1] for x in every):.3f}")
        print(f"sweep_every_copy_guarantee_violation_not_worse: {sum(x[2] for x in every)}/{len(every)}")
    print(f"sweep_min_jct_speedup_vs_rubick: {min(jct.values()):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
