"""The simulator's PNG plots (`tidal.sim.plots`), no cluster: what the allocation timeline stacks is
what each job held, and both plots are written from a real simulation."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from tidal.sim.plots import allocation_timeline, held_on_grid, jct_cdf
from tidal.sim.simulator import POLICIES, SimConfig, Simulator
from tidal.sim.tables import Truth
from tidal.sim.views import SimPlanner
from tidal.sim.workload import synthetic

RUBICK = Path(__file__).resolve().parents[3] / "shared" / "traces" / "rubick"


def _held_at(timeline: list[tuple[float, str, int]], jid: str, t: float) -> int:
    """Brute force: the job's last logged change at or before t."""
    last = 0
    for when, j, g in timeline:  # logged order; times never go back
        if j == jid and when <= t:
            last = g
    return last


def test_held_on_grid_is_each_jobs_last_change_at_or_before_each_time() -> None:
    rng = random.Random(0)
    for _ in range(20):
        timeline: list[tuple[float, str, int]] = []
        t = 0.0
        for _ in range(rng.randint(1, 30)):
            t += rng.choice([0.0, 0.0, rng.uniform(1, 200)])  # several changes at one time too
            timeline.append((t, f"app-{rng.randint(0, 4)}", rng.randint(0, 8)))
        grid = np.arange(0.0, t + 60.0, rng.choice([7.0, 60.0]))
        held = held_on_grid(timeline, grid)
        assert set(held) == {j for _, j, _ in timeline}
        for jid, row in held.items():
            assert row.tolist() == [_held_at(timeline, jid, x) for x in grid], jid


def test_plots_of_a_simulation_are_written_and_never_stack_above_capacity(tmp_path: Path) -> None:
    truth = Truth(RUBICK)
    jobs = synthetic(truth, jobs=12, jobs_per_hour=120, seed=1, mix={"bert": 1.0, "gpt2": 1.0},
                     median_s=120, sigma=1.0, sla_fraction=0.25)
    results = [Simulator(jobs, truth, SimPlanner(truth=truth, fit_restarts=2), POLICIES[name],
                         SimConfig(nodes=1, gpus_per_node=8)).run() for name in ("tidal", "fifo_static")]
    grid = np.arange(0.0, max(t for t, _, _ in results[0].timeline) + 30.0, 30.0)
    stacked = np.sum(list(held_on_grid(results[0].timeline, grid).values()), axis=0)
    assert stacked.max() <= 8 and stacked.max() > 0
    jct_cdf(results, tmp_path / "cdf.png", title="two policies")
    allocation_timeline(results[0], 8, tmp_path / "timeline.png")
    for name in ("cdf.png", "timeline.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
