"""The `tidal` command line.

    tidal plan FILE.py --gpus N [--gpus-per-node G] [--gpu-mem-gib M] [--write-config OUT.json]
    tidal submit FILE.py [--wait]      submit the file's JobSpec to the scheduler actor
    tidal status [JOB] [--watch [S]]   jobs, states, plans, GPUs/nodes, samples/s, restarts (live)
    tidal start [--serve-checkpoint P] the control plane on this Ray cluster (cluster.yaml runs it)
    tidal events JOB                   the job's state changes, with why
    tidal cancel JOB                   in any state that has not ended (PROFILING included)
    tidal resume JOB [FILE.py]         an ended job again, as a new job, from its newest
                                       checkpoint (FILE.py's JobSpec instead of its own; --wait)

`submit`, `status`, `cancel` and `resume` join the Ray cluster this machine runs (`ray start`, or
RAY_ADDRESS; Ray 2.60's CLI-side token auth needs RAY_AUTH_MODE=token) and start the detached
`tidal-scheduler` actor if it is not there yet.

`plan` loads the JobSpec that FILE.py defines (a module-level `spec`, or a `make_spec()`
function; the file runs with __name__ != "__main__", so a script that submits itself under
`if __name__ == "__main__":` is safe to pass), profiles a few of its plans on real DeepSpeed
engines (cached), fits the performance and memory models, and prints every plan on N GPUs
ranked by predicted throughput, with predicted memory and, for plans that do not fit, why.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tidal.jobs.spec import JobSpec
from tidal.platform.argtypes import amount, count


def load_spec(path: Path, *, working_dir: bool = True) -> JobSpec:
    """The JobSpec a job file defines (`spec`, or `make_spec()` returning one), or one line
    saying what is wrong with the file. The file runs as `python FILE.py` would run it, its
    directory first on `sys.path` (a model in a module beside it imports); with `working_dir`,
    that directory becomes the spec's `runtime_env["working_dir"]` unless the spec names one,
    so the job's workers import what the file imported, on every node."""
    if not path.exists():
        raise SystemExit(f"tidal: {path}: no such file")
    if path.suffix != ".py" or b"\0" in path.read_bytes()[:8192]:
        raise SystemExit(f"tidal: {path} is not a Python file: a job file is a .py defining a JobSpec "
                         "`spec` or a `make_spec()` returning one")
    home = str(path.resolve().parent)
    if home not in sys.path:
        sys.path.insert(0, home)
    try:  # the file's own errors (a bad JobSpec field included) are one line, not a traceback
        scope = runpy.run_path(str(path), run_name="tidal_job")
        spec = scope.get("spec")
        if spec is None and callable(scope.get("make_spec")):
            spec = scope["make_spec"]()
    except SyntaxError as e:
        raise SystemExit(f"tidal: {path}:{e.lineno}: {e.msg}") from None
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise SystemExit(f"tidal: {path}: {type(e).__name__}: {first}") from None
    if not isinstance(spec, JobSpec):
        raise SystemExit(f"tidal: {path} defines neither a JobSpec `spec` nor a `make_spec()` returning one")
    if working_dir and "working_dir" not in (spec.runtime_env or {}):
        spec = dataclasses.replace(spec, runtime_env={**(spec.runtime_env or {}), "working_dir": home})
    return spec


def _join(*, embedded_gpus: int | None = None, cpus: float = 0.0, log_to_driver: bool = True,
          runtime_env: dict[str, Any] | None = None) -> None:
    """Join the cluster this machine runs (`ray start`) or RAY_ADDRESS's. With neither, `plan`
    (`embedded_gpus` given) starts an embedded local cluster with that many GPUs (logical on a
    CPU machine) and at least `cpus` logical CPUs: Ray's CPUs are a scheduling count, and a
    4-worker profile on a 2-core machine would otherwise wait forever for its placement group.
    `submit`, `status` and `cancel` never start one: a throwaway local cluster would take the
    scheduler actor, and a submitted job, with it when the command exits. `runtime_env` is this
    driver's job-level env (`plan`'s profiles run the job's code in it)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        _check_address(address)
    else:
        _one_cluster_meant()
    try:
        ray.init(address=address or "auto", log_to_driver=log_to_driver, runtime_env=runtime_env)
    except ValueError as e:  # an address Ray cannot parse
        raise SystemExit(f"tidal: RAY_ADDRESS={address}: {(str(e).splitlines() or [''])[0]}") from None
    except ConnectionError:
        if address:
            raise SystemExit(f"tidal: no Ray cluster at RAY_ADDRESS={address}") from None
        if embedded_gpus is None:
            raise SystemExit("tidal: no Ray cluster to join: start one (`ray start --head --num-gpus=N`, "
                             "`ray up cluster.yaml`) or set RAY_ADDRESS") from None
        ray.init(num_cpus=max(2, os.cpu_count() or 2, math.ceil(cpus)), num_gpus=embedded_gpus,
                 log_to_driver=log_to_driver, runtime_env=runtime_env)


def _one_cluster_meant() -> None:
    """Without RAY_ADDRESS, Ray joins the cluster of the last `ray start` on this machine, or any
    it finds, and with several running only warns: a `tidal submit` could land in a test
    cluster. With more than one running here, the address must be named."""
    from ray._private.services import find_gcs_addresses  # Ray's own discovery (`ps`)

    found = sorted(find_gcs_addresses())
    if len(found) > 1:
        raise SystemExit(f"tidal: {len(found)} Ray clusters run on this machine ({', '.join(found)}): "
                         "set RAY_ADDRESS to the one you mean")


PROBE_S = 3.0  # how long `tidal` waits for a cluster's GCS port to answer before saying none runs


def _check_address(address: str) -> None:
    """One line, in seconds, for a RAY_ADDRESS no cluster answers at: Ray itself retries its GCS
    for more than a minute before failing. An HTTP address is the dashboard's (`ray job submit`
    takes it); `tidal` joins the GCS (host:6379) as `ray.init` does. `auto` and `ray://` are
    Ray's to resolve."""
    import socket

    if address.startswith(("http://", "https://")):
        raise SystemExit(f"tidal: RAY_ADDRESS={address} is an HTTP address (the dashboard's, for "
                         "`ray job submit`): tidal joins the cluster's GCS, host:6379, or unset it on "
                         "a cluster node")
    if address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"tidal: RAY_ADDRESS={address} is not host:port (the cluster's GCS, e.g. "
                         "10.0.0.1:6379)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S).close()
    except OSError as e:
        raise SystemExit(f"tidal: no Ray cluster at RAY_ADDRESS={address} ({e.strerror or e})") from None


def cmd_plan(args: argparse.Namespace) -> int:
    import ray

    from tidal.jobs.ds_config import deepspeed_config
    from tidal.jobs.spec import SpecError, plans_for
    from tidal.planner.jobplan import Cluster, ProfileConfig, plan_job, profile_plans
    from tidal.planner.planner import packed, rank_plans
    from tidal.planner.profiler import profile_cache, profile_needs, unschedulable

    out = args.write_config
    if out is not None and (out.is_dir() or not out.parent.is_dir()):  # before minutes of profiling
        raise SystemExit(f"tidal: --write-config {out}: " + ("is a directory" if out.is_dir()
                                                             else f"no directory {out.parent}"))
    spec = load_spec(args.file, working_dir=False)
    if not spec.min_gpus <= args.gpus <= spec.max_gpus:
        raise SystemExit(f"tidal: --gpus {args.gpus} is outside the job's [{spec.min_gpus}, {spec.max_gpus}]")
    if spec.global_batch % args.gpus:  # before any profiling: no plan can run there
        raise SystemExit(f"tidal: --gpus {args.gpus} does not divide the job's global batch "
                         f"{spec.global_batch}: data-parallel workers split it evenly")
    if not plans_for(spec, args.gpus):
        raise SystemExit(f"tidal: the job's plan space allows no plan on {args.gpus} GPUs ({spec.plans})")
    from tidal.jobs.codeship import check_here

    with _one_line_errors():  # a model or loss that raises: one line here, not a profile's traceback
        check_here(spec)
    # the job's code reaches the profiles' workers as this driver's job-level env: the file's
    # directory and the spec's own runtime_env (uploaded by ray.init, for this command's life)
    job_env = {"working_dir": str(args.file.resolve().parent), **(spec.runtime_env or {})}
    spec = dataclasses.replace(spec, runtime_env=None)
    shape = packed(args.gpus, args.gpus_per_node, gpu_mem_bytes=args.gpu_mem_gib * 2**30,
                   host_mem_per_node=args.host_mem_gib * 2**30)
    # the scheduler's planner entry, on the cluster this command describes, profiling on N GPUs
    cluster = Cluster(node_gpus=shape.gpus_per_node, gpu_mem_gib=args.gpu_mem_gib)
    cfg = ProfileConfig(samples=args.samples, steps=args.steps, use_cuda=args.cuda, max_profile_gpus=None)
    plans = profile_plans(spec, cluster, cfg)
    _join(embedded_gpus=args.gpus, cpus=profile_needs(plans)["CPU"], log_to_driver=False, runtime_env=job_env)
    why = unschedulable(plans, ray.cluster_resources())
    if why:  # only on a joined cluster (an autoscaling one may still grow to fit it)
        print(f"tidal: warning: {why}; the profile waits until the cluster has them", file=sys.stderr)
    print(f"profiling {spec.name} ({len(plans)} plans, cached in {profile_cache()}) ...")
    try:
        fitted = plan_job(spec, cluster, cfg, progress=True, require=False).fitted
    except SpecError as e:  # fits no shape, every profile failed
        raise SystemExit(f"tidal: {e}") from None
    print(f"performance model fit error (MAPE over profiled plans): {100 * fitted.perf.mape:.1f}%")
    ranked = rank_plans(spec, fitted.model, shape)
    if not ranked:
        print(f"no plan of {spec.name} runs on {args.gpus} GPUs (global batch {spec.global_batch})")
        return 1
    print(f"\n{'#':>3}  {'plan':<24}{'samples/s':>10}{'GPU mem':>11}  feasible")
    for i, c in enumerate(ranked[: args.top], 1):
        print(f"{i:>3}  {c.plan.short():<24}{c.samples_per_s:>10.1f}{c.peak_gpu_bytes / 2**30:>9.3f} GiB  "
              + ("yes" if c.feasible else f"no: {c.infeasible}"))
    if len(ranked) > args.top:
        print(f"     ... {len(ranked) - args.top} more")
    best = ranked[0]
    if not best.feasible:
        print("no plan fits")
        return 1
    if args.write_config:
        args.write_config.write_text(json.dumps(deepspeed_config(spec, best.plan, args.device), indent=2))
        print(f"\nwrote the DeepSpeed config of {best.plan.short()} to {args.write_config}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from tidal.jobs.codeship import check_here
    from tidal.platform import sdk

    spec = load_spec(args.file)
    with _one_line_errors():  # the spec's own errors first, before any cluster is joined
        check_here(spec)
    _join(log_to_driver=False)  # --wait follows the job with a progress line, not worker logs
    with _one_line_errors():
        handle = sdk.submit(spec, checked=True)
    print(f"submitted {handle.job_id}", flush=True)
    return _wait(handle) if args.wait else 0


def _wait(handle: Any) -> int:
    """Follow a job to its end (`--wait`): 0 if it SUCCEEDED."""
    st = follow(handle)
    print(f"{handle.job_id} {st['state']}" + (f": {st['error_line']}" if st.get("error_line") else ""))
    return 0 if st["state"] == "SUCCEEDED" else 1


def progress_line(st: dict[str, Any]) -> str:
    total = int(st.get("total_steps") or 0)
    spent = int(st.get("compute_steps") or st["step"])  # an AutoLRS job's probes count too
    run = f", {spent} steps run" if spent != int(st["step"]) else ""
    done = f" ({100 * spent / total:.0f}%{run})" if total else ""
    extra = f", ETA {_eta(st.get('eta_s'))}" if st.get("eta_s") is not None else ""
    where = f" on {st['gpus']} GPUs, {st['plan']}" if st.get("gpus") else ""
    why = f" — {st['reason']}" if st.get("reason") else ""
    return f"{st['job_id']} {st['state']}: step {st['step']}/{total}{done}{where}{extra}{why}"


def follow(handle: Any, every_s: float = 10.0) -> dict[str, Any]:
    """`handle.wait()`, printing the job's progress on every change of state or plan, else every
    `every_s`; returns its last status."""
    import time

    last: list[Any] = ["", 0.0]  # the last line's (state, plan, GPUs) and time

    def show(st: dict[str, Any]) -> None:
        key = f"{st['state']} {st.get('plan')} {st.get('gpus')}"
        if key != last[0] or time.time() - last[1] >= every_s:
            print(progress_line(st), flush=True)
            last[:] = [key, time.time()]

    st: dict[str, Any] = handle.wait(on_status=show)
    return st


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    m, sec = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def format_status(rows: list[dict[str, Any]]) -> str:
    """The `tidal status` table: job, state, plan, GPUs/nodes, progress and ETA, samples/s
    predicted (the performance model's figure times the job's correction) vs measured (its
    latest step), restarts; below a job, why it waits, the correction (measured ÷ model,
    smoothed over the job's runs) per GPU count it has run on, and its error."""
    w = max([12, *(len(str(r["job_id"])) + 2 for r in rows)])
    lines = [f"{'job':<{w}}{'state':<11}{'plan':<20}{'GPUs':>5} {'nodes':<14}{'step/total':>12}{'done':>6}"
             f"{'ETA':>8}{'samples/s pred/meas':>21}{'restarts':>9}"]
    for r in rows:
        nodes = ",".join(str(n)[:6] for n in r["nodes"])
        sps = f"{float(r['predicted_sps']):.0f}/{float(r['measured_sps']):.0f}"
        total = int(r.get("total_steps") or 0)
        progress = f"{r['step']}/{total}" if total else "-"
        done = f"{100 * int(r.get('compute_steps') or r['step']) / total:.0f}%" if total else "-"
        lines.append(f"{r['job_id']!s:<{w}}{r['state']!s:<11}{r['plan']!s:<20}{r['gpus']!s:>5} "
                     f"{nodes:<14}{progress:>12}{done:>6}{_eta(r.get('eta_s')):>8}{sps:>21}{r['restarts']!s:>9}")
        if r.get("reason"):
            lines.append(f"    {r['reason']}")
        if r.get("sps_ratios"):
            lines.append("    correction (measured ÷ model, smoothed): " + ", ".join(
                f"{float(x):.2f} on {int(n)} GPU{'s' if int(n) != 1 else ''}" for n, x in r["sps_ratios"]))
        if r.get("error_line"):
            lines.append(f"    error: {r['error_line']}")
    return "\n".join(lines)


def format_pools(loans: dict[str, Any]) -> str:
    """The pools line of `tidal status`: the inference pool's GPUs, Serve's replicas, the loan."""
    if not loans:
        return "pools: training only (no node labelled tidal.io/pool=inference)"
    f = loans.get("forecast")
    kept = f"forecast {f:.1f}" if f is not None else "too little history to forecast: lending nothing"
    return (f"pools: inference {loans['pool_gpus']} GPUs, Serve needs {loans['serve_replicas']:.1f} "
            f"replicas ({kept}); lendable {loans['lendable']}, "
            f"lent to training {loans['held']}")


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    """The scheduler's answers to bad input (an unknown job id, a rejected spec) as one line, not
    a traceback: the SDK (`sdk.answer`) raises them as the exception the actor raised, and a
    scheduler that could not start (a state file that is not one) as a SchedulerStartError, none
    running (for a command that does not start one) as a NoSchedulerError; a
    state file that refused the write as a StoreWriteError."""
    from tidal.platform.sdk import NoSchedulerError, SchedulerStartError
    from tidal.platform.store import StoreWriteError

    try:
        yield
    except (KeyError, ValueError, StoreWriteError) as e:
        text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise SystemExit(f"tidal: {text}") from None
    except (SchedulerStartError, NoSchedulerError) as e:
        raise SystemExit(f"tidal: {e}") from None


def _find() -> Any:
    """The cluster's scheduler for a command that must not start one: where none runs, one
    line saying so and how to start it (`sdk.NoSchedulerError`)."""
    from tidal.platform import sdk

    with _one_line_errors():
        return sdk.connect(start=False)


def _get(ref: Any) -> Any:
    from tidal.platform.sdk import answer

    with _one_line_errors():
        return answer(ref)


def cmd_status(args: argparse.Namespace) -> int:
    import time

    _join(log_to_driver=False)
    actor = _find()
    while True:
        rows = _get(actor.status.remote(args.job))
        table = format_status(rows)
        if not args.job:
            table += "\n" + format_pools(_get(actor.pools.remote()))
        if args.watch is None:
            print(table)
            return 0
        # a live table: clear the terminal and redraw every --watch seconds (Ctrl-C ends it)
        head = time.strftime("%H:%M:%S  ") + f"every {args.watch:g} s"
        sys.stdout.write(f"\x1b[H\x1b[2J{head}\n{table}\n")
        sys.stdout.flush()
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


def cmd_start(args: argparse.Namespace) -> int:
    """Tidal's control plane on the cluster this machine belongs to (after `ray start`): the
    scheduler actor (named, detached: it outlives this command), and with --serve-checkpoint the
    GPT Serve application on the inference pool (--serve-model alone: untrained weights of that
    shape, which measure serving capacity). Idempotent: an existing actor is reused."""
    from tidal.platform import sdk
    from tidal.platform.config import SchedulerConfig
    from tidal.platform.settings import SettingsError, load_settings

    config = None
    if args.config:  # checked whole before anything starts: one line naming the setting
        try:
            config = load_settings(args.config)
        except SettingsError as e:
            raise SystemExit(f"tidal: --config {e}") from None
    app = None
    if args.serve_checkpoint or args.serve_model:  # built (and so checked) before anything starts
        from tidal.serving.app import gpt_app

        try:
            model = json.loads(args.serve_model) if args.serve_model else None
        except json.JSONDecodeError as e:
            raise SystemExit(f"tidal: --serve-model is not JSON ({e}): e.g. '{{\"d_model\": 64}}'") from None
        try:
            app = gpt_app(checkpoint=args.serve_checkpoint, model=model)
        except ValueError as e:  # `check_serving`'s "model: ..." or "checkpoint: ...": that flag
            what, _, why = str(e).partition(": ")
            raise SystemExit(f"tidal: --serve-{what} {why}") from None
    if args.autoscaling_config:
        import yaml

        try:
            parsed = yaml.safe_load(Path(args.autoscaling_config).expanduser().read_text())
        except (OSError, yaml.YAMLError) as e:
            raise SystemExit(f"tidal: --autoscaling-config {args.autoscaling_config}: {e}") from None
        if not isinstance(parsed, dict) or not isinstance(parsed.get("available_node_types"), dict):
            raise SystemExit(f"tidal: --autoscaling-config {args.autoscaling_config}: no "
                             "available_node_types (a Ray cluster-launcher config)")
        config = dataclasses.replace(config or SchedulerConfig(), autoscaling_config=parsed)
    _join(log_to_driver=False)
    if config is not None and sdk.find() is not None:
        print("tidal: a scheduler already runs on this cluster and keeps its settings; they apply "
              "to the next one started (after `ray.kill` of the actor 'tidal-scheduler')")
    actor = sdk.connect(config)
    if _get(actor.ping.remote()) != "ok":
        raise SystemExit("tidal: the scheduler actor did not answer")
    from tidal.platform.registry import recorded_state_path

    print(f"tidal: scheduler running (actor 'tidal-scheduler' in namespace 'tidal', on the head node; "
          f"state file {recorded_state_path()})")
    from tidal.platform.dashboard import write_dashboard

    print(f"tidal: Grafana dashboard {write_dashboard()}")
    if app is not None:
        from ray import serve

        serve.run(app, name="gpt", route_prefix="/gpt", blocking=False)
        print("tidal: Serve application 'gpt' at /gpt")
    return 0


def format_events(events: list[dict[str, Any]]) -> str:
    """`tidal events JOB`: one line per state change — time, from → to, why."""
    import time

    lines = []
    for e in events:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(e["t"])))
        lines.append(f"{when}  {e['from'] or '-':>9} → {e['to']:<9}  {e['note']}")
    return "\n".join(lines)


def cmd_events(args: argparse.Namespace) -> int:
    _join(log_to_driver=False)
    print(format_events(_get(_find().job_events.remote(args.job))))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    _join(log_to_driver=False)
    _get(_find().cancel.remote(args.job))
    print(f"cancel requested: {args.job}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from tidal.jobs.codeship import check_here
    from tidal.platform import sdk

    spec = load_spec(args.file) if args.file is not None else None
    if spec is not None:
        with _one_line_errors():  # the spec's own errors first, before any cluster is joined
            check_here(spec)
    _join(log_to_driver=False)
    with _one_line_errors():
        handle = sdk.resume(args.job, spec, checked=True)
    print(f"submitted {handle.job_id}: {args.job} resumed from its newest checkpoint", flush=True)
    return _wait(handle) if args.wait else 0


def build_parser() -> argparse.ArgumentParser:
    """The `tidal` command's parser (also what the docs' CLI reference is generated from)."""
    ap = argparse.ArgumentParser(prog="tidal", description="Tidal: reconfigurable training on Ray")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="rank a job's plans on N GPUs with the fitted models")
    p.add_argument("file", type=Path, help="a Python file defining `spec` or `make_spec()`")
    p.add_argument("--gpus", type=int, required=True)  # the job's range is checked with its spec
    p.add_argument("--gpus-per-node", type=count(1), default=8)
    p.add_argument("--gpu-mem-gib", type=amount(), default=80.0)
    p.add_argument("--host-mem-gib", type=amount(), default=1600.0)
    p.add_argument("--samples", type=int, default=6, help="plans to profile (at most 8)")
    p.add_argument("--steps", type=count(1), default=3, help="measured steps per profile")
    p.add_argument("--top", type=count(1), default=15, help="plans to print")
    p.add_argument("--cuda", action="store_true", help="profile on GPUs (default: CPU with gloo)")
    p.add_argument("--write-config", type=Path, help="write the best plan's DeepSpeed config JSON here")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="--write-config: the device the config is for (its optimizer kernel, overlap)")
    p.set_defaults(func=cmd_plan)
    s = sub.add_parser("submit", help="submit FILE.py's JobSpec to the Tidal scheduler")
    s.add_argument("file", type=Path)
    s.add_argument("--wait", action="store_true", help="wait until the job ends")
    s.set_defaults(func=cmd_submit)
    st = sub.add_parser("status", help="jobs and their states")
    st.add_argument("job", nargs="?", default=None)
    st.add_argument("--watch", type=float, nargs="?", const=2.0, default=None, metavar="SECONDS",
                    help="redraw the table every SECONDS (default 2) until Ctrl-C")
    st.set_defaults(func=cmd_status)
    sp = sub.add_parser("start", help="start Tidal's control plane on this Ray cluster (after `ray start`)")
    sp.add_argument("--config", help="the scheduler's settings, a YAML file (docs/reference/settings.md)")
    sp.add_argument("--serve-checkpoint", help="also serve the GPT of this Tidal checkpoint (Ray Serve)")
    sp.add_argument("--autoscaling-config",
                    help="the autoscaler's cluster config (on a `ray up` head: ~/ray_bootstrap_config.yaml): "
                         "jobs larger than today's cluster queue for the nodes it may launch")
    sp.add_argument("--serve-model", help="the served model's shape as JSON, e.g. '{\"d_model\": 64}' "
                                          "(alone: untrained weights of that shape)")
    sp.set_defaults(func=cmd_start)
    ev = sub.add_parser("events", help="a job's state changes, with why")
    ev.add_argument("job")
    ev.set_defaults(func=cmd_events)
    c = sub.add_parser("cancel", help="cancel a job (it checkpoints and frees its GPUs)")
    c.add_argument("job")
    c.set_defaults(func=cmd_cancel)
    rs = sub.add_parser("resume", help="submit an ended job again from its newest checkpoint")
    rs.add_argument("job")
    rs.add_argument("file", type=Path, nargs="?", default=None,
                    help="a Python file whose JobSpec replaces the job's own (e.g. a lower lr)")
    rs.add_argument("--wait", action="store_true", help="wait until the new job ends")
    rs.set_defaults(func=cmd_resume)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command == "plan" and not 1 <= args.samples <= 8:
        ap.error("--samples must be between 1 and 8")
    if args.command == "status" and args.watch is not None and not 0 < args.watch < math.inf:
        ap.error(f"--watch must be a number of seconds > 0, got {args.watch:g}")
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
