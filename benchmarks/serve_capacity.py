"""One Serve replica's capacity at the latency SLO, measured over real HTTP.

    python benchmarks/serve_capacity.py [--rates 5,10,20,40] [--seconds 15]

Starts a local Ray cluster with one logical GPU, serves the GPT (`tidal.serving.app`, one replica,
autoscaling off), and offers Poisson traffic at each rate for `--seconds` from the loopback
replayer (`tidal.serving.traffic.replay`): 16-token continuations of Shakespeare prompts. Prints
each rate's achieved throughput, p50/p99 latency and errors, then last
`replica_rps_at_slo: X`: the highest offered rate whose p99 stays within `SLO_P99_S` with no
error (`tidal.serving.app.REPLICA_RPS` holds the figure measured on this repository's machines).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from tidal.platform.argtypes import amount, count, free_port, listed  # imports ray: after the setting above


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=listed(amount()), default=[5.0, 10.0, 20.0, 30.0, 40.0, 60.0],
                    help="offered requests/s, comma-separated")
    ap.add_argument("--seconds", type=amount(), default=15.0)
    ap.add_argument("--tokens", type=count(1), default=16)
    ap.add_argument("--port", type=free_port, default="8123")
    args = ap.parse_args(argv)
    import ray
    from ray import serve

    from tidal.serving.app import SLO_P99_S, GPTServer
    from tidal.serving.traffic import p99, replay

    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False,  # its own cluster
             log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    dep = serve.deployment(GPTServer, name="gpt", ray_actor_options={"num_gpus": 1, "num_cpus": 1},
                           num_replicas=1, max_ongoing_requests=64)
    serve.run(dep.bind(None, {"seq_len": 64, "d_model": 64, "n_layer": 2}),  # type: ignore[attr-defined]
              name="gpt", route_prefix="/gpt")
    url = f"http://127.0.0.1:{args.port}/gpt"
    prompts = ["ROMEO:", "First Citizen:\n", "To be, or not", "KING HENRY:"]
    body = lambda i: {"prompt": prompts[i % len(prompts)], "max_new_tokens": args.tokens, "seed": i}  # noqa: E731
    replay(url, [0.0] * 8, body, max_s=5)  # warm-up
    best = 0.0
    rng = np.random.default_rng(0)
    print(f"{'offered/s':>10}{'served/s':>10}{'p50 s':>8}{'p99 s':>8}{'errors':>8}", flush=True)
    for rate in args.rates:
        sched = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * args.seconds * 1.5)))
        sched = sched[sched < args.seconds]
        sent = replay(url, sched, body, max_s=args.seconds, concurrency=64)
        ok = [s for s in sent if s.status == 200]
        lat = [s.latency_s for s in ok]
        span = max(s.at + s.latency_s for s in sent) if sent else 1.0
        q99 = p99(lat)
        errors = len(sent) - len(ok)
        print(f"{rate:>10.1f}{len(ok) / span:>10.1f}{np.median(lat):>8.3f}{q99:>8.3f}{errors:>8d}",
              flush=True)
        if q99 <= SLO_P99_S and len(ok) == len(sent):
            best = rate
        else:
            break
    serve.shutdown()
    ray.shutdown()
    print(f"replica_rps_at_slo: {best:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
