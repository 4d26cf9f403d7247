"""Phases 1 and 2 of a decision: how many GPUs (which option) each job gets, before placement.

**Phase 1, floors and admission.** Guaranteed jobs get their floor (`objective.guarantee_index`).
Jobs past admission keep theirs first: running ones, and guaranteed ones admitted before that
wait for a relaunch (`JobView.admitted`: stopped for a change of GPUs, requeued after a fault),
so a job that arrived earlier but waited never pushes out one admitted since. Then waiting
guaranteed jobs, by the objective's value per GPU of their floor, highest first (Smith's rule:
the order in which the knapsack would rank them; by arrival, one wide job takes the GPUs dozens
of small ones wait for; aging keeps the wide ones from starving). A waiting job is admitted
only into owned GPUs that neither floors nor running best-effort jobs hold (their smallest
options): admission shrinks running jobs and never stops one, as in Rubick
(`PolicyConfig.admission_preempts` relaxes this). A guaranteed job that cannot get its floor
waits rather than run below its guarantee. Jobs restarted `max_restarts` times are *kept*: their
option is a floor too, and they may only grow.

**Phase 2, the knapsack.** The remaining GPUs are shared to maximise Σ u (`objective`): each
best-effort job takes one of its options or waits, each job with a floor may upgrade above it
(`knapsack`). Lent GPUs (inference's, `Node.recallable`) take part at a price:

    lent_price_factor = risk · restart / (restart + horizon_s)

risk: the chance a lent GPU is recalled within the horizon (`Node.recall_risk`, GPU-weighted
over the lent nodes); restart: the jobs' mean restart cost, so the factor is the share of a
horizon's work a recall throws away. Guarantees (phase 1) count owned GPUs only.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping

from tidal.core.policy.knapsack import exact, greedy_flat, knapsack_dp, rows
from tidal.core.policy.objective import flat_utilities
from tidal.core.policy.types import JobView, PolicyConfig


def choose_counts(jobs: list[JobView], capacity: int, fixed: Mapping[str, int | None],
                   floor_at: Mapping[str, int | None], cfg: PolicyConfig, now: float,
                   lent: int = 0, risk: float = 1.0,
                   kept: Mapping[str, int] | None = None,
                   owned_held: Mapping[str, int] | None = None, movable: int = 0
                   ) -> tuple[dict[str, int | None], dict[str, str]]:
    """Phases 1-2: an option index per job (None = waits) within `capacity` owned GPUs plus
    `lent` recallable ones (priced by `risk`: this module's docstring). `jobs` come in arrival order;
    `floor_at`: each job's `guarantee_index` (`decide` computes them once for all its rounds);
    `fixed` jobs take exactly their index; `kept` jobs at least theirs (they may grow).
    `owned_held`: owned GPUs each running job holds now (admission control: a waiting guaranteed
    job does not take those of running best-effort jobs, under `admission_preempts="later"` of
    the earlier ones only; a job absent from it holds none). `movable`: lent GPUs no job holds,
    to which placement may move a best-effort job off the owned GPUs a guaranteed one needs
    (`place`): that many of the held GPUs do not bar admission."""
    kept = kept or {}
    ledger = _Ledger(capacity, {j.job_id: j for j in jobs}, owned_held)
    choice: dict[str, int | None] = {j.job_id: None for j in jobs}
    for jid, idx in fixed.items():
        choice[jid] = idx
        if idx is not None:
            ledger.take(jid, idx)
    # jobs past admission: running ones, and guaranteed ones admitted before that wait again
    # (`JobView.admitted`: stopped for a change of GPUs, requeued after a failure)
    admitted = {j.job_id for j in jobs if j.current is not None or (j.admitted and j.guarantee is not None)}
    order = _floor_order(jobs, fixed, kept, admitted, floor_at, cfg, now)
    held = _held_by_arrival(jobs, fixed, kept, owned_held, cfg)
    floor, reasons = _floors(order, choice, ledger, kept, admitted, floor_at, held, movable, cfg)
    # phase 2: the multiple-choice knapsack over the free GPUs: best-effort jobs take any option
    # or wait, guaranteed (admitted) and kept ones upgrades above their floors
    owned = max(0, ledger.free)
    lent_left = max(0, lent - ledger.held_lent + min(0, ledger.free))
    restart = sum(j.restart_cost_s for j in jobs) / max(1, len(jobs))
    choice.update(phase2([j for j in order if j.job_id in floor or j.guarantee is None], floor,
                         owned + lent_left, owned, risk * restart / (restart + cfg.horizon_s), now, cfg))
    for j in order:
        if choice[j.job_id] is None and j.job_id not in reasons:
            reasons[j.job_id] = f"waiting: needs {j.options[0].gpus} GPUs, others use them better"
    return choice, reasons


class _Ledger:
    """Owned GPUs left to phase 1 (`free`; negative: floors and kept jobs exceed them), and the
    lent GPUs that fixed and kept jobs go on holding where they run (`held_lent`)."""

    def __init__(self, capacity: int, by_id: Mapping[str, JobView],
                 owned_held: Mapping[str, int] | None) -> None:
        self.free, self.held_lent = capacity, 0
        self.by_id, self.owned_held = by_id, owned_held

    def take(self, jid: str, idx: int) -> None:
        """A job fixed or kept at option `idx`: where it stays on the GPUs it runs on, it takes
        their owned and lent parts; otherwise all of them from the owned ones. (Counted as owned,
        a kept job's lent GPUs would keep guaranteed jobs waiting beside idle owned ones.)"""
        g, cur = self.by_id[jid].options[idx].gpus, self.by_id[jid].current
        held = self.owned_held.get(jid) if self.owned_held else None
        on_owned, on_lent = (g, 0) if held is None or cur is None or g != cur.gpus else (held, g - held)
        self.free, self.held_lent = self.free - on_owned, self.held_lent + on_lent


def _floor_order(jobs: list[JobView], fixed: Mapping[str, int | None], kept: Mapping[str, int],
                 admitted: set[str], floor_at: Mapping[str, int | None], cfg: PolicyConfig,
                 now: float) -> list[JobView]:
    """The jobs not fixed, in phase 1's order: floor-holders (guaranteed or kept) first, those
    past admission before waiting ones (a guaranteed job admitted once is never pushed out by
    one that arrived earlier but waited), waiting ones by `admission_order`, then by arrival."""
    rank = admission_order([(j, gi) for j in jobs if j.guarantee is not None and j.job_id not in admitted
                            and j.job_id not in fixed and j.job_id not in kept
                            and (gi := floor_at[j.job_id]) is not None], cfg, now)
    return sorted((j for j in jobs if j.job_id not in fixed),
                  key=lambda j: (j.guarantee is None and j.job_id not in kept, j.job_id not in admitted,
                                 j.job_id not in rank, rank.get(j.job_id, 0), j.arrival, j.job_id))


def _held_by_arrival(jobs: list[JobView], fixed: Mapping[str, int | None], kept: Mapping[str, int],
                     owned_held: Mapping[str, int] | None,
                     cfg: PolicyConfig) -> tuple[list[float], list[int]]:
    """Owned GPUs running best-effort jobs hold that admission may not take (their smallest
    options), by arrival: their arrivals, and the running sums of those GPUs (a leading 0).
    Under "later" a waiting guaranteed job leaves those of earlier arrivals alone, under "none"
    all of them; under "any" none (empty)."""
    held_at: list[float] = []
    held_sum: list[int] = [0]
    if cfg.admission_preempts != "any" and owned_held:
        for j in jobs:  # in arrival order (`decide` sorts them)
            own = owned_held.get(j.job_id)
            if own is None or j.guarantee is not None or j.job_id in fixed or j.job_id in kept:
                continue
            held_at.append(j.arrival)
            held_sum.append(held_sum[-1] + min(j.options[0].gpus, own))
    return held_at, held_sum


def _floors(order: list[JobView], choice: dict[str, int | None], ledger: _Ledger, kept: Mapping[str, int],
            admitted: set[str], floor_at: Mapping[str, int | None], held: tuple[list[float], list[int]],
            movable: int, cfg: PolicyConfig) -> tuple[dict[str, int], dict[str, str]]:
    """Phase 1: each floor-holder in `order` gets its floor where the owned GPUs allow it
    (written into `choice`, taken from `ledger`); the floors given, and why the others wait."""
    held_at, held_sum = held
    floor: dict[str, int] = {}
    reasons: dict[str, str] = {}
    for j in order:
        if j.guarantee is None and j.job_id not in kept:
            break  # `order` puts the best-effort jobs that are not kept last: no floor among them
        gi = floor_at[j.job_id]
        if j.job_id in kept:  # worn out by restarts: keeps what it runs (and its guarantee)
            f = max(kept[j.job_id], gi or 0)
            choice[j.job_id], floor[j.job_id] = f, f
            ledger.take(j.job_id, f)
            continue
        if gi is None:
            reasons[j.job_id] = "no option reaches its guarantee"
            continue
        need = j.options[gi].gpus
        # a waiting job is admitted around the running best-effort jobs' GPUs: all of them, or
        # under "later" those that arrived before it
        spared = j.arrival if cfg.admission_preempts == "later" else math.inf
        barred = (max(0, held_sum[bisect.bisect_left(held_at, spared)] - movable)
                  if j.job_id not in admitted else 0)
        free = ledger.free
        if need <= free - barred:
            choice[j.job_id], floor[j.job_id] = gi, gi
            ledger.free -= need
        elif barred:
            reasons[j.job_id] = (f"waiting: its guarantee needs {need} GPUs, {free} free, {barred} of them "
                                 "held by running best-effort jobs" + (
                                     "" if cfg.admission_preempts == "none" else " that arrived before it"))
        else:
            reasons[j.job_id] = f"waiting: its guarantee needs {need} GPUs, {free} free"
    return floor, reasons


def admission_order(waiting: list[tuple[JobView, int]], cfg: PolicyConfig, now: float) -> dict[str, int]:
    """The order in which phase 1 admits waiting guaranteed jobs: by u_j(f_j) / g_j(f_j), the
    objective's value per GPU of the job's floor f_j, highest first (Smith's rule, the order in
    which the knapsack would rank them; ties by arrival). Not by arrival: then one wide
    guaranteed job takes, the moment they are free, the GPUs dozens of small ones wait for.
    Aging keeps the wide ones from starving: their weight grows without bound against the jobs
    that keep arriving. `waiting`:
    the waiting jobs with their floors f_j; a job with none (no option reaches its guarantee) is
    absent, ranks last, and phase 1 gives it none anyway."""
    import numpy as np

    if not waiting:
        return {}
    _, u, starts = flat_utilities([j for j, _ in waiting], now, cfg)
    n = len(waiting)
    at = starts + np.fromiter((gi for _, gi in waiting), dtype=np.int64, count=n)
    density = u[at] / np.fromiter((j.options[gi].gpus for j, gi in waiting), dtype=np.float64, count=n)
    ranked = sorted(range(n), key=lambda k: (-float(density[k]), waiting[k][0].arrival, waiting[k][0].job_id))
    return {waiting[k][0].job_id: r for r, k in enumerate(ranked)}


def phase2(cand: list[JobView], floor: Mapping[str, int], capacity: int, owned: int,
            lent_price_factor: float, now: float, cfg: PolicyConfig) -> dict[str, int]:
    """Phase 2's knapsack (`knapsack`) over `cand` in order: a job with a floor chooses among
    the options above it, as upgrades (GPUs and utility over the floor's), any other among all
    its options. Built from `flat_utilities` as arrays, which the greedy takes as they are."""
    import numpy as np

    if not cand:
        return {}
    gpus, u, starts = flat_utilities(cand, now, cfg)
    lens = np.diff(np.append(starts, len(gpus)))
    f = np.fromiter((floor.get(j.job_id, -1) for j in cand), dtype=np.int64, count=len(cand))
    at = starts + np.maximum(f, 0)  # the floor's option (any option for jobs with none)
    base_g = np.where(f >= 0, gpus[at], 0)
    base_u = np.where(f >= 0, u[at], 0.0)
    k_, i_, _ = rows(lens)
    keep = i_ > np.repeat(f, lens)
    k_, i_ = k_[keep], i_[keep]
    w_ = (gpus - np.repeat(base_g, lens))[keep]
    v_ = (u - np.repeat(base_u, lens))[keep]
    if exact(len(cand), capacity):
        bounds = np.searchsorted(k_, np.arange(len(cand) + 1))
        ws, vs, is_ = w_.tolist(), v_.tolist(), i_.tolist()
        items = [(j, list(zip(ws[lo:hi], vs[lo:hi], is_[lo:hi], strict=True)))
                 for j, lo, hi in zip(cand, bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]
        return knapsack_dp(items, capacity, owned, lent_price_factor)
    level = greedy_flat(k_, i_, w_, v_, capacity, owned, lent_price_factor)
    return {cand[k].job_id: i for k, i in level.items()}


# Above this many DP cells (items × (capacity + 1)) the knapsack is solved by the greedy on
# convex hulls instead (5,000 jobs on 8,192 GPUs: 41 M cells, ~110 ms of numpy alone); also
# above this many items, whatever the capacity: the DP's numpy calls cost ~6 µs an item even
