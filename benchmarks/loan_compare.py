"""Lending idle inference GPUs to training, in the simulator: no loans, Kueue-style evict-on-reclaim,
Tidal (risk-bounded loans, least-cost shrinking reclaims), a clairvoyant oracle, and Lyra's static
baseline.

    python benchmarks/loan_compare.py --workload ../shared/traces/rubick/workload-base.csv \\
        --traces ../shared/traces/rubick --serving ../shared/traces/azure-llm/AzureLLMInferenceTrace_conv.csv

Rubick's training cluster (8 nodes × 8 GPUs, 60-s rounds, 260 s per start or change) plus an
inference pool of 4 × 8 GPUs. Inference demand follows the serving trace: its arrivals
time-scaled to span the workload (the no-loan run's makespan), under a diurnal envelope (one
ebb and flow per day, or per span when the workload is shorter than a day), counted per 60-s
interval and scaled so that the busiest interval needs all 32 inference GPUs at the SLO (`--phase`:
where in its cycle the envelope starts; 0, the default, starts at the trough), with
one replica's measured capacity (`tidal.serving.app.REPLICA_RPS`).

The arms (`ARMS`): `no_loan`, `evict` (Kueue's cohort borrowing), `tidal` (the loan manager,
`tidal.serving.loans`, at `--risk`), `oracle` (a loan manager that knows the demand of the
coming lead time and lends the rest: the most any forecast could lend without a shortfall) run
the same policy (`tidal.core.policy.decide`) and differ only in the inference pool's loans
(`tidal.sim.serving`); `static` is FIFO at each job's requested GPUs and plan with no loans, the
scheduler Lyra's 1.48–1.50× is measured against (loaning *and* elastic scaling).

Before them, the ceiling: the same policy on a training cluster that owns the inference pool's
nodes outright (no serving at all). No loaning scheme can beat it, so `loan_jct_ceiling` and
`loan_queue_ceiling` say what a workload leaves to win (a workload whose queue is jobs larger
than the lendable GPUs leaves little).

Prints each arm's metrics, then `loan_jct_speedup` (no-loan avg JCT ÷ Tidal's),
`queue_speedup` (no-loan avg queueing ÷ Tidal's), `utilization_gain_points` (all 96 GPUs, Tidal
minus no-loan, percentage points), `preemptions_per_job` of both loaning arms,
`lyra_jct_speedup` (static avg JCT ÷ Tidal's), `oracle_loan_jct_speedup` (no-loan ÷ oracle),
`lent_capture` (Tidal's lent GPU-seconds ÷ the oracle's), `wasted_loans` (the share of loans
recalled while the borrower still restarts), `oracle_slo_violation_rate` (0: the oracle never
misses; checked), and last `slo_violation_rate` (the share of requests over the SLO under
Tidal). Writes `<out>/loan-<workload>-timeline.png` (inference pool: demand, replicas, GPUs lent).

`--serving-family` runs the workload under every demand of `tidal.sim.traffic.family` (seeded
on/off bursts, flash crowds, a diurnal day, a slow ramp, and the serving trace at several
time-scales), one line each, then the worst cases, `family_max_slo_violation_rate` last: a loan
manager is judged on traffic it was not shaped on.

`--family W.csv ...` runs the same comparison on every workload of the policy sweep's family
(`tidal.sim.workload.family` over those traces, `--seed`: the shared traces, their variants with
guaranteed jobs and other arrival rates, nine synthetic ones), one line each, then the geometric
mean and the worst case of `loan_jct_speedup` and `queue_speedup` over the family (`family_*`
lines, `family_min_loan_jct_speedup` last): a loaning scheme is judged on workloads it was not
tuned on, as the policy is (`benchmarks/sim_sweep.py`).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from tidal.platform.argtypes import amount, count
from tidal.serving.app import REPLICA_RPS
from tidal.serving.loans import LoanConfig
from tidal.serving.traffic import Envelope, demand_series, read_arrivals
from tidal.sim.serving import InferencePool, Mode
from tidal.sim.simulator import POLICIES, SimConfig, SimResult, Simulator
from tidal.sim.tables import Truth
from tidal.sim.traffic import family as traffic_family
from tidal.sim.views import SimPlanner
from tidal.sim.workload import SimJob, check_jobs, family, read_workload

# arm → (training policy, the inference pool's mode; `tidal.sim.serving`)
ARMS: dict[str, tuple[str, Mode]] = {"no_loan": ("tidal", "none"), "evict": ("tidal", "evict"),
                                     "tidal": ("tidal", "shrink"), "oracle": ("tidal", "oracle"),
                                     "static": ("fifo_static", "none")}
LOANING = ("evict", "tidal", "oracle")  # the arms whose figures depend on the serving demand
COLUMNS = ("avg_jct_s", "avg_queue_s", "makespan_s", "gpu_util_all", "preemptions_per_job",
           "slo_violation_rate", "lent_gpu_s", "wasted_loans")


def timeline_png(results: dict[str, tuple[SimResult, Simulator]], path: Path, replica_rps: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(11, 2.6 * len(results)), sharex=True)
    for ax, (name, (_, sim)) in zip(axes, results.items(), strict=True):
        assert sim.serving is not None
        tl = sim.serving.stats.timeline
        t = [x[0] / 3600 for x in tl]
        ax.step(t, [x[3] / replica_rps for x in tl], where="post", color="k", lw=0.8,
                label="demand (replicas at the SLO)")
        ax.step(t, [x[1] for x in tl], where="post", color="tab:blue", label="GPUs serving")
        ax.fill_between(t, 0, [x[2] for x in tl], step="post", color="tab:orange", alpha=0.5,
                        label="GPUs lent to training")
        ax.set_ylabel(f"{name}\nGPUs")
        ax.set_ylim(0, sim.serving.total + 1)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left", ncol=3)
    axes[-1].set_xlabel("time (h)")
    fig.suptitle("Inference pool: demand, replicas, and GPUs lent to training")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


Arms = dict[str, tuple[SimResult, Simulator]]


class Bench:
    """One workload's runs: those without serving demand once (the span, the ceiling), the arms
    for each demand series (`arms`)."""

    def __init__(self, jobs: list[SimJob], truth: Truth, planner: SimPlanner, args: argparse.Namespace,
                 say: bool = True) -> None:
        self.jobs, self.truth, self.planner, self.args, self.say = jobs, truth, planner, args, say
        self.cfg = SimConfig()
        self.interval = self.cfg.round_s or 60.0
        self.pool_gpus = args.inference_nodes * 8
        t0 = time.time()
        base = Simulator(jobs, truth, planner, POLICIES["tidal"], self.cfg).run()
        self.span = max(j.finish for j in base.jobs)
        self.intervals = max(1, math.ceil(self.span / self.interval))
        self._say(f"no-loan training run: makespan {base.metrics['makespan_s']:,.0f} s "
                  f"({time.time() - t0:.0f} s)")
        t = time.time()
        whole = replace(self.cfg, nodes=self.cfg.nodes + args.inference_nodes)
        self.owned = Simulator(jobs, truth, planner, POLICIES["tidal"], whole).run()
        m = self.owned.metrics
        self._say(f"ceiling: {whole.nodes} training nodes, no serving: avg JCT {m['avg_jct_s']:,.0f} s, "
                  f"queue {m['avg_queue_s']:,.0f} s ({time.time() - t:.1f} s)")

    def _say(self, line: str) -> None:
        if self.say:
            print(line, flush=True)

    def trace_demand(self, arrivals: np.ndarray) -> np.ndarray:
        """The serving trace as the module docstring describes it."""
        return demand_series(arrivals, self.span, self.interval,
                             peak_rps=self.pool_gpus * self.args.replica_rps,
                             envelope=Envelope(period_s=min(86_400.0, self.span), phase=self.args.phase))

    def arms(self, rates: np.ndarray) -> Arms:
        """Every arm on one demand series (the fixed ones' training once, their serving each time)."""
        a = self.args
        mean, peak = rates.mean() / a.replica_rps, rates.max() / a.replica_rps
        self._say(f"serving demand: {len(rates)} intervals, mean {mean:.1f} replicas, peak {peak:.0f} "
                  f"(replica {a.replica_rps:g} req/s at the SLO)")
        out: Arms = {}
        for name, (policy, mode) in ARMS.items():
            t = time.time()
            loan = LoanConfig(replica_rps=a.replica_rps, interval_s=self.interval, predictive=mode != "evict",
                              risk=a.risk, min_replicas=a.min_replicas)
            pool = InferencePool(rates=tuple(float(r) for r in rates), loan=loan, mode=mode,
                                 nodes=a.inference_nodes)
            sim = Simulator(self.jobs, self.truth, self.planner, POLICIES[policy], self.cfg, serving=pool)
            out[name] = (sim.run(), sim)
            self._say(f"simulated {name:<8} in {time.time() - t:.1f} s")
        return out


def speedups(owned: SimResult, results: Arms) -> dict[str, float]:
    """The printed figures of one workload and demand (the module docstring)."""
    no, evict, tidal, oracle, static = (results[k][0].metrics for k in ARMS)
    return {"loan_jct_ceiling": no["avg_jct_s"] / owned.metrics["avg_jct_s"],
            "loan_queue_ceiling": no["avg_queue_s"] / max(owned.metrics["avg_queue_s"], 1e-9),
            "loan_jct_speedup": no["avg_jct_s"] / tidal["avg_jct_s"],
            "queue_speedup": no["avg_queue_s"] / max(tidal["avg_queue_s"], 1e-9),
            "utilization_gain_points": 100 * (tidal["gpu_util_all"] - no["gpu_util_all"]),
            "preemptions_per_job_evict": evict["preemptions_per_job"],
            "preemptions_per_job_tidal": tidal["preemptions_per_job"],
            "lyra_jct_speedup": static["avg_jct_s"] / tidal["avg_jct_s"],
            "oracle_loan_jct_speedup": no["avg_jct_s"] / oracle["avg_jct_s"],
            "lent_capture": tidal["lent_gpu_s"] / oracle["lent_gpu_s"] if oracle["lent_gpu_s"] else 1.0,
            "wasted_loans": tidal["wasted_loans"],
            "oracle_slo_violation_rate": oracle["slo_violation_rate"],
            "slo_violation_rate": tidal["slo_violation_rate"]}


def run_serving_family(bench: Bench, arrivals: np.ndarray) -> int:
    """`--serving-family`: one workload under every demand of `tidal.sim.traffic.family`, one line
    each, then the family's worst cases, the share of requests over the SLO last."""
    cols = {"loan_jct_speedup": "JCT ×", "oracle_loan_jct_speedup": "oracle JCT ×", "lent_capture": "capture",
            "preemptions_per_job_tidal": "preempt/job", "preemptions_per_job_evict": "evict p/job",
            "wasted_loans": "wasted", "slo_violation_rate": "over SLO"}
    print(f"{'demand':<18}" + "".join(f"{h:>13}" for h in cols.values()), flush=True)
    figures: list[dict[str, float]] = []
    t0 = time.time()
    demands = traffic_family(arrivals, bench.intervals, bench.interval,
                             peak_rps=bench.pool_gpus * bench.args.replica_rps, seed=bench.args.seed)
    for name, rates in demands:
        f = speedups(bench.owned, bench.arms(rates))
        assert f["oracle_slo_violation_rate"] == 0.0, f"{name}: the oracle missed the SLO"
        figures.append(f)
        row = "".join(f"{f[c]:>13.4f}" for c in cols)
        print(f"{name:<18}{row}   ({time.time() - t0:.0f} s)", flush=True)
    print(f"\nfamily_demands: {len(figures)}")
    print(f"family_min_loan_jct_speedup: {min(f['loan_jct_speedup'] for f in figures):.3f}")
    print(f"family_min_lent_capture: {min(f['lent_capture'] for f in figures):.3f}")
    print(f"family_max_wasted_loans: {max(f['wasted_loans'] for f in figures):.3f}")
    worst = max(f["preemptions_per_job_tidal"] / max(f["preemptions_per_job_evict"], 1e-9) for f in figures)
    print(f"family_max_preemptions_vs_evict: {worst:.3f}")
    print(f"family_max_slo_violation_rate: {max(f['slo_violation_rate'] for f in figures):.4f}")
    return 0


def run_family(args: argparse.Namespace, workloads: list[tuple[str, list[SimJob]]], truth: Truth,
               planner: SimPlanner, arrivals: np.ndarray) -> int:
    """`--family`: every workload of the sweep's family (`workloads`), one line each, then the
    family's figures."""
    cols = {"loan_jct_speedup": "JCT ×", "queue_speedup": "queue ×", "utilization_gain_points": "util +pts",
            "preemptions_per_job_tidal": "preempt/job", "slo_violation_rate": "over SLO",
            "loan_jct_ceiling": "JCT ceiling"}
    print(f"{'workload':<38}" + "".join(f"{h:>12}" for h in cols.values()), flush=True)
    figures: list[dict[str, float]] = []
    t0 = time.time()
    for name, jobs in workloads:
        bench = Bench(jobs, truth, planner, args, say=False)
        f = speedups(bench.owned, bench.arms(bench.trace_demand(arrivals)))
        figures.append(f)
        row = "".join(f"{f[c]:>12.3f}" for c in cols)
        print(f"{name:<38}{row}   ({time.time() - t0:.0f} s)", flush=True)

    def geomean(k: str) -> float:
        return math.exp(sum(math.log(max(f[k], 1e-9)) for f in figures) / len(figures))

    print(f"\nfamily_workloads: {len(figures)}")
    print(f"family_geomean_loan_jct_speedup: {geomean('loan_jct_speedup'):.3f}")
    print(f"family_geomean_queue_speedup: {geomean('queue_speedup'):.3f}")
    print(f"family_min_queue_speedup: {min(f['queue_speedup'] for f in figures):.3f}")
    print(f"family_max_slo_violation_rate: {max(f['slo_violation_rate'] for f in figures):.4f}")
    print(f"family_min_loan_jct_speedup: {min(f['loan_jct_speedup'] for f in figures):.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--workload", type=Path, help="one workload (CSV): every arm's metrics and the PNG")
    which.add_argument("--family", type=Path, nargs="+",
                       help="shared traces (CSV) to build the sweep's family from; one line per workload")
    ap.add_argument("--serving-family", action="store_true",
                    help="with --workload: every demand of tidal.sim.traffic.family, one line each")
    ap.add_argument("--traces", type=Path, required=True)
    ap.add_argument("--serving", type=Path, required=True, help="an Azure LLM inference trace (CSV)")
    ap.add_argument("--replica-rps", type=amount(), default=REPLICA_RPS)
    ap.add_argument("--inference-nodes", type=count(1), default=4)
    ap.add_argument("--phase", type=float, default=0.0,
                    help="the envelope's phase at the workload's start, in periods (0: the trough)")
    ap.add_argument("--risk", type=float, default=LoanConfig.risk,
                    help="the loan manager's risk target (tidal.serving.loans.LoanConfig.risk)")
    ap.add_argument("--min-replicas", type=int, default=LoanConfig.min_replicas,
                    help="the availability floor: replicas lending never takes (LoanConfig.min_replicas)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results"))
    args = ap.parse_args(argv)
    if args.serving_family and args.family:
        ap.error("--serving-family runs one workload (--workload), not --family")
    if not 0.0 < args.risk < 1.0:
        ap.error(f"--risk: a probability in (0, 1), got {args.risk}")
    if args.min_replicas < 0:
        ap.error(f"--min-replicas: a count of replicas (0 or more), got {args.min_replicas}")
    try:  # bad input: one line naming it, before any model is fitted
        arrivals = read_arrivals(args.serving)
        truth = Truth(args.traces)
        workloads = (family(truth, [str(p) for p in args.family], seed=args.seed) if args.family
                     else [(args.workload.stem, read_workload(args.workload))])
        for _, w in workloads:
            check_jobs(w, truth.apps(), SimConfig().gpus)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    planner = SimPlanner(truth=truth, seed=args.seed)
    if args.family:
        return run_family(args, workloads, truth, planner, arrivals)
    bench = Bench(workloads[0][1], truth, planner, args)
    if args.serving_family:
        return run_serving_family(bench, arrivals)
    results = bench.arms(bench.trace_demand(arrivals))
    print(f"\n{'arm':<9}" + "".join(f"{c:>21}" for c in COLUMNS))
    for name, (r, _) in results.items():
        print(f"{name:<9}" + "".join(f"{r.metrics[c]:>21,.4f}" for c in COLUMNS))
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / f"loan-{args.workload.stem}-timeline.png"
    timeline_png({k: results[k] for k in ("no_loan", *LOANING)}, png, args.replica_rps)
    print(f"\nwrote {png}")
    for k, v in speedups(bench.owned, results).items():
        digits = {"slo_violation_rate": 4, "oracle_slo_violation_rate": 4,
                  "utilization_gain_points": 2}.get(k, 3)
        print(f"{k}: {v:.{digits}f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
