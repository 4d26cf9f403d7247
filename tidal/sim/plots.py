"""PNG plots of simulation results: JCT CDF per policy, GPU allocation over time per job."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tidal.sim.simulator import SimResult


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def jct_cdf(results: list[SimResult], path: str | Path, title: str = "") -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        jct = np.sort([j.jct for j in r.jobs])
        ax.plot(jct, np.arange(1, len(jct) + 1) / len(jct), label=f"{r.policy} (avg {jct.mean():,.0f} s)")
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title or "JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def held_on_grid(timeline: list[tuple[float, str, int]], grid: np.ndarray) -> dict[str, np.ndarray]:
    """GPUs each job holds at each grid time: its last change at or before that time (0 before
    its first). Changes at one time apply in their logged order (a release, then a grant)."""
    changes: dict[str, list[tuple[float, int]]] = {}
    for t, jid, g in sorted(timeline, key=lambda x: x[0]):  # stable: a time's changes keep their order
        changes.setdefault(jid, []).append((t, g))
    out = {}
    for jid, ch in changes.items():
        ts = np.array([c[0] for c in ch])
        gs = np.array([c[1] for c in ch])
        idx = np.searchsorted(ts, grid, side="right") - 1
        out[jid] = np.where(idx >= 0, gs[np.clip(idx, 0, None)], 0)
    return out


def allocation_timeline(result: SimResult, capacity: int, path: str | Path, *, step_s: float = 60.0) -> None:
    """A stacked area per job of the GPUs it holds over time (jobs coloured by application)."""
    plt = _plt()
    end = max(t for t, _, _ in result.timeline)
    grid = np.arange(0.0, end + step_s, step_s)
    held = held_on_grid(result.timeline, grid)
    apps = sorted({jid.rsplit("-", 1)[0] for jid in held})
    cmap = plt.get_cmap("tab10")
    colour = {a: cmap(i % 10) for i, a in enumerate(apps)}
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.stackplot(grid / 3600, np.array(list(held.values())),
                 colors=[colour[jid.rsplit("-", 1)[0]] for jid in held], linewidth=0)
    ax.axhline(capacity, color="k", lw=0.8, ls="--")
    for a in apps:
        ax.plot([], [], color=colour[a], lw=6, label=a)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPUs held")
    ax.set_title(f"GPU allocation per job — {result.policy}")
    ax.legend(fontsize=7, ncol=len(apps), loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
