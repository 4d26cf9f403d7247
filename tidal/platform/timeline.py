"""What a live Tidal cluster did over time: samples of the scheduler's jobs, the inference pool and
Serve, the figures of a run's summary, and its PNG plots (the demo's record).

A `Sample` is taken every second or so from the scheduler's status rows, its loan state and
`serve.status()`; `sample_of` turns those into GPUs per job and pool (pure). The summary's
figures integrate the samples as step functions (each sample holds until the next one):

    GPU-seconds(f)      = Σ_i f(s_i) · (t_{i+1} − t_i)
    utilisation(pool)   = GPU-seconds(GPUs in use in the pool) ÷ (pool GPUs · (t_last − t_first))
    in use, training    = Σ_jobs GPUs the job holds on training-pool nodes
    in use, inference   = Serve's RUNNING replicas + Σ_jobs GPUs lent to the job (≤ pool GPUs)
    lent GPU-seconds    = GPU-seconds(Σ_jobs GPUs lent to the job)
    SLO attainment      = share of requests answered 200 within the latency SLO
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from tidal.core.state import TERMINAL as _TERMINAL_STATES
from tidal.serving.traffic import Sent

POOLS = ("training", "inference")


@dataclass(frozen=True, kw_only=True)
class JobSample:
    state: str
    gpus: Mapping[str, int]  # pool -> GPUs the job holds there
    plan: str = ""
    step: int = 0


@dataclass(frozen=True, kw_only=True)
class Sample:
    t: float  # seconds from the record's start
    jobs: Mapping[str, JobSample]  # by job name
    serve_running: int = 0
    serve_wanted: int = 0
    lendable: int = 0

    def used(self, pool: str) -> int:
        return sum(j.gpus.get(pool, 0) for j in self.jobs.values())


def sample_of(t: float, rows: Sequence[Mapping[str, Any]], pool_of_node: Mapping[str, str],
              loans: Mapping[str, Any], serve_running: int, serve_wanted: int) -> Sample:
    """One sample from the scheduler's status rows (`allocation`: [[node, GPUs], ...]), the pool
    label of each node (unlabelled nodes are training's) and the loan state."""
    jobs: dict[str, JobSample] = {}
    for r in rows:
        gpus = dict.fromkeys(POOLS, 0)
        for nid, g in r.get("allocation") or []:
            pool = pool_of_node.get(nid, "training")
            gpus[pool] = gpus.get(pool, 0) + int(g)
        jobs[str(r["name"])] = JobSample(state=str(r["state"]), gpus=gpus, plan=str(r.get("plan") or ""),
                                         step=int(r.get("step") or 0))
    return Sample(t=t, jobs=jobs, serve_running=serve_running, serve_wanted=serve_wanted,
                  lendable=int(loans.get("lendable", 0)))


def gpu_seconds(samples: Sequence[Sample], f: Any) -> float:
    """∫ f(sample) dt over the samples as a step function (module docstring)."""
    return float(sum(f(a) * (b.t - a.t) for a, b in pairwise(samples)))


def utilisation(samples: Sequence[Sample], pool_gpus: Mapping[str, int]) -> dict[str, float]:
    """Busy share of each pool's GPUs over the record (module docstring)."""
    span = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
    used = {
        "training": lambda s: s.used("training"),
        "inference": lambda s: min(pool_gpus.get("inference", 0), s.serve_running + s.used("inference")),
    }
    return {p: gpu_seconds(samples, used[p]) / (pool_gpus[p] * span) if pool_gpus.get(p) and span > 0 else 0.0
            for p in POOLS}


def lent_gpu_seconds(samples: Sequence[Sample]) -> float:
    return gpu_seconds(samples, lambda s: s.used("inference"))


def longest_serve_wait(samples: Sequence[Sample]) -> float:
    """The longest stretch in which Serve wanted more replicas than ran (a reclaim's wait for
    the lent GPUs shows here, and so does a replica's start)."""
    longest, since = 0.0, None
    for s in samples:
        if since is not None:
            longest = max(longest, s.t - since)
        unmet = s.serve_wanted > s.serve_running
        since = (s.t if since is None else since) if unmet else None
    return longest


@dataclass(frozen=True, kw_only=True)
class ServingStats:
    requests: int
    failed: int  # not answered 200 (5xx, 4xx, timeouts, refused connections)
    p50_s: float
    p99_s: float
    slo_s: float
    slo_attainment: float  # share of all requests answered 200 within slo_s


def serving_stats(sent: Sequence[Sent], slo_s: float) -> ServingStats:
    ok = [s.latency_s for s in sent if s.status == 200]
    q = (lambda p: float(np.percentile(ok, p))) if ok else (lambda p: float("nan"))
    within = sum(1 for x in ok if x <= slo_s)
    return ServingStats(requests=len(sent), failed=len(sent) - len(ok), p50_s=q(50), p99_s=q(99),
                        slo_s=slo_s, slo_attainment=within / len(sent) if sent else float("nan"))


@dataclass(frozen=True, kw_only=True)
class Marker:
    t: float
    job: str
    what: str  # "submit", "start", "reclaim", "reconfigure", "end"


@dataclass
class JobStory:
    """A job's life from its state changes (`Scheduler.job_events`), times from the record's start."""
    name: str
    submitted: float
    started: float | None = None
    ended: float | None = None
    final_state: str = ""
    markers: list[Marker] = field(default_factory=list)

    @property
    def jct(self) -> float | None:
        return None if self.ended is None else self.ended - self.submitted

    @property
    def queued(self) -> float | None:
        return None if self.started is None else self.started - self.submitted


TERMINAL = frozenset(s.value for s in _TERMINAL_STATES)


def job_story(name: str, events: Sequence[Mapping[str, Any]], t0: float) -> JobStory:
    """`events`: [{t, from, to, note}, ...] oldest first (`tidal events JOB`)."""
    story = JobStory(name=name, submitted=float(events[0]["t"]) - t0 if events else 0.0)
    story.markers.append(Marker(t=story.submitted, job=name, what="submit"))
    for e in events:
        t, to, note = float(e["t"]) - t0, str(e["to"]), str(e.get("note") or "")
        if to == "RUNNING" and story.started is None:
            story.started = t
            story.markers.append(Marker(t=t, job=name, what="start"))
        elif to == "STOPPING":
            story.markers.append(Marker(t=t, job=name, what="reclaim" if note.startswith("reclaim")
                                        else "reconfigure"))
        elif to in TERMINAL:
            story.ended, story.final_state = t, to
            story.markers.append(Marker(t=t, job=name, what="end"))
    return story


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_MARK = {"submit": "v", "reclaim": "x", "reconfigure": "^", "end": "o"}  # matplotlib markers


def plot_timeline(samples: Sequence[Sample], stories: Sequence[JobStory], pool_gpus: Mapping[str, int],
                  sent: Sequence[Sent], slo_s: float, path: str | Path) -> None:
    """Three panels over the same time axis: GPUs per job in the training pool; the inference pool
    (Serve's replicas, GPUs lent to each job, what the loan manager allows); the offered load and
    the p99 latency per 5-s window against the SLO. Job arrivals, reclaims and ends are marked."""
    plt = _plt()
    t = np.array([s.t for s in samples])
    names = [st.name for st in stories]
    cmap = plt.get_cmap("tab10")
    colour = {n: cmap(i % 10) for i, n in enumerate(names)}
    fig, axes = plt.subplots(3, 1, figsize=(14, 9), sharex=True)
    for ax, pool in zip(axes[:2], POOLS, strict=True):
        layers, cols, labels = [], [], []
        if pool == "inference":
            layers.append(np.array([s.serve_running for s in samples]))
            cols.append("0.6")
            labels.append("Serve replicas")
        for n in names:
            layers.append(np.array([s.jobs[n].gpus.get(pool, 0) if n in s.jobs else 0 for s in samples]))
            cols.append(colour[n])
            labels.append(n if pool == "training" else f"{n} (lent)")
        if layers:  # the training pool of a run without jobs (the demo's --serve-only) has none
            ax.stackplot(t, np.array(layers), colors=cols, labels=labels, step="post", linewidth=0)
        ax.axhline(pool_gpus.get(pool, 0), color="k", lw=0.8, ls="--")
        if pool == "inference":
            ax.step(t, [s.serve_wanted for s in samples], where="post", color="k", lw=1.2,
                    label="replicas Serve wants")
            ax.step(t, [s.lendable for s in samples], where="post", color="tab:red", lw=1, ls=":",
                    label="lendable (loan manager)")
        ax.set_ylabel(f"{pool} pool GPUs")
        ax.set_ylim(0, pool_gpus.get(pool, 0) + 0.5)
        ax.legend(loc="upper left", bbox_to_anchor=(1.06, 1.0), fontsize=8)
        ax.grid(alpha=0.3)
    for st in stories:
        for m in st.markers:
            if m.what in _MARK:
                for ax in axes[:2]:
                    ax.plot([m.t], [pool_gpus.get("training", 0) + 0.25], marker=_MARK[m.what],
                            color=colour[st.name], ms=7, clip_on=False)
                if m.what == "reclaim":
                    for ax in axes:
                        ax.axvline(m.t, color="tab:red", lw=0.8, alpha=0.6)
    axes[0].set_title("markers: ▼ arrives, x reclaimed (red line), ▲ reconfigured, ● ends", fontsize=9)
    ax = axes[2]
    if sent:
        at = np.array([s.at for s in sent]) + (samples[0].t if samples else 0.0)
        lat = np.array([s.latency_s for s in sent])
        ok = np.array([s.status == 200 for s in sent])
        edges = np.arange(0.0, max(float(at.max()), t.max() if len(t) else 0.0) + 5.0, 5.0)
        idx = np.digitize(at, edges) - 1
        rate = np.bincount(idx, minlength=len(edges)) / 5.0
        ax.step(edges, rate[:len(edges)], where="post", color="tab:blue", label="requests/s (offered)")
        ax.set_ylabel("requests/s", color="tab:blue")
        ax2 = ax.twinx()
        p99s = [np.percentile(lat[(idx == i) & ok], 99) if ((idx == i) & ok).any() else np.nan
                for i in range(len(edges))]
        ax2.step(edges, p99s, where="post", color="tab:orange", label="p99 latency")
        ax2.axhline(slo_s, color="tab:orange", ls="--", lw=0.8, label=f"SLO {slo_s:g} s")
        if (~ok).any():
            ax2.plot(at[~ok], np.full((~ok).sum(), slo_s), "rx", label="failed request")
        ax2.set_yscale("log")
        ax2.set_ylabel("p99 latency per 5 s (s)", color="tab:orange")
        ax2.legend(loc="lower left", bbox_to_anchor=(1.06, 0.0), fontsize=8)
    ax.set_xlabel("seconds since the demo started")
    ax.legend(loc="upper left", bbox_to_anchor=(1.06, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(sent: Sequence[Sent], slo_s: float, path: str | Path, *, offset_s: float = 0.0) -> None:
    """Every request's latency at its send time (failures in red), with the SLO."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 3.8))
    if sent:
        at = np.array([s.at for s in sent]) + offset_s
        lat = np.array([s.latency_s for s in sent])
        ok = np.array([s.status == 200 for s in sent])
        ax.scatter(at[ok], lat[ok], s=3, alpha=0.5, label=f"answered ({ok.sum()})")
        if (~ok).any():
            ax.scatter(at[~ok], lat[~ok], s=12, color="tab:red", marker="x", label=f"failed ({(~ok).sum()})")
    ax.axhline(slo_s, color="tab:orange", ls="--", label=f"SLO {slo_s:g} s")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the demo started")
    ax.set_ylabel("latency (s)")
    ax.set_title("serving: latency of every request")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path) -> None:
    """Each job's training loss and learning rate per step (a change of plan shows as a new
    marker colour along the same curve: the curve itself does not notice)."""
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    cmap = plt.get_cmap("tab10")
    for i, (name, hist) in enumerate(curves.items()):
        if not hist:
            continue
        steps = [int(m["step"]) for m in hist]
        ax.plot(steps, [float(m["loss"]) for m in hist], color=cmap(i % 10), lw=1, label=name)
        ax2.plot(steps, [float(m["lr"]) for m in hist], color=cmap(i % 10), lw=1.2, label=name)
        plans = [str(m.get("plan", "")) for m in hist]
        for k in range(1, len(plans)):
            if plans[k] != plans[k - 1]:
                ax.axvline(steps[k], color=cmap(i % 10), lw=0.6, ls=":")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title("loss per job (dotted: a change of plan or GPU count)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("learning rate")
    ax2.set_yscale("log")
    ax2.set_title("learning rate (the AutoLRS job's is tuned stage by stage)")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
