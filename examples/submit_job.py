"""Submit the Shakespeare GPT job to the Tidal scheduler and wait for it.

Against a running cluster (`ray start --head --num-gpus=4`, or `ray up cluster.yaml`):

    RAY_AUTH_MODE=token ray job submit --working-dir . -- python examples/submit_job.py [STEPS]

The script defines its JobSpec, submits it (starting the detached `tidal-scheduler` actor if
the cluster has none) and waits; `tidal status` shows it meanwhile.
"""

from __future__ import annotations

import sys

from tidal.platform import sdk

sys.path.insert(0, "examples")
from shakespeare_job import make_spec

if __name__ == "__main__":
    spec = make_spec()
    if len(sys.argv) > 1:  # a shorter run, e.g. to check a cluster
        from dataclasses import replace

        spec = replace(spec, total_steps=int(sys.argv[1]), lr=3e-3)
    handle = sdk.submit(spec)
    print(f"submitted {handle.job_id}", flush=True)
    final = handle.wait()
    print(f"{handle.job_id}: {final['state']} at step {final['step']}, plan {final['plan'] or '-'}")
    sys.exit(0 if final["state"] == "SUCCEEDED" else 1)
