"""Workloads: the Rubick artifact's job traces, and a seeded generator of larger ones.

Both have the artifact's columns (`../shared/traces/rubick/README.md` §2):
`name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla`.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidal.sim.tables import Truth, packed

COLUMNS = ("name", "submission_time", "duration", "application", "num_gpus", "num_cpus", "bandwidth",
           "exec_plan", "steps", "is_sla")


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


def read_workload(path: str | Path) -> list[SimJob]:
    jobs = []
    with Path(path).open(encoding="utf-8-sig") as f:
        for r in csv.DictReader(f):
            missing = [c for c in COLUMNS if c not in r]
            if missing:
                raise ValueError(f"{path}: missing columns {missing}")
            jobs.append(SimJob(name=r["name"], submit=float(r["submission_time"]), app=r["application"],
                               num_gpus=int(r["num_gpus"]), num_cpus=int(r["num_cpus"]),
                               exec_plan=r["exec_plan"], steps=int(r["steps"]),
                               is_sla=r["is_sla"].strip() == "1", duration=float(r["duration"])))
    if not jobs:
        raise ValueError(f"{path}: no jobs")
    return sorted(jobs, key=lambda j: (j.submit, j.name))


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
              max_s: float = 14 * 3600.0, sla_fraction: float = 0.0, gpus_per_node: int = 8) -> list[SimJob]:
    """A seeded workload: Poisson arrivals at `jobs_per_hour`, applications drawn from `mix`,
    requests from `REQUESTS`, ideal durations log-normal (median `median_s`, log-sd `sigma`,
    capped at `max_s`; the artifact's traces have median 7.6 s, mean 495 s, max 13,473 s),
    steps = duration / the request's measured iteration time."""
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
        duration = float(min(max_s, rng.lognormal(np.log(median_s), sigma)))
        it = truth.iter_time(app, code, packed(n, gpus_per_node))
        steps = max(1, round(duration / it))
        out.append(SimJob(name=f"{app}-{i}", submit=round(t), app=app, num_gpus=n, num_cpus=8 * n,
                          exec_plan=code, steps=steps, is_sla=bool(rng.random() < sla_fraction),
                          duration=steps * it))
    return out
