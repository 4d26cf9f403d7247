"""The loan manager: lending never exceeds what Serve does not need, the risk-bounded forecast
keeps its stated miss rate on seeded traffic of every shape, and the oracle never misses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tidal.serving.loans import LoanConfig, decide_loan, forecast, horizon, lend_by_node, replicas_for
from tidal.sim.traffic import SHAPES, shape


@pytest.mark.parametrize("seed", range(50))
@pytest.mark.parametrize("predictive", [True, False])
def test_lendable_never_exceeds_what_serve_does_not_need(seed: int, predictive: bool) -> None:
    rng = np.random.default_rng(seed)
    cfg = LoanConfig(replica_rps=float(rng.uniform(1, 50)), predictive=predictive,
                     risk=float(rng.uniform(0.01, 0.5)))
    pool = int(rng.integers(1, 33))
    rates = list(np.abs(rng.normal(1, 1, size=int(rng.integers(1, 60)))) * cfg.replica_rps * pool / 2)
    d = decide_loan(rates, pool, cfg, min_loan_s=float(rng.uniform(0, 300)))
    need_now = max(cfg.min_replicas, math.ceil(rates[-1] / cfg.replica_rps - 1e-9))
    assert 0 <= d.lendable_new <= d.lendable <= max(0, pool - need_now)
    assert d.lendable + d.replicas == pool or d.lendable == 0
    if predictive:  # the forecast never lends more than the current rate would
        assert d.forecast_rps >= rates[-1]


def test_too_short_a_history_lends_nothing() -> None:
    """Fewer scores than the risk can be stated with: F = ∞, nothing lent (not a guess)."""
    cfg = LoanConfig(replica_rps=10.0, risk=0.1)  # needs 9 scores: H + 9 intervals
    h = horizon(cfg)
    assert math.isinf(forecast([5.0] * (h + 8), cfg))
    assert decide_loan([5.0] * (h + 8), 8, cfg).lendable == 0
    assert forecast([5.0] * (h + 9), cfg) == pytest.approx(5.0)  # steady: no rise to keep for
    assert decide_loan([5.0] * (h + 9), 8, cfg).lendable == 7


def test_the_margin_is_the_traffics_own_rise() -> None:
    """Traffic that rises by 30 req/s within the lead time now and then keeps 30 above its level;
    traffic twice as jumpy keeps twice that: nothing is a constant of one trace."""
    cfg = LoanConfig(replica_rps=10.0, risk=0.1, lead_s=30.0, interval_s=60.0)
    calm = [50.0, 50.0, 80.0, 50.0, 50.0, 50.0] * 10
    jumpy = [50.0, 50.0, 110.0, 50.0, 50.0, 50.0] * 10
    assert forecast(calm, cfg) == pytest.approx(80.0)
    assert forecast(jumpy, cfg) == pytest.approx(110.0)


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("risk", [0.05, 0.1, 0.2])
def test_realised_misses_stay_within_the_risk_target(name: str, risk: float) -> None:
    """On seeded traffic of every synthetic shape, the share of decisions after which the demand
    of the lead time outgrew the replicas kept is at most the risk target (plus the sampling
    slack of ~3 standard errors over these decisions)."""
    cfg = LoanConfig(replica_rps=40.0, risk=risk)
    h = horizon(cfg)
    misses, n = 0, 0
    for seed in range(3):
        rates = list(shape(name, 600, cfg.interval_s, peak_rps=32 * cfg.replica_rps, seed=seed))
        for t in range(h + 20, len(rates) - h):
            kept = decide_loan(rates[max(0, t + 1 - cfg.history):t + 1], 32, cfg).replicas
            misses += replicas_for(max(rates[t + 1:t + h + 1]), cfg) > kept
            n += 1
    slack = 3 * math.sqrt(risk * (1 - risk) / n)
    assert misses / n <= risk + slack, f"{name}: {misses}/{n} decisions missed at a risk of {risk}"


@pytest.mark.parametrize("seed", range(20))
def test_the_oracle_keeps_exactly_the_demand_ahead(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cfg = LoanConfig(replica_rps=10.0)
    ahead = tuple(float(x) for x in rng.uniform(0, 320, size=10))
    d = decide_loan([float(rng.uniform(0, 320))], 32, cfg, min_loan_s=120.0, ahead=ahead)
    assert d.replicas == replicas_for(max(ahead[:horizon(cfg)]), cfg)
    assert 32 - d.lendable_new == max(d.replicas, replicas_for(max(ahead[:horizon(cfg, 120.0)]), cfg))


def test_lend_by_node_keeps_training_holdings_and_caps() -> None:
    pool = {"a": 8, "b": 8, "c": 8}
    out = lend_by_node(pool, 10, {"b": 3})
    assert sum(out.values()) == 10 and out["b"] >= 3 and all(out[n] <= pool[n] for n in pool)
    assert lend_by_node(pool, 2, {"b": 3, "c": 1}) == {"a": 0, "b": 2, "c": 0}
    assert sum(lend_by_node(pool, 99, {}).values()) == 24


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="risk"):
        LoanConfig(replica_rps=1.0, risk=0.0)
    with pytest.raises(ValueError, match="history"):
        LoanConfig(replica_rps=1.0, history=2)
