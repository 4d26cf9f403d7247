"""The reclaim choice against brute force on small seeded instances, and its cost rules."""

from __future__ import annotations

import random

import pytest

from tidal.autoscaler.reclaim import Borrower, brute_force, choices, choose_reclaim, evict_newest


def _instance(seed: int) -> tuple[list[Borrower], int]:
    rng = random.Random(seed)
    bs = []
    for k in range(rng.randint(1, 5)):
        gpus = rng.randint(1, 8)
        lent = rng.randint(1, gpus)
        nodes = [f"inf-{i}" for i in range(rng.randint(1, 2))]
        split = [lent] if len(nodes) == 1 else [lent // 2, lent - lent // 2]
        opts = tuple(sorted(rng.sample(range(1, gpus + 1), rng.randint(1, gpus))))
        opts = opts if rng.random() < 0.8 else ()
        bs.append(Borrower(job_id=f"j{k}", gpus=gpus, options=opts,
                           lent_by_node=tuple((n, g) for n, g in zip(nodes, split, strict=True) if g),
                           lost_s=rng.uniform(0, 60), restart_s=rng.uniform(10, 300),
                           queue_s=rng.uniform(0, 100)))
    need = rng.randint(1, sum(b.lent for b in bs))
    return bs, need


@pytest.mark.parametrize("seed", range(200))
def test_equals_brute_force(seed: int) -> None:
    bs, need = _instance(seed)
    picks = choose_reclaim(bs, need)
    assert sum(r.freed for r in picks) >= need
    assert sum(r.cost for r in picks) == pytest.approx(brute_force(bs, need), rel=1e-9, abs=1e-9)
    by_id = {b.job_id: b for b in bs}
    for r in picks:  # what a reclaim names is a real option, and it frees only lent GPUs it holds
        b = by_id[r.job_id]
        assert r.keep_gpus == 0 or r.keep_gpus in b.options
        assert r.keep_gpus < b.gpus and r.freed <= b.lent
        lent = dict(b.lent_by_node)
        assert all(g <= lent[n] for n, g in r.freed_by_node)


def test_shrinking_costs_less_than_evicting() -> None:
    b = Borrower(job_id="a", gpus=8, lent_by_node=(("inf-0", 4),), options=(1, 2, 4, 8),
                 lost_s=5, restart_s=60)
    (r,) = choose_reclaim([b], 2)
    assert r.keep_gpus == 4 and r.freed == 4  # the largest option that frees 2: 4 GPUs
    shrink = next(c for g, _, c in choices(b) if g == 4)
    evict = next(c for g, _, c in choices(b) if g == 0)
    assert shrink < evict


def test_prefers_the_job_whose_restart_costs_least() -> None:
    cheap = Borrower(job_id="cheap", gpus=2, lent_by_node=(("inf-0", 2),), options=(1, 2), restart_s=10)
    dear = Borrower(job_id="dear", gpus=8, lent_by_node=(("inf-1", 2),), options=(4, 6, 8), restart_s=300)
    (r,) = choose_reclaim([cheap, dear], 1)
    assert r.job_id == "cheap" and r.keep_gpus == 1


def test_not_enough_lent_returns_everything() -> None:
    bs = [Borrower(job_id="a", gpus=2, lent_by_node=(("inf-0", 1),), options=(1, 2))]
    (r,) = choose_reclaim(bs, 5)
    assert r.keep_gpus == 0 and r.freed == 1
    assert choose_reclaim(bs, 0) == ()


def test_kueue_baseline_evicts_newest_whole() -> None:
    bs = [Borrower(job_id=j, gpus=4, lent_by_node=(("inf-0", 2),), options=(1, 2, 4)) for j in "abc"]
    picks = evict_newest(bs, 3, {"a": 1.0, "b": 3.0, "c": 2.0})
    assert [r.job_id for r in picks] == ["b", "c"] and all(r.keep_gpus == 0 for r in picks)
