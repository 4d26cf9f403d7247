"""Wall time of one reconfiguration: from "stop with checkpoint" to the first step of the new plan.

For the reference tiny GPT on CPU: a run under plan A is asked to stop (`RunHandle.stop()`)
once warm; it finishes its step, gathers and writes the plan-independent checkpoint, and its
workers exit; a run under plan B (other dp degree and ZeRO stage) starts from that checkpoint.
reconfig_seconds = (end of B's first step) − (stop request). Its parts are printed: the drain
(stop → A's result returned) and the restart (→ B's first step done, including Ray Train's
worker-group start, engine build and checkpoint restore).

Last line: `reconfig_seconds: X` (the mean over the reconfigurations measured).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from tidal import Plan, Resources, launch
from tidal.jobs.reference import shakespeare_gpt
from tidal.platform.argtypes import count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--warm-steps", type=count(1), default=5)
    args = ap.parse_args()
    ray.init(address="local", num_cpus=4, num_gpus=4, log_to_driver=False)  # its own, not a running one
    spec = shakespeare_gpt(total_steps=100_000, checkpoint_every=100_000)
    plans = [
        Plan(dp=2, zero_stage=1, micro_batch=8, grad_accum=2),
        Plan(dp=1, zero_stage=3, micro_batch=16, grad_accum=2),
        Plan(dp=2, zero_stage=2, offload_optimizer=True, micro_batch=16),
    ]
    ckpt = None
    handle = launch(spec, plans[0], Resources(num_workers=plans[0].dp, gpus_per_worker=1))
    costs: list[float] = []
    for old, new in itertools.pairwise(plans):
        start = handle.start_step
        while (handle.progress() or {}).get("step", 0) < start + args.warm_steps:
            time.sleep(0.1)
        handle.stop()
        result = handle.result()
        stop_at = result.stop_requested_at
        assert stop_at is not None and result.checkpoint is not None
        drained = time.time()
        ckpt = result.checkpoint
        handle = launch(spec, new, Resources(num_workers=new.dp, gpus_per_worker=1), ckpt)
        while not (p := handle.progress()):
            time.sleep(0.05)
        first_step_done = p["time"]
        cost = first_step_done - stop_at
        costs.append(cost)
        print(f"{old.short():>18} @ step {result.final_step} → {new.short():<18} "
              f"drain {drained - stop_at:5.1f} s + restart {first_step_done - drained:5.1f} s "
              f"= {cost:5.1f} s", flush=True)
    handle.stop()
    handle.result()
    ray.shutdown()
    print(f"reconfig_seconds: {statistics.mean(costs):.1f}")


if __name__ == "__main__":
    main()
