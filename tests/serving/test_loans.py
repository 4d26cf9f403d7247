"""The loan manager: lending never exceeds what Serve does not need."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tidal.serving.loans import LoanConfig, decide_loan, forecast, lend_by_node


@pytest.mark.parametrize("seed", range(50))
@pytest.mark.parametrize("predictive", [True, False])
def test_lendable_never_exceeds_what_serve_does_not_need(seed: int, predictive: bool) -> None:
    rng = np.random.default_rng(seed)
    cfg = LoanConfig(replica_rps=float(rng.uniform(1, 50)), predictive=predictive)
    pool = int(rng.integers(1, 33))
    rates = list(np.abs(rng.normal(1, 1, size=int(rng.integers(1, 40)))) * cfg.replica_rps * pool / 2)
    d = decide_loan(rates, pool, cfg)
    need_now = max(cfg.min_replicas, math.ceil(rates[-1] / cfg.replica_rps - 1e-9))
    assert 0 <= d.lendable <= max(0, pool - need_now)
    assert d.lendable + d.replicas == pool or d.lendable == 0
    if predictive:  # the forecast never lends more than the current rate would
        assert d.forecast_rps >= rates[-1]


def test_forecast_follows_a_rising_trend() -> None:
    cfg = LoanConfig(replica_rps=10.0, headroom=0.0, window=1)
    rising = [float(r) for r in range(10, 110, 10)]
    assert forecast(rising, cfg) > rising[-1]  # it looks ahead over the reclaim lead time
    assert forecast([50.0] * 10, cfg) == pytest.approx(50.0)


def test_burst_window_keeps_gpus_between_bursts() -> None:
    cfg = LoanConfig(replica_rps=10.0, window=5)
    assert decide_loan([100.0, 10.0, 10.0], 16, cfg).lendable <= 16 - 10  # the burst 2 intervals ago


def test_lend_by_node_keeps_training_holdings_and_caps() -> None:
    pool = {"a": 8, "b": 8, "c": 8}
    out = lend_by_node(pool, 10, {"b": 3})
    assert sum(out.values()) == 10 and out["b"] >= 3 and all(out[n] <= pool[n] for n in pool)
    assert lend_by_node(pool, 2, {"b": 3, "c": 1}) == {"a": 0, "b": 2, "c": 0}
    assert sum(lend_by_node(pool, 99, {}).values()) == 24
