"""Every scheduling policy on one workload, in the trace-driven simulator (the Rubick setting).

    python benchmarks/sim_compare.py --workload ../shared/traces/rubick/workload-base.csv \
        --traces ../shared/traces/rubick

8 nodes × 8 GPUs (96 CPUs, 1,600 GB each), 60-s scheduling rounds (`--event-driven` for
decisions at every arrival and completion), 260 s of lost progress per start or change,
iteration times looked up in the measured tables for the plan and placement actually chosen;
the policies see only the planner's model fitted on ≤ 8 noisy profiled rows per application
(`--extrapolation`: how the truth prices shapes outside the measured GPU counts).
Prints a policy × metrics table, each policy's makespan over the bound no policy shown the same
options can beat (`tidal.sim.bounds`), then `tidal_avg_jct_s`, `tidal_makespan_s`,
`jct_speedup_vs_rubick`, `jct_speedup_vs_fifo_static` and last `makespan_speedup_vs_fifo_static`.
Writes `<out>/<workload>-jct-cdf.png` and `<out>/<workload>-<policy>-timeline.png`.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

from tidal.core.correction import CorrectionConfig
from tidal.platform.argtypes import amount
from tidal.sim.bounds import makespan_bound
from tidal.sim.plots import allocation_timeline, jct_cdf
from tidal.sim.simulator import POLICIES, SimConfig, Simulator
from tidal.sim.tables import EXTRAPOLATIONS, Truth
from tidal.sim.views import SimPlanner
from tidal.sim.workload import check_jobs, read_workload

COLUMNS = ("avg_jct_s", "p99_jct_s", "makespan_s", "avg_queue_s", "gpu_util", "restarts_per_job",
           "guarantee_violation_s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", type=Path, required=True)
    ap.add_argument("--traces", type=Path, required=True)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    ap.add_argument("--event-driven", action="store_true",
                    help="decide at arrivals and completions instead of 60-s rounds")
    ap.add_argument("--noise", type=amount(0.0, strict=False), default=0.05,
                    help="log-sd of the profiles' noise")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-correction", action="store_true",
                    help="no online correction of predictions by true throughput (tidal.core.correction)")
    ap.add_argument("--extrapolation", choices=EXTRAPOLATIONS, default="flat",
                    help="the truth's rule outside the measured GPU counts (tidal.sim.tables)")
    ap.add_argument("--out", type=Path, default=Path("results"))
    args = ap.parse_args(argv)
    if "tidal" not in args.policies:
        ap.error("--policies must include tidal")
    try:  # bad input: one line naming it, before any model is fitted
        truth = Truth(args.traces, args.extrapolation)
        jobs = read_workload(args.workload)
        check_jobs(jobs, truth.apps(), SimConfig().gpus)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    planner = SimPlanner(truth=truth, noise=args.noise, seed=args.seed)
    t0 = time.time()
    for app in sorted({j.app for j in jobs}):
        m = planner.model(app)
        print(f"planner: {app:<8} fitted on {m.profiled} profiled rows, fit error {100 * m.fit.mape:.1f}%",
              flush=True)
    print(f"planner: {time.time() - t0:.0f} s\n")
    cfg = SimConfig(round_s=None if args.event_driven else 60.0,
                    correction=None if args.no_correction else CorrectionConfig())
    results = {}
    for name in args.policies:
        t = time.time()
        results[name] = Simulator(jobs, truth, planner, POLICIES[name], cfg).run()
        print(f"simulated {name:<12} {len(jobs)} jobs in {time.time() - t:.1f} s", flush=True)
    print(f"\n{'policy':<13}" + "".join(f"{c:>22}" for c in COLUMNS))
    for name, r in results.items():
        print(f"{name:<13}" + "".join(f"{r.metrics[c]:>22,.3f}" for c in COLUMNS))
    # the makespan no policy shown the same options can beat (`tidal.sim.bounds`), per policy
    # (the static ones are shown other options than the co-optimizing ones)
    print("\nmakespan ÷ the bound for the options each policy is shown (tidal.sim.bounds):")
    for name, r in results.items():
        kind = POLICIES[name].kind
        b = makespan_bound(jobs, truth, partial(planner.options, kind=kind), cfg)
        print(f"  {name:<13}{r.metrics['makespan_s'] / b.makespan_s:>7.3f}  (bound {b.makespan_s:,.0f} s, "
              f"set by {b.set_by}; options: {kind})")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.workload.stem
    jct_cdf(list(results.values()), args.out / f"{stem}-jct-cdf.png", title=f"JCT CDF — {stem}")
    capacity = cfg.gpus
    for name, r in results.items():
        allocation_timeline(r, capacity, args.out / f"{stem}-{name}-timeline.png")
    print(f"\nwrote {args.out}/{stem}-jct-cdf.png and {len(results)} timelines")
    tidal = results["tidal"].metrics
    base = results.get("fifo_static")
    rub = results.get("rubick")
    print(f"tidal_avg_jct_s: {tidal['avg_jct_s']:.1f}")
    print(f"tidal_makespan_s: {tidal['makespan_s']:.1f}")
    if rub:
        print(f"jct_speedup_vs_rubick: {rub.metrics['avg_jct_s'] / tidal['avg_jct_s']:.3f}")
    if base:
        print(f"jct_speedup_vs_fifo_static: {base.metrics['avg_jct_s'] / tidal['avg_jct_s']:.3f}")
        print(f"makespan_speedup_vs_fifo_static: {base.metrics['makespan_s'] / tidal['makespan_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
