"""Which lent GPUs to take back when Serve needs them: the least-preemption-cost reclaim.

A pure function (no Ray, no clock): the live scheduler and the simulator call it with the jobs
that hold lent inference GPUs (`Borrower`) and the number of GPUs Serve needs back.

**Cost of a reclaim** (Aryl/Lyra §4.2 prices a server by the preemption it causes; here per job,
in GPU-seconds of training progress lost). A job j affected by a reclaim holds g_j GPUs (l_j of
them lent); it stops at its next step boundary and loses the work since its last checkpoint
(lost_j seconds: about one step for a Tidal job, which checkpoints when it stops) and a restart
(restart_j seconds) on every one of its GPUs; it resumes on g′ GPUs, the largest option with
g′ ≤ g_j − x (an inelastic job, or one with no smaller option, is evicted: g′ = 0):

    cost_j(g′) = (lost_j + restart_j) · g_j + restart_j · o_j(g′)            (shrink to g′ > 0)
    cost_j(0)  = (lost_j + restart_j + queue_j) · g_j + restart_j · o_j(0)   (evict)
    o_j(g′)    = g_j − g′ − min(l_j, g_j − g′)   owned GPUs it gives up beyond the lent ones

queue_j: the extra seconds an evicted job waits before it runs again; the owned GPUs a shrink
gives up idle for about a restart before the next decision uses them. So shrinking costs less
than evicting, a smaller shrink less than a larger one, and a reclaim prefers jobs that are
small and quick to restart. A shrink from g_j to g′ frees min(l_j, g_j − g′) lent GPUs: the job
keeps its owned GPUs first.

**The choice** minimises Σ cost over the affected jobs subject to Σ freed ≥ need: a
multiple-choice covering knapsack, solved exactly by dynamic programming over the freed count
(capped at `need`), O(jobs · options · need). Lyra chooses greedily server by server; the DP
equals the brute-force optimum on every small seeded instance (tests/autoscaler/test_reclaim.py).
When the borrowers together cannot free `need`, every one of them is evicted (the best that can
be done: Serve gets all lent GPUs back).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Borrower:
    """A job holding lent GPUs."""

    job_id: str
    gpus: int  # all the GPUs it holds now
    lent_by_node: tuple[tuple[str, int], ...]  # of which lent, per inference node
    options: tuple[int, ...]  # GPU counts it can run on (ascending); () = inelastic
    lost_s: float = 0.0  # work since its last checkpoint, in seconds
    restart_s: float = 30.0
    queue_s: float = 0.0  # extra wait of an evicted job

    @property
    def lent(self) -> int:
        return sum(g for _, g in self.lent_by_node)


@dataclass(frozen=True, kw_only=True)
class Reclaim:
    """What happens to one borrower: it runs on `keep_gpus` GPUs (0: evicted) and gives back
    `freed_by_node` of its lent GPUs."""

    job_id: str
    keep_gpus: int
    freed_by_node: tuple[tuple[str, int], ...]
    cost: float

    @property
    def freed(self) -> int:
        return sum(g for _, g in self.freed_by_node)


def choices(b: Borrower) -> list[tuple[int, int, float]]:
    """(g′, lent GPUs freed, cost) for every way to take GPUs from `b` (module docstring)."""
    out = []
    base = (b.lost_s + b.restart_s) * b.gpus
    for g in sorted({o for o in b.options if o < b.gpus}, reverse=True):
        freed = min(b.lent, b.gpus - g)
        if freed > 0:
            out.append((g, freed, base + b.restart_s * (b.gpus - g - freed)))
    if b.lent > 0:
        out.append((0, b.lent, base + b.queue_s * b.gpus + b.restart_s * (b.gpus - b.lent)))
    return out


def _freed_by_node(b: Borrower, n: int) -> tuple[tuple[str, int], ...]:
    """n of b's lent GPUs, taken from the nodes where it holds fewest first (whole nodes free up)."""
    out = []
    for nid, g in sorted(b.lent_by_node, key=lambda x: (x[1], x[0])):
        take = min(g, n)
        if take:
            out.append((nid, take))
        n -= take
    return tuple(sorted(out))


def choose_reclaim(borrowers: Sequence[Borrower], need: int) -> tuple[Reclaim, ...]:
    """The least-cost way to free at least `need` lent GPUs (module docstring)."""
    if need <= 0:
        return ()
    bs = [b for b in sorted(borrowers, key=lambda b: b.job_id) if b.lent > 0]
    if sum(b.lent for b in bs) < need:  # not enough: everything lent goes back
        return tuple(Reclaim(job_id=b.job_id, keep_gpus=0, freed_by_node=_freed_by_node(b, b.lent),
                             cost=choices(b)[-1][2]) for b in bs)
    inf = math.inf
    # best[c]: least cost to free at least c GPUs (c capped at need) with the borrowers so far
    best = [0.0] + [inf] * need
    back: list[list[int]] = []
    opts = [choices(b) for b in bs]
    for ch in opts:
        new = best[:]
        arg = [-1] * (need + 1)
        for k, (_, freed, cost) in enumerate(ch):
            for c in range(need + 1):
                prev = best[max(0, c - freed)]
                if prev + cost < new[c] - 1e-9:
                    new[c], arg[c] = prev + cost, k
        back.append(arg)
        best = new
    out = []
    c = need
    for b, ch, arg in zip(reversed(bs), reversed(opts), reversed(back), strict=True):
        k = arg[c]
        if k >= 0:
            g, freed, cost = ch[k]
            out.append(Reclaim(job_id=b.job_id, keep_gpus=g, freed_by_node=_freed_by_node(b, freed),
                               cost=cost))
            c = max(0, c - freed)
    return tuple(sorted(out, key=lambda r: r.job_id))


def brute_force(borrowers: Sequence[Borrower], need: int) -> float:
    """The least cost of freeing `need` GPUs over every combination of choices (tests only)."""
    bs = [b for b in borrowers if b.lent > 0]
    per = [[(0, 0.0)] + [(f, c) for _, f, c in choices(b)] for b in bs]
    best = math.inf
    for combo in itertools.product(*per):
        if sum(f for f, _ in combo) >= need:
            best = min(best, sum(c for _, c in combo))
    return best


def evict_newest(borrowers: Sequence[Borrower], need: int,
                 started: dict[str, float]) -> tuple[Reclaim, ...]:
    """Kueue's cohort reclaim, the baseline: evict whole borrowing workloads, the most recently
    admitted first, until `need` GPUs are free."""
    out = []
    newest_first = sorted((b for b in borrowers if b.lent > 0),
                          key=lambda b: (-started.get(b.job_id, 0.0), b.job_id))
    for b in newest_first:
        if need <= 0:
            break
        out.append(Reclaim(job_id=b.job_id, keep_gpus=0, freed_by_node=_freed_by_node(b, b.lent),
                           cost=choices(b)[-1][2]))
        need -= b.lent
    return tuple(out)
