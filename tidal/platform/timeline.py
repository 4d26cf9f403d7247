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

Holding GPUs is not training on them: a run's workers, engines and checkpoint load take tens of
seconds before its first step, and a run stopped before then trained on nothing. A job *trains*
at sample i when its compute steps (probes included) advance within `PROGRESS_WINDOW_S` of it:

    trains(j, i)        = ∃ k: |t_k − t_i| ≤ W and compute_j(t_k) ≠ compute_j(t_{k−1})
    utilisation, trained = the same integral over the GPUs of the jobs that train

The plots draw held GPUs of a job that does not train hatched, and the summary gives both.
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
PROGRESS_WINDOW_S = 10.0  # W: a job that stepped within this many seconds is training


@dataclass(frozen=True, kw_only=True)
class JobSample:
    state: str
    gpus: Mapping[str, int]  # pool -> GPUs the job holds there
    plan: str = ""
    step: int = 0
    compute: int = 0  # compute steps so far (data steps + an AutoLRS job's probes)


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
        step = int(r.get("step") or 0)
        jobs[str(r["name"])] = JobSample(state=str(r["state"]), gpus=gpus, plan=str(r.get("plan") or ""),
                                         step=step, compute=int(r.get("compute_steps") or step))
    return Sample(t=t, jobs=jobs, serve_running=serve_running, serve_wanted=serve_wanted,
                  lendable=int(loans.get("lendable", 0)))


def gpu_seconds(samples: Sequence[Sample], f: Any) -> float:
    """∫ f(sample) dt over the samples as a step function (module docstring)."""
    return float(sum(f(a) * (b.t - a.t) for a, b in pairwise(samples)))


def training_jobs(samples: Sequence[Sample], window_s: float = PROGRESS_WINDOW_S) -> list[frozenset[str]]:
    """For each sample, the jobs that train there: trains(j, i) of the module docstring."""
    stepped: dict[str, list[float]] = {}  # job -> the times its compute count changed
    for a, b in pairwise(samples):
        for name, j in b.jobs.items():
            if name in a.jobs and j.compute != a.jobs[name].compute:
                stepped.setdefault(name, []).append(b.t)
    return [frozenset(n for n, ts in stepped.items() if any(abs(t - s.t) <= window_s for t in ts))
            for s in samples]


def utilisation(samples: Sequence[Sample], pool_gpus: Mapping[str, int], *,
                trained: bool = False) -> dict[str, float]:
    """Busy share of each pool's GPUs over the record (module docstring); `trained`: counting a
    job's GPUs only while it trains."""
    span = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
    active = {id(s): a for s, a in zip(samples, training_jobs(samples), strict=True)} if trained else {}

    def jobs_gpus(s: Sample, pool: str) -> int:
        if not trained:
            return s.used(pool)
        return sum(j.gpus.get(pool, 0) for n, j in s.jobs.items() if n in active[id(s)])

    used = {
        "training": lambda s: jobs_gpus(s, "training"),
        "inference": lambda s: min(pool_gpus.get("inference", 0),
                                   s.serve_running + jobs_gpus(s, "inference")),
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
    relaunches: list[float] = field(default_factory=list)  # every later →RUNNING: a new run took over

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
        elif to == "RUNNING":
            story.relaunches.append(t)
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
# jobs take tab10's colours but red (reclaims, the lendable line) and grey (Serve): no colour means
# two things across the panels
_JOB_COLOURS = (0, 1, 2, 4, 5, 6, 8, 9)


def job_colours(names: Sequence[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    return {n: cmap(_JOB_COLOURS[i % len(_JOB_COLOURS)]) for i, n in enumerate(names)}


def _serve_waits(samples: Sequence[Sample]) -> list[tuple[float, float]]:
    """The stretches in which Serve wanted more replicas than ran."""
    spans, since = [], None
    for s in samples:
        if s.serve_wanted > s.serve_running and since is None:
            since = s.t
        elif s.serve_wanted <= s.serve_running and since is not None:
            spans.append((since, s.t))
            since = None
    if since is not None and samples:
        spans.append((since, samples[-1].t))
    return spans


def plot_timeline(samples: Sequence[Sample], stories: Sequence[JobStory], pool_gpus: Mapping[str, int],
                  sent: Sequence[Sent], slo_s: float, path: str | Path) -> None:
    """Three panels over the same time axis: GPUs per job in the training pool; the inference pool
    (Serve's replicas, GPUs lent to each job, what the loan manager allows, Serve's waits for
    replicas); the offered load and the p99 latency per 5-s window against the SLO. A job's GPUs
    are solid while it trains and hatched while it holds them without stepping (starting,
    stopping, a run that never reached a step). Arrivals, reclaims and ends are marked."""
    from matplotlib.patches import Patch

    plt = _plt()
    t = np.array([s.t for s in samples])
    names = [st.name for st in stories]
    colour = job_colours(names)
    trains = training_jobs(samples)
    span = (0.0, float(t.max()) if len(t) else 1.0)
    fig, axes = plt.subplots(3, 1, figsize=(14, 9.5), sharex=True)
    for ax, pool in zip(axes[:2], POOLS, strict=True):
        bottom = np.zeros(len(t))
        if pool == "inference":
            serve = np.array([s.serve_running for s in samples], dtype=float)
            ax.fill_between(t, bottom, serve, step="post", color="0.6", lw=0, label="Serve replicas")
            bottom = bottom + serve
        for n in names:
            held = np.array([s.jobs[n].gpus.get(pool, 0) if n in s.jobs else 0 for s in samples], dtype=float)
            stepping = np.array([n in a for a in trains])
            for part, style in ((held * stepping, dict(color=colour[n], lw=0)),
                                (held * ~stepping, dict(facecolor=(*colour[n][:3], 0.25), edgecolor=colour[n],
                                                        hatch="///", lw=0))):
                if part.any():
                    ax.fill_between(t, bottom, bottom + part, step="post", **style)
                bottom = bottom + part
        ax.axhline(pool_gpus.get(pool, 0), color="k", lw=0.8, ls="--")
        handles = [Patch(color=colour[n], label=n if pool == "training" else f"{n} (lent)") for n in names]
        handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="///", label="held, not training"))
        if pool == "inference":
            handles.insert(0, Patch(color="0.6", label="Serve replicas"))
            handles += ax.step(t, [s.serve_wanted for s in samples], where="post", color="k", lw=1.2,
                               label="replicas Serve wants")
            handles += ax.step(t, [s.lendable for s in samples], where="post", color="tab:red", lw=1, ls=":",
                               label="lendable (loan manager)")
            waits = _serve_waits(samples)
            for a, b in waits:
                ax.axvspan(a, b, color="tab:red", alpha=0.12, lw=0)
            if waits:
                longest = max(b - a for a, b in waits)
                handles.append(Patch(color="tab:red", alpha=0.12,
                                     label=f"Serve waits for replicas (longest {longest:.0f} s)"))
        ax.set_ylabel(f"{pool} pool GPUs")
        ax.set_ylim(0, pool_gpus.get(pool, 0) + 0.5)
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
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
    axes[0].set_title("GPUs per job (solid: training; hatched: held without a step). "
                      "Markers: ▼ arrives, x reclaimed (red line), ▲ reconfigured, ● ends", fontsize=9)
    ax = axes[2]
    if sent:
        at = np.array([s.at for s in sent]) + (samples[0].t if samples else 0.0)
        lat = np.array([s.latency_s for s in sent])
        ok = np.array([s.status == 200 for s in sent])
        edges = np.arange(0.0, max(float(at.max()), span[1]) + 5.0, 5.0)
        idx = np.digitize(at, edges) - 1
        rate = np.bincount(idx, minlength=len(edges)) / 5.0
        ax.step(edges, rate[:len(edges)], where="post", color="dimgray", label="requests/s (offered)")
        ax.set_ylabel("requests/s", color="dimgray")
        ax2 = ax.twinx()
        p99s = [np.percentile(lat[(idx == i) & ok], 99) if ((idx == i) & ok).any() else np.nan
                for i in range(len(edges))]
        ax2.step(edges, p99s, where="post", color="k", label="p99 latency")
        ax2.axhline(slo_s, color="k", ls="--", lw=0.8, label=f"SLO {slo_s:g} s")
        if (~ok).any():
            ax2.plot(at[~ok], np.full((~ok).sum(), slo_s), "rx", label="failed request")
        ax2.set_yscale("log")
        ax2.set_ylabel("p99 latency per 5 s (s)")
        ax2.legend(loc="lower left", bbox_to_anchor=(1.05, 0.0), fontsize=8)
    ax.set_xlabel("seconds since the demo started")
    ax.set_xlim(*span)
    ax.legend(loc="upper left", bbox_to_anchor=(1.05, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(sent: Sequence[Sent], slo_s: float, path: str | Path, *, offset_s: float = 0.0,
                 span_s: float | None = None) -> None:
    """Every request's latency at its send time (failures in red), with the SLO; `span_s`: the
    x-axis ends there (the timeline's end, so the two plots line up)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 3.8))
    if sent:
        at = np.array([s.at for s in sent]) + offset_s
        lat = np.array([s.latency_s for s in sent])
        ok = np.array([s.status == 200 for s in sent])
        ax.scatter(at[ok], lat[ok], s=3, alpha=0.5, color="dimgray", label=f"answered ({ok.sum()})")
        if (~ok).any():
            ax.scatter(at[~ok], lat[~ok], s=12, color="tab:red", marker="x", label=f"failed ({(~ok).sum()})")
    ax.axhline(slo_s, color="k", ls="--", label=f"SLO {slo_s:g} s")
    ax.set_yscale("log")
    if span_s is not None:
        ax.set_xlim(0.0, span_s)
    ax.set_xlabel("seconds since the demo started")
    ax.set_ylabel("latency (s)")
    ax.set_title("serving: latency of every request")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def restart_rows(hist: Sequence[Mapping[str, Any]], relaunches: Sequence[float]) -> list[int]:
    """Indices of the rows a new run wrote first: for each relaunch (a wall time), the first row
    stamped after it. A run that never reached a step wrote none, so its relaunch marks the next
    run's first row."""
    times = [float(m.get("time", float("nan"))) for m in hist]
    out = []
    for t in relaunches:
        k = next((i for i, x in enumerate(times) if x >= t), None)
        if k is not None and k not in out:
            out.append(k)
    return out


def plot_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, *,
                relaunches: Mapping[str, Sequence[float]] | None = None) -> None:
    """Each job's training loss and learning rate against its compute steps (its budget: an
    AutoLRS job's range test and probes are compute steps that add no data step, so its curve
    ends at its budget with fewer data steps). Dotted: a change of plan or GPU count; x: a new
    run took over (`relaunches`: each job's relaunch wall times, from its events)."""
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    colour = job_colours(list(curves))
    for name, hist in curves.items():
        if not hist:
            continue
        c = colour[name]
        x = [int(m.get("compute_steps", m["step"])) for m in hist]
        probes = int(hist[-1].get("probe_steps", 0) or 0)
        label = f"{name} ({probes} probe steps)" if probes else name
        loss = [float(m["loss"]) for m in hist]
        ax.plot(x, loss, color=c, lw=1, label=label)
        ax2.plot(x, [float(m["lr"]) for m in hist], color=c, lw=1.2, label=name)
        plans = [str(m.get("plan", "")) for m in hist]
        for k in range(1, len(plans)):
            if plans[k] != plans[k - 1]:
                ax.axvline(x[k], color=c, lw=0.6, ls=":")
        for k in restart_rows(hist, (relaunches or {}).get(name, ())):
            ax.plot([x[k]], [loss[k]], marker="x", color=c, ms=8, mew=2)
    ax.set_xlabel("compute step (data steps + probes)")
    ax.set_ylabel("training loss")
    ax.set_title("loss per job (dotted: plan or GPU count changed; x: restarted from a checkpoint)",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax2.set_xlabel("compute step")
    ax2.set_ylabel("learning rate")
    ax2.set_yscale("log")
    ax2.set_title("learning rate (the AutoLRS job's: range test, stages, anneal)", fontsize=9)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
