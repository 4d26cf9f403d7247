"""What the simulator takes as the truth: measured iteration times of the Rubick artifact.

`Truth.iter_time(app, code, gpus_per_node)` is the time of one iteration of `app` under plan
`code` on a placement (GPUs used per node), looked up as the README of
`../shared/traces/rubick/` describes the artifact's simulator (§6), with its quirks fixed
knowingly:

1. the exact (plan, placement) row, the placement canonicalised as the artifact does (the
   lexicographically smallest cyclic rotation of the per-node tuple) and, since node identity
   is irrelevant, also as the sorted tuple (the artifact misses e.g. (1, 2, 1, 2));
2. a data-parallel plan measured nowhere on that placement: the `ga` row of the placement;
3. otherwise the mean over all plans measured on the same (nodes, GPUs) shape;
4. otherwise linear interpolation of those means in the GPU count among shapes with the same
   number of nodes (or the nearest node count); outside the measured GPU counts, by the
   `extrapolation` rule:

   * `flat` (the default, the yardstick the issues' figures were measured on): the nearest
     count's time, i.e. fewer GPUs are as fast as the smallest measured count;
   * `linear`: below the smallest measured count, throughput ∝ GPUs (time × n_min / n: the
     fastest fewer GPUs can be without super-linear scaling); above the largest, flat;
   * `measured`: the same plan measured on n GPUs on other placements (the mean), if any;
     else flat.

   On the shared tables the rule matters for one cell above all: llama30's `641` on 24 GPUs
   packed on 3 nodes. No 3-node shape is measured, so the nearest node count's (4 nodes, 32
   GPUs) time is taken flat: 2.76 s, as fast as 32 GPUs, while the table measures that very
   plan on 24 GPUs (6 nodes × 4) at 5.30 s; `linear` gives 3.68 s. (`measured` also moves
   gpt2's 3D plans on 15-40 GPUs, by at most 11%.) A policy that runs llama30 on its smallest
   option, as the Rubick re-implementation admits jobs, gains most from the flat rule;
   `benchmarks/sim_sweep.py` prints its figures under all three.

Unlike the artifact, 3D plans are looked up as the plan actually chosen (its plan tuples never
matched a row, so LLaMA jobs always got the shape's mean).

`plans_at(app, n)` lists the plan codes measured on n GPUs: the plans a simulated job may run
on n GPUs (what was never measured is never offered).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np

from tidal.jobs.spec import Plan
from tidal.planner.planner import packed as planner_packed
from tidal.planner.traces import GLOBAL_BATCH, MODELS, decode_placement, placements

DP_CODES = ("ga", "gc", "zero-dp", "zero-offload")


def canonical(gpus_per_node: tuple[int, ...]) -> str:
    """The artifact's placement code: smallest cyclic rotation of the non-empty nodes' counts."""
    g = tuple(x for x in gpus_per_node if x > 0)
    if not g:
        raise ValueError("a placement needs at least one GPU")
    rot = min(g[i:] + g[:i] for i in range(len(g)))
    return "".join(str(x) for x in rot)


def packed(n: int, per_node: int) -> tuple[int, ...]:
    """n GPUs on the fewest nodes, full nodes first (the planner's shape, as a tuple)."""
    return planner_packed(n, per_node).gpus_per_node


def plan_of(code: str, n: int, global_batch: int) -> Plan:
    """The Tidal `Plan` of an artifact plan code on n GPUs (micro-batch: the batch per replica)."""
    if code in DP_CODES:
        mb = max(1, global_batch // n)
        return Plan(dp=n, zero_stage=2 if code.startswith("zero") else 0,
                    offload_optimizer=code == "zero-offload", activation_checkpointing=code == "gc",
                    micro_batch=mb)
    if not (len(code) == 3 and code.isdigit() and "0" not in code and math.prod(map(int, code)) == n):
        raise ValueError(f"plan {code!r} on {n} GPUs: a plan is one of {', '.join(DP_CODES)} or three digits "
                         f"pp·tp·dp whose product is the GPU count")
    pp, tp, dp = (int(c) for c in code)
    return Plan(dp=dp, tp=tp, pp=pp, micro_batch=max(1, global_batch // dp))


def code_of(plan: Plan) -> str:
    if plan.tp > 1 or plan.pp > 1:
        return f"{plan.pp}{plan.tp}{plan.dp}"
    if plan.zero_stage >= 2:
        return "zero-offload" if plan.offload_optimizer else "zero-dp"
    return "gc" if plan.activation_checkpointing else "ga"


K = TypeVar("K")
Extrapolation = Literal["flat", "linear", "measured"]
EXTRAPOLATIONS: tuple[Extrapolation, ...] = ("flat", "linear", "measured")


@dataclass(frozen=True)
class Truth:
    root: Path
    extrapolation: Extrapolation = "flat"  # step 4 of the module docstring, outside the measured counts

    def __post_init__(self) -> None:
        if self.extrapolation not in EXTRAPOLATIONS:
            raise ValueError(f"Truth.extrapolation: {self.extrapolation!r} is not one of {EXTRAPOLATIONS}")
        missing = [f"{m}-placements.csv" for m in MODELS
                   if not (Path(self.root) / f"{m}-placements.csv").is_file()]
        if missing:
            raise ValueError(f"Truth.root: {self.root} lacks {', '.join(missing)} (the Rubick tables)")

    @cached_property
    def _rows(self) -> dict[str, dict[tuple[str, str], float]]:
        return {app: {(r.exec_plan, r.placement): r.sample.iter_s for r in placements(self.root, app)}
                for app in MODELS}

    def _means(self, key: Callable[[str, tuple[int, ...]], K],
               reduce: Callable[[list[float]], float] = lambda v: float(np.mean(v))
               ) -> dict[str, dict[K, float]]:
        """Per app, the mean (or `reduce`) measured time of the rows grouped by key(plan, GPUs
        per node)."""
        out: dict[str, dict[K, float]] = {}
        for app, rows in self._rows.items():
            acc: dict[K, list[float]] = defaultdict(list)
            for (code, placement), t in rows.items():
                acc[key(code, decode_placement(placement))].append(t)
            out[app] = {k: reduce(v) for k, v in acc.items()}
        return out

    @cached_property
    def _shape_means(self) -> dict[str, dict[tuple[int, int], float]]:
        """(nodes, GPUs) → the mean time over every plan measured on that shape (step 3)."""
        return self._means(lambda _, g: (len(g), sum(g)))

    @cached_property
    def _by_plan_gpus(self) -> dict[str, dict[tuple[str, int], float]]:
        """(plan, GPU count) → the mean time over every placement it was measured on."""
        return self._means(lambda code, g: (code, sum(g)))

    @cached_property
    def _plans_by_gpus(self) -> dict[str, dict[int, tuple[str, ...]]]:
        out: dict[str, dict[int, tuple[str, ...]]] = {}
        for app, rows in self._rows.items():
            acc: dict[int, set[str]] = defaultdict(set)
            for code, placement in rows:
                acc[sum(decode_placement(placement))].add(code)
            out[app] = {n: tuple(sorted(c)) for n, c in sorted(acc.items())}
        return out

    def apps(self) -> tuple[str, ...]:
        return MODELS

    def global_batch(self, app: str) -> int:
        return GLOBAL_BATCH[app]

    def gpu_counts(self, app: str) -> tuple[int, ...]:
        return tuple(self._plans_by_gpus[app])

    def plans_at(self, app: str, n: int) -> tuple[str, ...]:
        return self._plans_by_gpus[app].get(n, ())

    def measured(self, app: str, code: str, gpus_per_node: tuple[int, ...]) -> float | None:
        rows = self._rows[app]
        g = tuple(x for x in gpus_per_node if x > 0)
        for key in (canonical(g), "".join(str(x) for x in sorted(g))):
            if (code, key) in rows:
                return rows[(code, key)]
        return None

    def plan_time(self, app: str, plan: Plan, gpus_per_node: tuple[int, ...]) -> float:
        """`iter_time` of a Tidal plan (the simulator's interface to the truth)."""
        return self.iter_time(app, code_of(plan), gpus_per_node)

    def fastest(self, app: str, max_gpus: int) -> float:
        """The app's fastest measured iteration on at most `max_gpus` GPUs (any plan, placement)."""
        return min(t for (_, pl), t in self._rows[app].items() if sum(decode_placement(pl)) <= max_gpus)

    @cached_property
    def _fastest_placement(self) -> dict[str, dict[tuple[str, int], float]]:
        """(plan, GPU count) → the fastest measured time over every placement of that count."""
        return self._means(lambda code, g: (code, sum(g)), reduce=min)

    def best_time(self, app: str, plan: Plan, gpus: int, gpus_per_node: int) -> float:
        """The fastest iteration of `plan` on `gpus` GPUs the simulator may meet: packed on the
        fewest nodes of `gpus_per_node`, or a measured placement of as many GPUs if one is
        faster (2 of the shared tables' 512 rows are: gpt2's `351` on (5, 5, 5) and `851` on
        eight nodes of 5, by up to 10%). Placements the tables never measured are taken to be no
        faster than packed (the policies place packed where they can; `tidal.sim.bounds`)."""
        return min(self.plan_time(app, plan, packed(gpus, gpus_per_node)),
                   self._fastest_placement[app].get((code_of(plan), gpus), math.inf))

    def iter_time(self, app: str, code: str, gpus_per_node: tuple[int, ...]) -> float:
        """Seconds per iteration (steps 1-4 of the module docstring)."""
        exact = self.measured(app, code, gpus_per_node)
        if exact is not None:
            return exact
        if code in DP_CODES:
            ga = self.measured(app, "ga", gpus_per_node)
            if ga is not None:
                return ga
        g = tuple(x for x in gpus_per_node if x > 0)
        means = self._shape_means[app]
        nodes, n = len(g), sum(g)
        if (nodes, n) in means:
            return means[(nodes, n)]
        node_counts = sorted({k[0] for k in means}, key=lambda k: (abs(k - nodes), k))
        pts = sorted((k[1], v) for k, v in means.items() if k[0] == node_counts[0])
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if xs[0] <= n <= xs[-1] or self.extrapolation == "flat":
            return float(np.interp(n, xs, ys))
        if self.extrapolation == "linear":
            return ys[0] * xs[0] / n if n < xs[0] else ys[-1]
        same = self._by_plan_gpus[app].get((code, n))  # "measured"
        return same if same is not None else float(np.interp(n, xs, ys))
