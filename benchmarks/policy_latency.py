"""Latency of one scheduling round of the pure policy (`tidal.core.policy.decide`).

A synthetic cluster of 8-GPU nodes and a job mix like the Rubick workloads: GPU counts that
divide each job's global batch, concave throughput curves n^α, a quarter of the jobs
guaranteed, half of them running (so damping and sticky placement are exercised), and jobs
waiting in the queue. Prints the median over --rounds rounds and, last, `decision_ms: X`.

    python benchmarks/policy_latency.py --jobs 500 --gpus 512      # goal: ≤ 100 ms
    python benchmarks/policy_latency.py --jobs 5000 --gpus 8192
    python benchmarks/policy_latency.py --jobs 5000 --gpus 8192 --fragmented

--fragmented: the round `decide` finds hardest to place. Every node has 7 of its 8 GPUs held by
a running guaranteed job, half the jobs are guaranteed ones waiting for 48 GPUs packed on 6
nodes (none can be placed: no node is empty), the rest small best-effort jobs. The knapsack runs
again without the jobs placement refused; dropping them one round at a time took 809 ms at 728
jobs on 1,024 GPUs (150 rounds) before floors that cannot be packed were dropped together.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace

from tidal.core.gcpause import paused_gc
from tidal.core.policy import Allocation, JobView, Node, Option, Snapshot, decide
from tidal.jobs import Plan


def snapshot(jobs: int, gpus: int, seed: int = 0) -> Snapshot:
    rng = random.Random(seed)
    nodes = tuple(Node(node_id=f"node-{i}", gpus=8, cpus=96, memory=1600 * 2**30,
                       recallable=i % 10 == 9) for i in range(gpus // 8))
    views = []
    for k in range(jobs):
        batch = rng.choice([16, 32, 64, 128])
        base, alpha = rng.uniform(10, 400), rng.uniform(0.5, 0.95)
        counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if batch % n == 0 and n <= 64]
        lo = rng.choice(counts[:3])
        opts = tuple(Option(gpus=n, plan=Plan(dp=n, micro_batch=batch // n), samples_per_s=base * n**alpha,
                            cpus_per_gpu=4, memory_per_gpu=64 * 2**30) for n in counts if n >= lo)
        g = opts[min(1, len(opts) - 1)].samples_per_s * 0.8 if rng.random() < 0.25 else None
        views.append(JobView(job_id=f"job-{k}", arrival=float(k), options=opts, guarantee=g,
                             remaining_samples=rng.uniform(1e4, 1e7), restart_cost_s=rng.uniform(30, 300)))
    first = decide(Snapshot(now=float(jobs), nodes=nodes, jobs=tuple(views)))
    running = [JobView(job_id=v.job_id, arrival=v.arrival, options=v.options, guarantee=v.guarantee,
                       current=first.allocations.get(v.job_id) if i % 2 == 0 else None,
                       remaining_samples=v.remaining_samples, restart_cost_s=v.restart_cost_s)
               for i, v in enumerate(views)]
    return Snapshot(now=float(jobs) + 60.0, nodes=nodes, jobs=tuple(running))


def fragmented(jobs: int, gpus: int) -> Snapshot:
    """The --fragmented round (module docstring)."""
    def opt(n: int, sps: float) -> Option:
        return Option(gpus=n, plan=Plan(dp=n, micro_batch=max(1, 96 // n)), samples_per_s=sps)

    nodes = tuple(Node(node_id=f"node-{i}", gpus=8) for i in range(gpus // 8))
    views = [JobView(job_id=f"run-{i}", arrival=float(i), options=(opt(7, 70.0),), guarantee=70.0,
                     current=Allocation(gpus_by_node=((n.node_id, 7),), plan=opt(7, 70.0).plan),
                     remaining_samples=1e9) for i, n in enumerate(nodes)]
    waiting = max(0, jobs - len(views))
    views += [JobView(job_id=f"big-{k}", arrival=1e5 + k, options=(opt(48, 480.0),), guarantee=480.0,
                      remaining_samples=1e6) for k in range(waiting // 2)]
    views += [JobView(job_id=f"small-{k}", arrival=2e5 + k, options=(opt(1, 10.0), opt(2, 19.0)),
                      remaining_samples=1e6) for k in range(waiting - waiting // 2)]
    return Snapshot(now=3e5, nodes=nodes, jobs=tuple(views))


def cold(snap: Snapshot) -> Snapshot:
    """A copy of `snap` with new job and allocation objects, nothing cached on them: what the
    scheduler hands `decide` each round (the rounds would otherwise reuse the first one's cached
    properties)."""
    return replace(snap, jobs=tuple(replace(j, current=None if j.current is None else replace(j.current))
                                    for j in snap.jobs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--gpus", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--fragmented", action="store_true", help="the hardest round to place (module docstring)")
    args = ap.parse_args()
    if args.jobs < 1 or args.rounds < 1:
        ap.error(f"--jobs and --rounds must be >= 1, got {args.jobs} and {args.rounds}")
    if args.gpus < 8 or args.gpus % 8:
        ap.error(f"--gpus must be a positive multiple of 8 (nodes of 8 GPUs), got {args.gpus}")
    if args.fragmented and args.jobs <= args.gpus // 8:
        ap.error(f"--fragmented: --jobs must exceed the {args.gpus // 8} nodes (one running job each), "
                 f"got {args.jobs}")
    snap = fragmented(args.jobs, args.gpus) if args.fragmented else snapshot(args.jobs, args.gpus)
    times = []
    for _ in range(args.rounds):
        fresh = cold(snap)
        t0 = time.perf_counter()
        with paused_gc():  # as the scheduler and the simulator call it
            d = decide(fresh)
        times.append(1e3 * (time.perf_counter() - t0))
    used = sum(a.gpus for a in d.allocations.values())
    print(f"{args.jobs} jobs, {args.gpus} GPUs: {len(d.allocations)} run on {used} GPUs, "
          f"{len(d.changed)} change; rounds {', '.join(f'{t:.0f}' for t in times)} ms")
    print(f"decision_ms: {statistics.median(times):.1f}")


if __name__ == "__main__":
    main()
