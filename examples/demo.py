"""Tidal's demo: training and inference side by side on one Ray cluster.

A local Ray cluster with two pools of logical GPUs (training: 4, inference: 4; node label
`tidal.io/pool`) runs, for `--minutes`:

- a Ray Serve app (`tidal.serving.app`) with the repository's GPT, trained first by a short Tidal
  job and loaded from its checkpoint, under the Azure LLM trace's arrivals replayed over HTTP,
  time-scaled to the demo and under a diurnal envelope (quiet, a surge at 0.6 of the run, quieter again);
- the scheduler actor, which profiles and plans three training jobs arriving over time (a small
  GPT, a wider one that may grow to 4 GPUs, and one whose LR AutoLRS tunes), places and
  reconfigures them, lends the inference GPUs Serve does not need and takes them back, by
  shrinking the borrower at a checkpoint, when the surge comes.

It prints progress every few seconds, then a summary (per-job JCT, queueing and restarts, GPU
utilisation per pool, lent GPU-seconds, serving p99 and SLO attainment) and writes
`results/demo_timeline.png` (GPUs per job and pool over time, with the traffic and its p99),
`results/demo_latency.png` and `results/demo_curves.png` (loss and LR per job).

    make demo                                   # set-up + this script (about 12 minutes on 2 cores)
    python examples/demo.py --minutes 10        # a longer run: longer jobs, a slower tide
    python examples/demo.py --keep              # keep the cluster up afterwards for `ray job submit`

With RAY_ADDRESS set it runs on that cluster instead (nodes labelled `tidal.io/pool=training` /
`inference`, as `cluster.yaml` makes them), where the jobs use its GPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
# Ray Train's controller takes a checkpoint report per poll (default every 2 s); the demo's jobs
# checkpoint every few seconds so that a reclaim loses little work
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")

import numpy as np
import ray

from tidal.platform.argtypes import free_port

TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "azure-llm" / \
    "AzureLLMInferenceTrace_conv.csv"
SERVE_MODEL = dict(seq_len=32, d_model=64, n_layer=2, n_head=4)


OWN_STORAGE: list[str] = [""]  # the runs' storage the demo made for its embedded cluster


def start_cluster(train_gpus: int, infer_gpus: int) -> Any:
    """The embedded cluster (two raylets on this machine, one per pool), or RAY_ADDRESS's."""
    from tidal.serving.app import POOL_LABEL

    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)
        return None
    from ray.cluster_utils import Cluster

    if not os.environ.get("TIDAL_STORAGE"):  # the demo's own, removed with its cluster
        os.environ["TIDAL_STORAGE"] = OWN_STORAGE[0] = tempfile.mkdtemp(prefix="tidal-demo-")
    # the raylets (and so `ray job submit`'s entrypoints) find this interpreter's `python` first
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # logical CPUs are a scheduling count here: enough for the workers, Serve and Train's actors
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 8, "num_gpus": train_gpus, "labels": {POOL_LABEL: "training"}})
    cluster.add_node(num_cpus=6, num_gpus=infer_gpus, labels={POOL_LABEL: "inference"})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def pools() -> tuple[dict[str, str], dict[str, int]]:
    """Each live node's pool, and the GPUs of each pool."""
    from tidal.platform.capacity import pool_of

    of_node, gpus = {}, {"training": 0, "inference": 0}
    for n in ray.nodes():
        if n["Alive"]:
            of_node[n["NodeID"]] = pool_of(n)
            gpus[pool_of(n)] += int(n["Resources"].get("GPU", 0))
    return of_node, gpus


def train_serving_model(steps: int) -> str:
    """The model Serve runs: a short Tidal job on one GPU; its checkpoint's path."""
    from tidal import Plan, Resources, run
    from tidal.jobs.reference import shakespeare_gpt

    spec = shakespeare_gpt(name="serve-model", global_batch=16, total_steps=steps, lr=3e-3,
                           checkpoint_every=steps, **SERVE_MODEL)
    r = run(spec, Plan(dp=1, zero_stage=0, micro_batch=16), Resources(num_workers=1, gpus_per_worker=1))
    assert r.checkpoint is not None
    print(f"  {steps} steps, loss {r.losses[0]:.2f} → {r.losses[-1]:.2f}, {r.wall_s:.0f} s", flush=True)
    return r.checkpoint


def job_specs(scale: float) -> list[tuple[float, Any]]:
    """(arrival as a fraction of the demo, spec) of the three jobs; `scale` sets their lengths."""
    from tidal import WarmupCosine
    from tidal.jobs.reference import shakespeare_gpt

    def steps(n: float) -> int:
        return max(60, int(n * scale) // 10 * 10)

    small, wide, tuned = steps(1200), steps(500), steps(1000)
    gpt = dict(seq_len=64, n_head=4)
    return [
        (0.0, shakespeare_gpt(name="small", d_model=128, n_layer=2, global_batch=16, total_steps=small,
                              min_gpus=1, max_gpus=2, checkpoint_every=100,
                              lr=WarmupCosine(peak=3e-3, warmup=small // 20, total=small, floor=3e-4),
                              **gpt)),
        (0.1, shakespeare_gpt(name="wide", d_model=192, n_layer=4, global_batch=32, total_steps=wide,
                              min_gpus=1, max_gpus=4, checkpoint_every=25,
                              lr=WarmupCosine(peak=2e-3, warmup=wide // 20, total=wide, floor=2e-4), **gpt)),
        (0.25, shakespeare_gpt(name="autolrs", d_model=128, n_layer=2, global_batch=16, total_steps=tuned,
                               min_gpus=1, max_gpus=2, checkpoint_every=100, lr="autolrs", **gpt)),
    ]


def traffic_schedule(span_s: float, peak_rps: float, seed: int) -> tuple[np.ndarray, str]:
    """Send times over the demo: the trace time-scaled to the span under a diurnal envelope whose
    peak is at 0.6 of the span, thinned to `peak_rps` at the busiest 5 s."""
    from tidal.serving.traffic import Envelope, poisson_arrivals, read_arrivals, thin_to_peak

    if TRACE.exists():
        arrivals, src = read_arrivals(TRACE), f"Azure LLM trace ({TRACE.name})"
    else:  # a clean clone without ../shared: a Poisson stand-in at the trace's mean rate
        arrivals, src = poisson_arrivals(19_365 / 3_600, 3_600, seed), "Poisson stand-in (no trace found)"
    t = arrivals * (span_s / arrivals[-1])
    env = Envelope(period_s=span_s, low=0.05, phase=-0.1)  # quiet at 0.1 of the span, busiest at 0.6
    t = t[np.random.default_rng(seed).random(len(t)) < env(t)]
    return thin_to_peak(t, peak_rps, seed=seed), src


class Record:
    """Everything the summary and the plots need, filled while the demo runs."""

    def __init__(self) -> None:
        self.t0 = time.time()
        self.samples: list[Any] = []
        self.sent: list[Any] = []
        self.replay_t0 = 0.0
        self.jobs: dict[str, Any] = {}  # name -> JobHandle

    def now(self) -> float:
        return time.time() - self.t0


SAME_STEP_WINDOW = 20


def same_step_losses(tuned: list[dict[str, Any]],
                     hand: list[dict[str, Any]]) -> tuple[int, float, float] | None:
    """(D, autolrs's, small's mean training loss over data steps D − 19 … D), D the last data
    step AutoLRS trained (its budget's steps include its probes, so it ends before `small`'s
    step D). Both jobs train the same GPT from the same seed on the same batches, so one step's
    losses compare; a window of steps evens out one batch's noise. None: a curve is missing."""
    a = {int(r["step"]): float(r["loss"]) for r in tuned if r.get("loss") is not None}
    b = {int(r["step"]): float(r["loss"]) for r in hand if r.get("loss") is not None}
    if not a:
        return None
    end = max(a)
    steps = [k for k in range(end - SAME_STEP_WINDOW + 1, end + 1) if k in a and k in b]
    if len(steps) < SAME_STEP_WINDOW // 2:
        return None
    return end, sum(a[k] for k in steps) / len(steps), sum(b[k] for k in steps) / len(steps)


def progress_line(rec: Record, rows: list[dict[str, Any]], loans: dict[str, Any], serve_running: int,
                  total_steps: dict[str, int]) -> str:
    from tidal.serving.traffic import p99

    parts = []
    for r in rows:
        s = rec.samples[-1].jobs.get(r["name"]) if rec.samples else None
        where = f"{s.gpus['training']}+{s.gpus['inference']} lent" if s and s.gpus["inference"] else \
            f"{r['gpus']} GPU"
        spent = r.get("compute_steps") or r["step"]  # the budget's steps: AutoLRS's probes count too
        parts.append(f"{r['name']} {r['state'][:7]:<7} {where:<9} {spent:>4}/{total_steps[r['name']]}")
    recent = [s for s in rec.sent if s.at + rec.replay_t0 > rec.now() - 10]
    lat = [s.latency_s for s in recent if s.status == 200]
    serve = (f"serve {serve_running} replicas (lendable {loans.get('lendable', '-')}), "
             f"{len(recent) / 10:.1f} req/s, p99 {p99(lat) * 1000:.0f} ms" if recent else
             f"serve {serve_running} replicas")
    return f"t={rec.now():5.0f}s  " + " | ".join(parts) + f" | {serve}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0,
                    help="length of the traffic replay (the jobs scale)")
    ap.add_argument("--peak-rps", type=float, default=12.0, help="requests/s at the surge's busiest 5 s")
    ap.add_argument("--out", type=Path, default=Path("results"))
    ap.add_argument("--keep", action="store_true", help="keep the local cluster up for `ray job submit`")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=free_port, default="8000", help="Serve's HTTP port on 127.0.0.1")
    ap.add_argument("--serve-only", action="store_true",
                    help="no training jobs: the same traffic on Serve alone, the baseline of what "
                         "inference gets on this machine without loans")
    args = ap.parse_args()
    if not 1 <= args.minutes <= 600:
        raise SystemExit(f"demo: --minutes must lie in [1, 600], got {args.minutes}")
    if not 0 < args.peak_rps <= 1000:
        raise SystemExit(f"demo: --peak-rps must lie in (0, 1000], got {args.peak_rps}")
    args.out.mkdir(parents=True, exist_ok=True)

    from ray import serve

    from tidal.platform import sdk
    from tidal.platform.cli import format_pools
    from tidal.platform.config import SchedulerConfig
    from tidal.platform.timeline import (
        job_story,
        lent_gpu_seconds,
        longest_serve_wait,
        plot_curves,
        plot_latency,
        plot_timeline,
        sample_of,
        serving_stats,
        utilisation,
    )
    from tidal.serving.app import SLO_P99_S, gpt_app
    from tidal.serving.demand import replicas_running, replicas_wanted
    from tidal.serving.traffic import replay

    span = args.minutes * 60.0
    print("== starting a local Ray cluster: training pool 4 GPUs, inference pool 4 GPUs (logical)",
          flush=True)
    cluster = start_cluster(4, 4)
    of_node, pool_gpus = pools()
    print(f"   pools: {pool_gpus}; Ray dashboard: http://{cluster.webui_url if cluster else '<head>:8265'}")
    scheduler = None
    try:
        print("== training the model Serve will run (a short Tidal job)", flush=True)
        ckpt = train_serving_model(120)

        print("== starting Serve (app 'gpt' at /gpt, replicas on the inference pool) and the scheduler")
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        serve.run(gpt_app(checkpoint=ckpt, min_replicas=1,  # at the shape its meta records
                          max_replicas=pool_gpus["inference"], upscale_delay_s=2.0, downscale_delay_s=30.0),
                  name="gpt", route_prefix="/gpt")
        state_dir = Path(os.environ.get("TIDAL_STORAGE") or tempfile.mkdtemp(prefix="tidal-demo-"))
        # one profile per job (each is a fresh process building a DeepSpeed engine: ~20 s here)
        cfg = SchedulerConfig(state_path=str(state_dir / "demo.sqlite"), cpus_per_worker=0.5,
                              profile_samples=1)
        scheduler = sdk.connect(cfg)

        schedule, src = traffic_schedule(span, args.peak_rps, args.seed)
        print(f"== traffic: {len(schedule)} requests over {span:.0f} s from the {src}, "
              f"peak {args.peak_rps:g} req/s at {0.6 * span:.0f} s; SLO p99 {SLO_P99_S * 1000:.0f} ms")
        rec = Record()
        url = f"http://127.0.0.1:{args.port}/gpt"
        prompts = ["ROMEO.\n", "To be, or not", "KING HENRY.\n", "O, ", "Enter "]

        def body(i: int) -> dict[str, Any]:
            return {"prompt": prompts[i % len(prompts)], "max_new_tokens": 16, "seed": i}

        def traffic() -> None:
            rec.replay_t0 = rec.now()
            replay(url, schedule, body, max_s=span, concurrency=48, timeout_s=60, on_sent=rec.sent.append)

        replayer = threading.Thread(target=traffic, daemon=True)
        replayer.start()

        arrivals = [] if args.serve_only else sorted(job_specs(args.minutes / 5.0), key=lambda a: a[0])
        total_steps = {spec.name: spec.total_steps for _, spec in arrivals}
        # a safety stop for a run that hangs, not a target: the three jobs need ~640 s of the
        # training pool's 4 GPUs at 2-core speed, and each launch there takes 20-110 s before its
        # first step (the restart cost printed below). At 2 · span + 120 s (720 s) the wide job
        # missed it by ~60 s in two runs of 2026-11-29 (restart cost 52 and 67 s) and was cancelled
        deadline = span * 4.0 + 120.0
        last_print = 0.0
        while True:
            while arrivals and rec.now() >= arrivals[0][0] * span:
                _, spec = arrivals.pop(0)
                rec.jobs[spec.name] = sdk.submit(spec)
                print(f"t={rec.now():5.0f}s  submitted {spec.name} ({rec.jobs[spec.name].job_id}): "
                      f"{spec.total_steps} steps, {spec.min_gpus}-{spec.max_gpus} GPUs"
                      + (", LR by AutoLRS" if spec.autolrs else ""), flush=True)
            rows = ray.get(scheduler.status.remote())
            loans = ray.get(scheduler.pools.remote())
            st = serve.status()
            rec.samples.append(sample_of(rec.now(), rows, of_node, loans, replicas_running(st),
                                         replicas_wanted(st)))
            if time.time() - last_print >= 5:
                print(progress_line(rec, rows, loans, replicas_running(st), total_steps), flush=True)
                last_print = time.time()
            ended = all(r["state"] in sdk.TERMINAL for r in rows)
            done = not arrivals and (rows or args.serve_only) and ended
            if done and not replayer.is_alive():
                break
            if rec.now() > deadline:
                print(f"t={rec.now():5.0f}s  deadline: cancelling what has not ended", flush=True)
                for h in rec.jobs.values():
                    with contextlib.suppress(ValueError):  # one that ended meanwhile says so
                        h.cancel()
                break
            time.sleep(1.0)
        replayer.join(timeout=90)

        # the record → summary and plots
        stories = [job_story(name, ray.get(scheduler.job_events.remote(h.job_id)), rec.t0)
                   for name, h in rec.jobs.items()]
        final = {name: h.status() for name, h in rec.jobs.items()}
        curves = {name: h.logs() for name, h in rec.jobs.items()}
        slo = serving_stats(rec.sent, SLO_P99_S)
        util = utilisation(rec.samples, pool_gpus)
        trained = utilisation(rec.samples, pool_gpus, trained=True)
        lent = lent_gpu_seconds(rec.samples)
        plot_timeline(rec.samples, stories, pool_gpus, rec.sent, SLO_P99_S, args.out / "demo_timeline.png")
        plot_latency(rec.sent, SLO_P99_S, args.out / "demo_latency.png", offset_s=rec.replay_t0,
                     span_s=rec.samples[-1].t)
        plot_curves(curves, args.out / "demo_curves.png",
                    relaunches={s.name: [rec.t0 + t for t in s.relaunches] for s in stories})

        print("\n=== Tidal demo summary ===")
        print(f"{'job':<9}{'state':<11}{'arrived':>8}{'queued':>8}{'JCT':>8}{'restarts':>9}"
              f"{'reclaims':>9}  {'loss':<14}plans")
        for s in stories:
            f, hist = final[s.name], curves[s.name]
            plans = sorted({str(m.get("plan")) for m in hist if m.get("plan")})
            loss = f"{hist[0]['loss']:.2f} → {hist[-1]['loss']:.2f}" if hist else "-"
            fmt = (lambda x: f"{x:7.0f}s" if x is not None else "       -")  # noqa: E731
            print(f"{s.name:<9}{f['state']:<11}{s.submitted:7.0f}s{fmt(s.queued)}{fmt(s.jct)}"
                  f"{f['restarts']:>9}{sum(m.what == 'reclaim' for m in s.markers):>9}  {loss:<14}"
                  f"{len(plans)}: {', '.join(plans)}")
        if (cmp := same_step_losses(curves.get("autolrs", []), curves.get("small", []))) is not None:
            step, tuned, hand = cmp
            print(f"AutoLRS against the hand-set cosine (the same GPT, seed and batches) at data step "
                  f"{step}, mean training loss over its last {SAME_STEP_WINDOW} steps: autolrs "
                  f"{tuned:.3f}, small {hand:.3f} ({'no higher' if tuned <= hand else 'higher'})")
        print(f"GPU utilisation: training pool {util['training']:.0%} held, {trained['training']:.0%} "
              f"training; inference pool {util['inference']:.0%} held, {trained['inference']:.0%} "
              f"serving or training (Serve's replicas + GPUs lent to jobs that stepped), over "
              f"{rec.samples[-1].t - rec.samples[0].t:.0f} s")
        print(f"lent to training: {lent:.0f} GPU-seconds; Serve's longest wait for wanted replicas: "
              f"{longest_serve_wait(rec.samples):.0f} s")
        print(f"now: {format_pools(ray.get(scheduler.pools.remote()))}")
        rc = ray.get(scheduler.restart_cost.remote())
        how = "pinned" if rc["pinned"] else "measured" if rc["starts"] else "the default, none measured"
        starts, stops = (sorted(round(s) for s in rc[k]) for k in ("starts", "stops"))
        print(f"restart cost charged by the policy: {rc['seconds']:.0f} s ({how}: launch → first step "
              f"{starts} s, stop → ended {stops} s)")
        print(f"serving: {slo.requests} requests, {slo.failed} failed, p50 {slo.p50_s * 1000:.0f} ms, "
              f"p99 {slo.p99_s * 1000:.0f} ms; {slo.slo_attainment:.1%} within the "
              f"{slo.slo_s * 1000:.0f} ms SLO")
        print(f"plots: {args.out / 'demo_timeline.png'}, {args.out / 'demo_latency.png'}, "
              f"{args.out / 'demo_curves.png'}")
        ok = all(f["state"] == "SUCCEEDED" for f in final.values()) and slo.failed == 0
        if args.keep and cluster is not None:
            print("\nThe cluster stays up (Ctrl-C ends it). From another shell in this directory:\n"
                  f"  export RAY_ADDRESS={cluster.address}   # (this cluster runs without Ray's token auth)\n"
                  f"  .venv/bin/ray job submit --address http://{cluster.webui_url} --working-dir . "
                  "-- python examples/submit_job.py 60\n"
                  "  .venv/bin/tidal status --watch", flush=True)
            signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` ends it like Ctrl-C
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0 if ok else 1
    finally:
        if cluster is not None:  # the embedded cluster goes; a real cluster keeps Serve and the scheduler
            serve.shutdown()
            if scheduler is not None:
                ray.kill(scheduler, no_restart=True)
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        if OWN_STORAGE[0]:  # checkpoints and the state file of a cluster that is gone
            shutil.rmtree(OWN_STORAGE[0], ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
