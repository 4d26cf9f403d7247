"""The multiple-choice knapsack: each item (a job) takes at most one of its choices (options, or
upgrades over a floor), each of some GPUs and some value, to maximise the value in all within a
GPU capacity.

Solved exactly by dynamic programming over GPU counts (`knapsack_dp`, O(items · choices ·
GPUs) numpy operations). Rubick moves GPUs greedily, one step at a time, from the job whose
throughput falls least to the one that gains most; such a greedy misses the best move when it is
a jump of several GPUs (a job that scales almost linearly), while the DP equals the exhaustive
optimum (tests/core/test_policy.py). Past `DP_CELLS` cells or `DP_ITEMS` items the LP
greedy on each item's convex hull (`knapsack_greedy`) solves it within one item's value of the
optimum in O(n log n).

Some GPUs may be lent (above `owned`): worth less than owned ones by their expected recall
cost. The total used is then

    c* = argmax_c  best(c) − price · max(0, c − owned),   price = factor · best(owned) / owned

best(c): the optimum within c GPUs; best(owned)/owned: what an owned GPU earns on average;
`lent_price_factor`: the risk of a recall times the share of a horizon's work it throws away
(`counts.choose_counts`). As all lent GPUs are alike, this is exact for "value − price · lent
GPUs used".
"""

from __future__ import annotations

from typing import Any

from tidal.core.policy.types import JobView


def rows(lens: Any) -> tuple[Any, Any, Any]:
    """For items of `lens` choices each, flattened in (item, choice) order: each row's item,
    each row's position within its item, and where each item's rows start."""
    import numpy as np

    starts = np.cumsum(lens) - lens
    item = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    return item, np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(starts, lens), starts


# Above this many DP cells (items × (capacity + 1)) the knapsack is solved by the greedy on
# convex hulls instead; also above this many items, whatever the capacity (the DP's numpy calls
# cost a few µs an item even on few GPUs, and the greedy's gap, at most one item's value, is
# then a small share of the total). benchmarks/policy_latency.py measures both.
DP_CELLS = 4_000_000
DP_ITEMS = 1_000

Items = list[tuple[JobView, list[tuple[int, float, int]]]]


def exact(items: int, capacity: int) -> bool:
    """Whether the knapsack over `items` items and `capacity` GPUs is solved by the DP."""
    return items * (capacity + 1) <= DP_CELLS and items <= DP_ITEMS


def knapsack(items: Items, capacity: int, owned: int | None = None,
              lent_price_factor: float = 0.0) -> dict[str, int]:
    """The multiple-choice knapsack: exact (`knapsack_dp`) up to `DP_CELLS` and `DP_ITEMS`, else greedy
    (`knapsack_greedy`, within one item's value of the optimum)."""
    if exact(len(items), capacity):
        return knapsack_dp(items, capacity, owned, lent_price_factor)
    return knapsack_greedy(items, capacity, owned, lent_price_factor)


def upper_hull(choices: list[tuple[int, float, int]],
                capacity: int) -> tuple[list[int], list[float], list[int]]:
    """The upper concave hull in (GPUs, value) of (0, 0) and an item's choices that fit within
    `capacity`, walked in plain Python: its points' GPUs, values and choice positions (-1 for the
    origin). A point on or under the chord of its neighbours is dropped."""
    hw, hu, hc = [0], [0.0], [-1]  # the hull so far: GPUs, value, choice
    # choices come in ascending GPU counts (options are; upgrades keep their order)
    for ci, (w, u, _) in enumerate(choices):
        if u <= hu[-1] or w <= hw[-1] or w > capacity:
            continue  # more GPUs for no more value (or none to take)
        # pop the last hull point while it lies under the chord from the one before it
        while len(hw) >= 2 and (hu[-1] - hu[-2]) * (w - hw[-2]) <= (u - hu[-2]) * (hw[-1] - hw[-2]):
            hw.pop()
            hu.pop()
            hc.pop()
        hw.append(w)
        hu.append(u)
        hc.append(ci)
    return hw, hu, hc


def knapsack_greedy(items: Items, capacity: int, owned: int | None = None,
                     lent_price_factor: float = 0.0) -> dict[str, int]:
    """The multiple-choice knapsack's LP greedy (Sinha & Zoltners, 1979), made integral.

    Each item's choices, with (0 GPUs, 0) for "none", are cut to their upper concave hull in
    (w, u); consecutive hull points give increments of efficiency Δu/Δw, falling along each
    hull. All increments are taken in order of efficiency while they fit; an item whose next
    increment does not fit takes no more (its later ones need it). Without integrality this is
    the LP optimum; integral, it is below the optimum by at most the value of the one split
    increment (tests/core/test_policy.py measures the gap against the DP). O(n log n) for n
    choices in all. Lent GPUs (above `owned`) are taken only by increments whose gain exceeds
    the price of the lent GPUs they add, price per GPU = `lent_price_factor` · (the value
    reached within `owned`) / owned, as in `knapsack_dp`."""
    import numpy as np

    # every choice flattened in (item, choice) order: item, position in the item, GPUs, value
    flat = [choice for _, choices in items for choice in choices]
    if not flat:
        return {}
    lens = np.fromiter((len(choices) for _, choices in items), dtype=np.int64, count=len(items))
    fw, fu, _ = zip(*flat, strict=True)
    k_, c_, _ = rows(lens)
    level = greedy_flat(k_, c_, np.array(fw, dtype=np.int64), np.array(fu, dtype=np.float64),
                         capacity, owned, lent_price_factor)
    return {items[k][0].job_id: items[k][1][ci][2] for k, ci in level.items()}


def greedy_flat(all_k: Any, all_c: Any, all_w: Any, all_u: Any, capacity: int, owned: int | None,
                lent_price_factor: float) -> dict[int, int]:
    """`knapsack_greedy` on choices given as numpy arrays in (item, choice) order: item, a label
    that rises along each item's choices (returned for the choice taken), GPUs, value. Returns
    {item: label} for the items that take a choice."""
    inc = _increments(all_k, all_c, all_w, all_u, capacity)
    if inc is None:
        return {}
    own = capacity if owned is None else min(owned, capacity)
    greedy = _Greedy(*inc, own=own)
    level, value = greedy.fill(own, 0.0)
    if own < capacity:
        per_gpu = value / own if own > 0 else greedy.fill(capacity, 0.0)[1] / capacity
        level, _ = greedy.fill(capacity, lent_price_factor * per_gpu)
    return level


def _increments(all_k: Any, all_c: Any, all_w: Any, all_u: Any,
                capacity: int) -> tuple[Any, Any, Any, Any] | None:
    """Each item's hull increments (item, choice reached, Δw, Δu), steps of an item in choice
    order; None if no choice fits."""
    import numpy as np

    fits = all_w <= capacity
    k_, c_, w_, u_ = (all_k, all_c, all_w, all_u) if fits.all() else (
        all_k[fits], all_c[fits], all_w[fits], all_u[fits])
    if not len(k_):
        return None
    first = np.ones(len(k_), dtype=bool)
    first[1:] = k_[1:] != k_[:-1]
    # each point's predecessor on its item's chain, (0, 0) before an item's first choice
    pw = np.where(first, 0, np.roll(w_, 1))
    pu = np.where(first, 0.0, np.roll(u_, 1))
    # An item's choices are their own upper concave hull (the usual case: throughput rising and
    # concave in GPUs) if each adds GPUs and value and no point lies on or under the chord from
    # the point before it to the point after it: the test the hull walk below makes, on the same
    # floats. Those items' increments are computed at once; the others walk the hull.
    bad = (w_ <= pw) | (u_ <= pu)
    ppw, ppu = pw[:-1], pu[:-1]  # the point before each point with a next one
    under = (u_[:-1] - ppu) * (w_[1:] - ppw) <= (u_[1:] - ppu) * (w_[:-1] - ppw)
    bad[:-1] |= ~first[1:] & under
    simple = np.ones(int(all_k[-1]) + 1, dtype=bool)
    simple[k_[bad]] = False
    keep = simple[k_]
    inc_k = [k_[keep]]
    inc_c = [c_[keep]]
    inc_dw = [(w_ - pw)[keep]]
    inc_du = [(u_ - pu)[keep]]
    for k in np.flatnonzero(~simple).tolist():
        lo, hi = np.searchsorted(all_k, (k, k + 1))  # its choices, those that do not fit too
        labels = all_c[lo:hi].tolist()
        hw, hu, hc = upper_hull(list(zip(all_w[lo:hi].tolist(), all_u[lo:hi].tolist(), labels, strict=True)),
                                capacity)
        n = len(hw) - 1
        inc_k.append(np.full(n, k, dtype=np.int64))
        inc_c.append(np.array([labels[h] for h in hc[1:]], dtype=np.int64))
        inc_dw.append(np.array([hw[s] - hw[s - 1] for s in range(1, n + 1)], dtype=np.int64))
        inc_du.append(np.array([hu[s] - hu[s - 1] for s in range(1, n + 1)], dtype=np.float64))
    return np.concatenate(inc_k), np.concatenate(inc_c), np.concatenate(inc_dw), np.concatenate(inc_du)


class _Greedy:
    """The increments by falling efficiency Δu/Δw (ties in (item, step) order), taken in that
    order while they fit (`fill`)."""

    def __init__(self, ik: Any, ic: Any, dw_: Any, du_: Any, own: int) -> None:
        import numpy as np

        order = np.lexsort((ic, ik, -(du_ / dw_)))
        self.item, self.pick = ik[order].tolist(), ic[order].tolist()
        self.dws, self.dus = dw_[order].tolist(), du_[order].tolist()
        self.csum_w = np.cumsum(dw_[order])
        self.csum_u = np.cumsum(du_[order])  # sequential sums, as `fill` adds
        self.own = own  # owned GPUs: those above are lent

    def fill(self, limit: int, price: float) -> tuple[dict[int, int], float]:
        """The items' choices within `limit` GPUs, an increment that adds lent GPUs taken only if
        its gain exceeds `price` per lent GPU; and their value. An item whose next increment is
        refused takes no more (its later ones need it)."""
        import numpy as np

        item, pick, dws, dus, own = self.item, self.pick, self.dws, self.dus, self.own
        # the leading increments that fit within min(limit, owned GPUs) are all taken (none is
        # refused before them, so no item is closed); the loop goes on from the first that doesn't
        j = int(np.searchsorted(self.csum_w, min(limit, own), side="right"))
        level: dict[int, int] = dict(zip(item[:j], pick[:j], strict=True))
        closed: set[int] = set()
        used, value = (int(self.csum_w[j - 1]), float(self.csum_u[j - 1])) if j else (0, 0.0)
        for x in range(j, len(item)):
            if used >= limit:
                break  # full: nothing more fits
            k = item[x]
            if k in closed:
                continue
            dw = dws[x]
            after = used + dw
            # lent GPUs this increment adds: max(0, after − own) − max(0, used − own)
            lent_added = 0 if after <= own else after - own - (used - own if used > own else 0)
            if after > limit or (lent_added and dus[x] <= price * lent_added):
                closed.add(k)
                continue
            level[k] = pick[x]
            used += dw
            value += dus[x]
        return level, value


def knapsack_dp(items: Items, capacity: int, owned: int | None = None,
                 lent_price_factor: float = 0.0) -> dict[str, int]:
    """Multiple-choice knapsack by dynamic programming over GPU counts.

        best_k(c) = max(best_{k−1}(c), max_i best_{k−1}(c − w_ki) + u_ki)

    for item k with choices i of weight w (GPUs) and value u; 0 ≤ c ≤ capacity. Vectorised over
    c with numpy: O(items · choices · capacity) simple array operations. Returns the option
    index picked for each item that takes one (items that take none are absent). GPUs above
    `owned` are lent: the total used is argmax_c best(c) − price·max(0, c − owned), price =
    `lent_price_factor` · best(owned)/owned (module docstring).
    """
    import numpy as np

    best = np.zeros(capacity + 1)
    back: list[np.ndarray] = []
    for _, choices in items:
        new = best.copy()
        arg = np.full(capacity + 1, -1, dtype=np.int32)
        for k, (w, u, _) in enumerate(choices):
            if w > capacity or u <= 0:
                continue
            cand = best[: capacity + 1 - w] + u if w > 0 else best + u
            target = new[w:] if w > 0 else new
            better = cand > target + 1e-12
            target[better] = cand[better]
            arg[w:][better] = k
        back.append(arg)
        best = new
    picked: dict[str, int] = {}
    own = capacity if owned is None else min(owned, capacity)
    if own < capacity and lent_price_factor > 0:
        price = lent_price_factor * (best[own] / own if own > 0 else float(best.max()) / max(1, capacity))
        c = int(np.argmax(best - price * np.maximum(0, np.arange(capacity + 1) - own)))
    else:
        c = int(np.argmax(best))
    for (job, choices), arg in zip(reversed(items), reversed(back), strict=True):
        k = int(arg[c])
        if k >= 0:
            w, _, idx = choices[k]
            picked[job.job_id] = idx
            c -= w
    return picked

