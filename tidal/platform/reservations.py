"""Capacity held back from the policy while a newly submitted job is being profiled.

Profiling runs the job itself on real engines, so its workers need GPUs and CPUs like any run.
On a full cluster nothing is free: without a reservation the profile tasks would wait in Ray's
queue until some running job ended, and `submit` with them. The scheduler therefore *reserves*
the profile's workers on chosen nodes and hands the policy a snapshot whose nodes have that much
less capacity; the pure policy then shrinks (or moves) the running jobs that held it, exactly as
for any capacity change, and the profile tasks, pinned to the reserved nodes, start as soon as
the stopped runs release them. The reservation ends when profiling ends.

Both functions here are pure (no Ray calls): the scheduler passes in its node list and what its
own jobs hold, and the unit tests call them on plain data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from tidal.core.policy import Node


@dataclass(frozen=True, kw_only=True)
class Reservation:
    """`workers` profile workers, one node id each (a node repeats for several workers)."""

    workers: tuple[str, ...]
    gpus_per_worker: float
    cpus_per_worker: float

    def on(self, node_id: str) -> tuple[float, float]:
        """(GPUs, CPUs) this reservation holds on `node_id`."""
        k = sum(1 for n in self.workers if n == node_id)
        return k * self.gpus_per_worker, k * self.cpus_per_worker


def reserve(nodes: Iterable[Node], held: Mapping[str, tuple[float, float]], workers: int, *,
            gpus_per_worker: float, cpus_per_worker: float,
            kept: Mapping[str, tuple[float, float]] | None = None,
            reserved: Iterable[Reservation] = ()) -> Reservation | None:
    """Nodes for `workers` profile workers, or None if the cluster cannot host them.

    `held`: (GPUs, CPUs) that Tidal's running jobs hold per node; `kept`: the part of it that a
    reservation must not take (guaranteed jobs': a profile never pushes one below its
    guarantee). Workers are packed on as few nodes as possible: nodes whose *free* resources
    host the most workers first (no running job has to shrink for those), then the nodes that
    could host the most once their other jobs shrank, then by id (deterministic). Capacity
    already reserved for other profiles is never used twice.
    """
    if workers < 1:
        raise ValueError(f"a reservation needs at least one worker, got {workers}")
    others = tuple(reserved)

    def fit(gpus: float, cpus: float) -> int:
        by_gpu = math.floor(gpus / gpus_per_worker + 1e-9) if gpus_per_worker > 0 else workers
        by_cpu = math.floor(cpus / cpus_per_worker + 1e-9) if cpus_per_worker > 0 else workers
        return max(0, min(by_gpu, by_cpu, workers))

    rows = []
    for n in nodes:
        rg = sum(r.on(n.node_id)[0] for r in others)
        rc = sum(r.on(n.node_id)[1] for r in others)
        hg, hc = held.get(n.node_id, (0.0, 0.0))
        kg, kc = (kept or {}).get(n.node_id, (0.0, 0.0))
        cap = fit(n.gpus - rg - kg, n.cpus - rc - kc)
        free = min(cap, fit(n.gpus - rg - hg, n.cpus - rc - hc))
        rows.append((-free, -cap, n.node_id, cap))
    out: list[str] = []
    for _, _, node_id, cap in sorted(rows):
        take = min(cap, workers - len(out))
        out += [node_id] * take
        if len(out) == workers:
            return Reservation(workers=tuple(out), gpus_per_worker=gpus_per_worker,
                               cpus_per_worker=cpus_per_worker)
    return None


def without(nodes: Iterable[Node], reservations: Iterable[Reservation]) -> list[Node]:
    """The nodes as the policy may use them: each node's GPUs and CPUs less what is reserved.

    GPUs are whole in the policy: a fractional reservation takes the whole GPU it touches."""
    res = tuple(reservations)
    out = []
    for n in nodes:
        g = sum(r.on(n.node_id)[0] for r in res)
        c = sum(r.on(n.node_id)[1] for r in res)
        out.append(replace(n, gpus=max(0, n.gpus - math.ceil(g - 1e-9)), cpus=max(0.0, n.cpus - c)))
    return out
