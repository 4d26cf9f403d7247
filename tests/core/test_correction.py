"""Online correction of predicted throughput by measured throughput (pure)."""

from __future__ import annotations

import math

import pytest

from tests.core.test_policy import _job
from tidal.core.correction import Correction, CorrectionConfig, corrected, observe
from tidal.core.policy import Node, Snapshot, decide


def test_the_ratio_converges_to_measured_over_predicted() -> None:
    c = Correction()
    for _ in range(60):  # 60 × 30 s = 15 half-lives of 120 s
        c = observe(c, predicted=300.0, measured=100.0, dt=30.0)
    assert c.ratio == pytest.approx(1 / 3, rel=1e-3) and c.seconds == pytest.approx(1800.0)
    half = observe(Correction(), predicted=300.0, measured=100.0, dt=120.0)  # one half-life
    assert math.log(half.ratio) == pytest.approx(0.5 * math.log(1 / 3))


def test_over_and_under_estimates_weigh_alike() -> None:
    up = observe(Correction(), predicted=100.0, measured=300.0, dt=60.0)
    down = observe(Correction(), predicted=300.0, measured=100.0, dt=60.0)
    assert up.ratio * down.ratio == pytest.approx(1.0)


@pytest.mark.parametrize("predicted, measured, dt", [
    (0.0, 100.0, 10.0), (100.0, 0.0, 10.0), (100.0, float("nan"), 10.0), (100.0, 50.0, -1.0)])
def test_broken_measurements_change_nothing(predicted: float, measured: float, dt: float) -> None:
    c = Correction(ratio=0.7, seconds=5.0)
    assert observe(c, predicted=predicted, measured=measured, dt=dt) == c


def test_a_wild_measurement_is_clipped() -> None:
    c = observe(Correction(), predicted=1.0, measured=1e6, dt=1e6, cfg=CorrectionConfig(bounds=(0.1, 10.0)))
    assert c.ratio == pytest.approx(10.0)


def test_options_and_guarantee_scale_together() -> None:
    job = _job("a", 0, [1, 2], [100.0, 180.0], guarantee=90.0)
    assert corrected(job, Correction()) is job
    c = corrected(job, Correction(ratio=0.5))
    assert [o.samples_per_s for o in c.options] == [50.0, 90.0] and c.guarantee == 45.0
    assert [o.plan for o in c.options] == [o.plan for o in job.options]


def test_a_job_the_model_flatters_loses_its_priority() -> None:
    """One GPU, two waiting jobs with equal work: the model says A is twice as fast as B; A's
    runs measured a third of its prediction. Corrected, B (truly faster) runs first."""
    a = _job("A", 0, [1], [300.0], remaining_samples=2e4, restart_cost_s=10)
    b = _job("B", 0, [1], [150.0], remaining_samples=2e4, restart_cost_s=10)
    node = (Node(node_id="n", gpus=1),)
    assert set(decide(Snapshot(nodes=node, jobs=(a, b))).allocations) == {"A"}
    fixed = corrected(a, Correction(ratio=1 / 3))
    assert set(decide(Snapshot(nodes=node, jobs=(fixed, b))).allocations) == {"B"}
