"""Submit the Shakespeare GPT job to the Tidal scheduler and wait for it.

Against a running cluster (`ray start --head --num-gpus=4`, or `ray up cluster.yaml`):

    RAY_AUTH_MODE=token ray job submit --working-dir . -- python examples/submit_job.py [STEPS]

The script defines its JobSpec, submits it (starting the detached `tidal-scheduler` actor if
the cluster has none) and waits; `tidal status` shows it meanwhile.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from tidal.jobs.spec import SpecError
from tidal.platform import sdk

sys.path.insert(0, "examples")
from shakespeare_job import make_spec

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Submit the Shakespeare GPT job and wait for it")
    ap.add_argument("steps", nargs="?", type=int, help="a shorter run, e.g. to check a cluster")
    args = ap.parse_args()
    spec = make_spec()
    if args.steps is not None:
        try:
            spec = replace(spec, total_steps=args.steps, lr=3e-3)
        except SpecError as e:  # checked here, before anything reaches the cluster
            ap.error(f"STEPS: {e}")
    handle = sdk.submit(spec)
    print(f"submitted {handle.job_id}", flush=True)
    final = handle.wait()
    print(f"{handle.job_id}: {final['state']} at step {final['step']}, plan {final['plan'] or '-'}")
    sys.exit(0 if final["state"] == "SUCCEEDED" else 1)
