"""Workloads: the Rubick artifact's job traces, a seeded generator of others, and the family of
both that the policy's constants are chosen on (`family`).

Both have the artifact's columns (`../shared/traces/rubick/README.md` §2):
`name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tidal.sim.tables import Truth, packed, plan_of

COLUMNS = ("name", "submission_time", "duration", "application", "num_gpus", "num_cpus", "bandwidth",
           "exec_plan", "steps", "is_sla")
# columns a workload may leave out: `duration` is informational, `bandwidth` read by no code
# (the artifact's README, §2), and without `is_sla` every job is best-effort (as in traces that
# predate guaranteed jobs)
OPTIONAL = ("duration", "bandwidth", "is_sla")
REQUIRED = tuple(c for c in COLUMNS if c not in OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class SimJob:
    name: str
    submit: float  # seconds from the trace's start
    app: str
    num_gpus: int  # requested
    num_cpus: int  # requested (8 per GPU in the artifact's traces)
    exec_plan: str  # the user's own plan (artifact code)
    steps: int  # iterations to run
    is_sla: bool = False  # guaranteed: never below the throughput of its request
    duration: float = 0.0  # informational: steps × iter_time of the request


# what a numeric cell must be: (test, as said in the error)
_KINDS = {"seconds": (lambda v: v >= 0, "a number of seconds >= 0"),  # a time or a duration
          "count": (lambda v: v >= 1 and v.is_integer(), "an integer >= 1"),  # GPUs, steps
          "count0": (lambda v: v >= 0 and v.is_integer(), "an integer >= 0")}  # CPUs


def _bad(path: str | Path, line: int, col: str, want: str, raw: str) -> ValueError:
    return ValueError(f"{path}, line {line}: {col} must be {want}, got {raw!r}")


def _parse(path: str | Path, line: int, row: Mapping[str, str | None], col: str, kind: str) -> float:
    """One numeric cell, or a one-line error naming the file, the line, the column and the value."""
    raw = (row.get(col) or "").strip()
    ok, want = _KINDS[kind]
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and ok(v)):
        raise _bad(path, line, col, want, raw)
    return v


def _flag(path: str | Path, line: int, raw: str) -> bool:
    """`is_sla`: 1/true guaranteed, 0/false or empty best-effort."""
    if raw.lower() not in ("0", "1", "true", "false", ""):
        raise _bad(path, line, "is_sla", "1 (guaranteed) or 0", raw)
    return raw.lower() in ("1", "true")


def read_workload(path: str | Path) -> list[SimJob]:
    """The jobs of a workload CSV (`COLUMNS`, of which `OPTIONAL` may be left out); a malformed
    cell or a repeated name is a ValueError naming its line, before any job is simulated."""
    jobs = []
    with Path(path).open(encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or ())]
        if reader.fieldnames is not None and missing:
            raise ValueError(f"{path}: missing columns {missing} (a workload has {', '.join(REQUIRED)}; "
                             f"optional: {', '.join(OPTIONAL)})")
        seen: dict[str, int] = {}
        for r in reader:
            line = reader.line_num
            name = (r.get("name") or "").strip()
            if not name:
                raise ValueError(f"{path}, line {line}: a job needs a name")
            if name in seen:
                raise ValueError(f"{path}, line {line}: job name {name!r} repeats line {seen[name]}")
            seen[name] = line
            app = (r.get("application") or "").strip()
            if not app:
                raise ValueError(f"{path}, line {line}: job {name} has no application")
            jobs.append(SimJob(name=name, submit=_parse(path, line, r, "submission_time", "seconds"), app=app,
                               num_gpus=int(_parse(path, line, r, "num_gpus", "count")),
                               num_cpus=int(_parse(path, line, r, "num_cpus", "count0")),
                               exec_plan=(r.get("exec_plan") or "").strip(),
                               steps=int(_parse(path, line, r, "steps", "count")),
                               is_sla=_flag(path, line, (r.get("is_sla") or "").strip()),
                               # informational (the request's ideal run time): may be left empty
                               duration=_parse(path, line, r, "duration", "seconds")
                               if (r.get("duration") or "").strip() else 0.0))
    if not jobs:
        raise ValueError(f"{path}: no jobs")
    return sorted(jobs, key=lambda j: (j.submit, j.name))


def check_jobs(jobs: Sequence[SimJob], apps: Sequence[str], capacity: int, *,
               artifact_plans: bool = True) -> None:
    """What a simulated cluster can run: unique names, known applications, requests that fit,
    and (`artifact_plans`: the world is the artifact's tables, `Truth`) users' plans that are
    artifact plan codes for their GPU counts. The simulator checks this at construction;
    benchmarks call it first, before fitting models."""
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"job names must be unique: {dup!r} repeats")
    for j in jobs:
        if j.app not in apps:
            raise ValueError(f"job {j.name}: unknown application {j.app!r} "
                             f"(the tables have {', '.join(apps)})")
        if not 1 <= j.num_gpus <= capacity:
            raise ValueError(f"job {j.name} requests {j.num_gpus} GPUs, the cluster has {capacity}")
        if j.steps < 1:
            raise ValueError(f"job {j.name}: steps must be >= 1")
        if artifact_plans:
            try:
                plan_of(j.exec_plan, j.num_gpus, 1)
            except ValueError as e:
                raise ValueError(f"job {j.name}: {e}") from None


def write_workload(jobs: Sequence[SimJob], path: str | Path) -> None:
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for j in jobs:
            w.writerow([j.name, int(j.submit), f"{j.duration:.3f}", j.app, j.num_gpus, j.num_cpus,
                        1.25 if j.num_gpus > 8 else 0, j.exec_plan, j.steps, int(j.is_sla)])


# What users of the artifact's traces ask for, per application: (GPUs, plan) pairs of
# workload-base.csv.
REQUESTS: Mapping[str, tuple[tuple[int, str], ...]] = {
    "bert": ((1, "ga"), (2, "zero-dp"), (4, "zero-dp"), (8, "zero-dp")),
    "roberta": ((1, "ga"), (2, "zero-dp"), (4, "zero-dp"), (8, "zero-dp")),
    "vit": ((1, "ga"), (2, "zero-dp"), (4, "zero-dp"), (8, "zero-dp")),
    "t5": ((1, "ga"), (2, "zero-dp"), (4, "zero-dp"), (8, "zero-dp")),
    "gpt2": ((2, "ga"), (4, "ga"), (5, "151"), (8, "zero-dp")),
    "llama7": ((8, "zero-offload"), (16, "182"), (32, "244")),
    "llama30": ((24, "641"), (40, "524"), (48, "344")),
}
MIX = {"bert": 0.16, "roberta": 0.14, "vit": 0.12, "t5": 0.16, "gpt2": 0.17, "llama7": 0.13, "llama30": 0.12}


def synthetic(truth: Truth, *, jobs: int, jobs_per_hour: float, seed: int = 0,
              mix: Mapping[str, float] | None = None, median_s: float = 60.0, sigma: float = 2.5,
              max_s: float = 14 * 3600.0, sla_fraction: float = 0.0, gpus_per_node: int = 8,
              any_plan: bool = False) -> list[SimJob]:
    """A seeded workload: Poisson arrivals at `jobs_per_hour`, applications drawn from `mix`,
    requests from `REQUESTS`, ideal durations log-normal (median `median_s`, log-sd `sigma`,
    capped at `max_s`; the artifact's traces have median 7.6 s, mean 495 s, max 13,473 s),
    steps = duration / the request's measured iteration time. With `any_plan` the user's plan is
    any plan measured on the requested GPU count (users who do not pick the best one)."""
    rng = np.random.default_rng(seed)
    mix = dict(mix or MIX)
    apps = sorted(mix)
    p = np.array([mix[a] for a in apps], dtype=float)
    p /= p.sum()
    t = 0.0
    out = []
    for i in range(jobs):
        t += float(rng.exponential(3600.0 / jobs_per_hour))
        app = apps[int(rng.choice(len(apps), p=p))]
        n, code = REQUESTS[app][int(rng.integers(len(REQUESTS[app])))]
        if any_plan:
            codes = truth.plans_at(app, n) or (code,)
            code = codes[int(rng.integers(len(codes)))]
        duration = float(min(max_s, rng.lognormal(np.log(median_s), sigma)))
        it = truth.iter_time(app, code, packed(n, gpus_per_node))
        steps = max(1, round(duration / it))
        out.append(SimJob(name=f"{app}-{i}", submit=round(t), app=app, num_gpus=n, num_cpus=8 * n,
                          exec_plan=code, steps=steps, is_sla=bool(rng.random() < sla_fraction),
                          duration=steps * it))
    return out


def rescaled(jobs: Sequence[SimJob], rate: float) -> list[SimJob]:
    """The same jobs arriving `rate` times as fast (submission times divided by `rate`)."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    return [replace(j, submit=round(j.submit / rate)) for j in jobs]


def jittered(jobs: Sequence[SimJob], seconds: float, seed: int) -> list[SimJob]:
    """The same jobs, each submitted up to `seconds` earlier or later (uniform, seeded; never
    before 0): a copy of the workload no scheduler would call different (at half the simulator's
    60-s round, most arrivals stay in their round), whose decisions can still chain otherwise.
    `benchmarks/sim_sweep.py --copies` judges a policy over such copies, not on one instance's
    luck."""
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"jitter must be a finite number of seconds >= 0, got {seconds}")
    rng = np.random.default_rng(seed)
    return [replace(j, submit=max(0.0, j.submit + float(rng.uniform(-seconds, seconds)))) for j in jobs]


def with_guarantees(jobs: Sequence[SimJob], share: float, seed: int) -> list[SimJob]:
    """The same jobs with a seeded `share` of them guaranteed (`is_sla`), the rest best-effort."""
    rng = np.random.default_rng([seed, round(share * 1000)])
    return [replace(j, is_sla=bool(rng.random() < share)) for j in jobs]


# The family's synthetic axes (cycled over the rate × guarantee grid): application mixes, job
# durations (median s, log-sd) and whether users pick any measured plan.
MIXES: Mapping[str, Mapping[str, float]] = {
    "mix": MIX,
    "small": {**MIX, "llama7": 0.04, "llama30": 0.03},
    "large": {**MIX, "llama7": 0.25, "llama30": 0.2},
}
DURATIONS: Mapping[str, tuple[float, float]] = {
    "short": (7.6, 3.0), "long": (40.0, 2.5), "spread": (3.0, 3.6)}
BASE_JOBS_PER_HOUR = 30.7  # workload-base: 406 jobs over 13.2 h


def family(truth: Truth, shared: Sequence[str | Path], *, seed: int = 0,
           jobs: int = 400) -> list[tuple[str, list[SimJob]]]:
    """The workloads a policy is judged on, (name, jobs) each, seeded:

    * each shared trace as it is (the artifact's workload-base and workload-bp);
    * the first shared trace with 25% and 50% of its jobs guaranteed, and arriving 0.5× and 2×
      as fast;
    * nine synthetic workloads, arrival rate 0.5×, 1× and 2× workload-base's × 0%, 25% and 50%
      guaranteed jobs, each with another application mix (sizes), duration distribution and
      users' plans (`MIXES`, `DURATIONS`, `any_plan`), cycled so that every value meets
      several rates and guarantee shares.
    """
    out: list[tuple[str, list[SimJob]]] = [(Path(p).stem, read_workload(p)) for p in shared]
    if shared:
        stem, base = out[0]
        out += [(f"{stem}-sla25", with_guarantees(base, 0.25, seed)),
                (f"{stem}-sla50", with_guarantees(base, 0.5, seed)),
                (f"{stem}-rate0.5", rescaled(base, 0.5)), (f"{stem}-rate2", rescaled(base, 2.0))]
    mixes, durations = list(MIXES), list(DURATIONS)
    k = 0
    for rate in (0.5, 1.0, 2.0):
        for sla in (0.0, 0.25, 0.5):
            mix, dur, any_plan = mixes[k % 3], durations[(k // 3 + k) % 3], k % 2 == 1
            median, sigma = DURATIONS[dur]
            name = f"syn-r{rate:g}-sla{int(100 * sla)}-{mix}-{dur}" + ("-anyplan" if any_plan else "")
            out.append((name, synthetic(truth, jobs=jobs, jobs_per_hour=BASE_JOBS_PER_HOUR * rate,
                                        seed=seed * 100 + k + 1, mix=MIXES[mix], median_s=median,
                                        sigma=sigma, sla_fraction=sla, any_plan=any_plan)))
            k += 1
    return out
