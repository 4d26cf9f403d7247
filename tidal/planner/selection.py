"""Which few configurations to profile so that the performance model's fit is well-posed.

Greedy coverage: each candidate carries features (plan family; family × single/multi-node; GPU
count; accumulation count; family × GPU count; tensor and pipeline degrees; data-parallel
degree). Repeatedly take the candidate that adds the most (weighted) features not yet covered;
ties go to the one whose GPU count and accumulation count are farthest, in log scale, from
those already chosen (the families share the per-sample compute constant, and the fit needs
the spread to tell per-sample from per-micro-batch and constant costs), then to fewer nodes,
then to more GPUs: the shapes jobs actually run on (a full node, two full nodes) teach the
model more than the cheapest ones. Families are covered before sizes, so the fit sees every
kind of term (offload, checkpointing, ZeRO all-gathers, cross-node traffic, 3D) at least once.

When there are fewer picks than families (a live profile: 4-6 plans among twelve single-GPU
families; the issue's measurement tables: 3 rows), whole families cannot all be covered; the
model's terms (CPU optimizer, ZeRO-2, ZeRO-3, forward with and without recomputation) then
weigh like families, so one row of ZeRO-3 + offload informs two constants. On the tiny-GPT
CPU table (3 rows per model) this took perfmodel_mape 0.234 → 0.119 and memory_mape
0.095 → 0.076; the Rubick tables (5 families, 8 rows) keep the family rule.

With four picks or more in that case, the first two are the plainest family (fewest terms) at
its fewest and most accumulation steps, on the most GPUs it runs on: the compute curve, per
sample against per micro-batch, which every other term is read against. On a GPU a small
micro-batch is launch-bound, so that split is most of a small model's step (GPT-2 124M on an
H100, ZeRO-0: 0.203 s at 8 × 2 samples, 0.126 s at 1 × 16); without the pair the fit guessed
it, and the H100 table's perfmodel_mape was 0.55 at four rows (0.27 with it). On the most GPUs
the fewest accumulation steps are the smallest whole-batch micro-batch: the profiles run before
any memory model, and a whole global batch on one GPU is the plan likeliest to run out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from tidal.planner.perfmodel import PlanPoint

T = TypeVar("T")


def family(p: PlanPoint) -> str:
    if p.tp > 1 or p.pp > 1:
        return "3d"
    kind = f"z{p.zero_stage}" + ("o" if p.offload else "")
    return kind + ("-ac" if p.act_ckpt else "")


def crosses_network(p: PlanPoint) -> bool:
    """Whether the plan's bandwidth-heavy collectives cross nodes: all of a data-parallel plan's
    on a multi-node placement; for a 3D plan only a data-parallel group or a tensor-parallel
    group that spans nodes (pipeline hand-offs are small and inform no bandwidth term)."""
    if p.nodes <= 1:
        return False
    if p.tp == 1 and p.pp == 1:
        return True
    per_node = min(g for g in p.gpus_per_node if g > 0)
    return p.tp > per_node or p.dp > p.dp_group[0]


def terms(p: PlanPoint) -> set[tuple[object, ...]]:
    """The model terms a data-parallel plan exercises (what `perfmodel.informed` frees): the CPU
    optimizer, ZeRO-2/3 hooks, and the forward with and without recomputation (k_bwd is told
    from k_fwd only by seeing both)."""
    if p.tp > 1 or p.pp > 1:
        return set()
    on = {"offload": p.offload, f"zero{p.zero_stage}": p.zero_stage in (2, 3)}
    return {("term", t) for t, yes in on.items() if yes} | {("term", "ckpt", p.act_ckpt)}


def features(p: PlanPoint, by_term: bool = False) -> set[tuple[object, ...]]:
    f = family(p)
    out: set[tuple[object, ...]] = {("family", f), ("span", f, crosses_network(p)), ("n", f, p.n),
                                    ("size", p.n), ("accum", p.grad_accum), ("odd", p.odd)}
    if f == "3d":
        out |= {("tp", p.tp), ("pp", p.pp), ("dp3d", p.dp)}
    return out | terms(p) if by_term else out


def select(candidates: Sequence[T], point: Callable[[T], PlanPoint], k: int = 8) -> list[T]:
    chosen: list[T] = []
    covered: set[tuple[object, ...]] = set()
    weights = {"term": 100, "family": 100, "size": 20, "accum": 20, "odd": 15, "span": 10, "tp": 5,
               "pp": 5, "dp3d": 3, "n": 1}
    remaining = list(candidates)
    sizes: list[tuple[int, int]] = []
    # fewer picks than families: cover the model's terms too (module docstring)
    by_term = len({family(point(c)) for c in candidates}) > k

    def gain(c: T) -> tuple[int, float, int, int]:
        p = point(c)
        new = features(p, by_term) - covered
        spread = min((abs(math.log2(p.n) - math.log2(m)) + abs(math.log2(p.grad_accum) - math.log2(g))
                      for m, g in sizes), default=math.inf)
        return sum(weights[str(f[0])] for f in new), spread, -p.nodes, p.n

    def take(best: T) -> None:
        chosen.append(best)
        covered.update(features(point(best), by_term))
        sizes.append((point(best).n, point(best).grad_accum))
        remaining.remove(best)

    if by_term and k >= 4:  # the compute-curve pair first (module docstring)
        fams: dict[str, list[T]] = {}
        for c in remaining:
            fams.setdefault(family(point(c)), []).append(c)
        for f, cs in fams.items():  # on the most GPUs the family runs on
            most = max(point(c).n for c in cs)
            fams[f] = [c for c in cs if point(c).n == most]
        spread = [f for f, cs in fams.items() if len({point(c).grad_accum for c in cs}) > 1]
        if spread:
            def plainness(f: str) -> tuple[int, str]:
                p = point(fams[f][0])
                return len(terms(p)) + p.act_ckpt, f
            pair = fams[min(spread, key=plainness)]
            take(min(pair, key=lambda c: point(c).grad_accum))
            take(max(pair, key=lambda c: point(c).grad_accum))
    while remaining and len(chosen) < k:
        best = max(remaining, key=gain)
        take(best)
    return chosen
