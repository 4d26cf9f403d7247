"""The simulator and Tidal's policy at scale: a seeded synthetic workload on a large cluster.

    python benchmarks/sim_scale.py --jobs 5000 --gpus 1024

The workload has the Rubick traces' columns and mix (`tidal.sim.workload.synthetic`): Poisson
arrivals at the traces' rate per GPU (406 jobs in 13.2 h on 64 GPUs, scaled to `--gpus`),
log-normal ideal durations (median 60 s, log-sd 2: mean ≈ 440 s). 8 GPUs per node, 60-s rounds, 260 s per
restart. Prints progress, the metrics, `p50_round_ms: Y` (one controller step: snapshot →
policy → actions) and last `sim_seconds: X`, the wall time of the whole run (planner fits
included). Goal: under 5 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from tidal.platform.argtypes import count
from tidal.sim.simulator import POLICIES, SimConfig, Simulator
from tidal.sim.tables import Truth
from tidal.sim.views import SimPlanner
from tidal.sim.workload import synthetic, write_workload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=count(1), default=5000)
    ap.add_argument("--gpus", type=count(8), default=1024)
    default_traces = Path(__file__).resolve().parents[2] / "shared" / "traces" / "rubick"
    ap.add_argument("--traces", type=Path, default=default_traces)
    ap.add_argument("--policy", default="tidal", choices=list(POLICIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-workload", type=Path, help="also write the generated workload as CSV")
    args = ap.parse_args(argv)
    if args.gpus % 8:
        ap.error("--gpus must be a multiple of 8 (8 GPUs per node)")
    t0 = time.time()
    truth = Truth(args.traces)
    rate = 406 / 13.2 * args.gpus / 64
    jobs = synthetic(truth, jobs=args.jobs, jobs_per_hour=rate, seed=args.seed, median_s=60.0, sigma=2.0)
    if args.write_workload:
        write_workload(jobs, args.write_workload)
    planner = SimPlanner(truth=truth, seed=args.seed)
    for app in sorted({j.app for j in jobs}):
        planner.model(app)
    print(f"{len(jobs)} jobs over {jobs[-1].submit / 3600:.1f} h on {args.gpus} GPUs; planner fitted "
          f"in {time.time() - t0:.0f} s", flush=True)
    cfg = SimConfig(nodes=args.gpus // 8, gpus_per_node=8)

    def progress(t: float, done: int, total: int) -> None:
        print(f"  t = {t / 3600:6.1f} h   {done:>5}/{total} jobs done   {time.time() - t0:6.0f} s wall",
              flush=True)

    r = Simulator(jobs, truth, planner, POLICIES[args.policy], cfg).run(progress=progress)
    for k, v in r.metrics.items():
        print(f"{k}: {v:,.3f}")
    print(f"decisions: {len(r.round_ms)}, p99 {np.percentile(r.round_ms, 99):.1f} ms")
    print(f"p50_round_ms: {np.percentile(r.round_ms, 50):.2f}")
    print(f"sim_seconds: {time.time() - t0:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
