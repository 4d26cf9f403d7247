"""Online correction of predicted throughput by measured throughput (pure)."""

from __future__ import annotations

import math

import pytest

from tests.core.test_policy import _job
from tidal.core.correction import Correction, CorrectionConfig, corrected, observe
from tidal.core.policy import Node, Option, Snapshot, decide
from tidal.jobs.spec import Plan


def test_the_ratio_converges_to_measured_over_predicted() -> None:
    c = Correction()
    for _ in range(60):  # 60 × 30 s = 15 half-lives of 120 s
        c = observe(c, gpus=1, predicted=300.0, measured=100.0, dt=30.0)
    assert c.ratio(1) == pytest.approx(1 / 3, rel=1e-3) and c.seconds == pytest.approx(1800.0)
    half = observe(Correction(), gpus=1, predicted=300.0, measured=100.0, dt=120.0)  # one half-life
    assert math.log(half.ratio(1)) == pytest.approx(0.5 * math.log(1 / 3))


def test_over_and_under_estimates_weigh_alike() -> None:
    up = observe(Correction(), gpus=1, predicted=100.0, measured=300.0, dt=60.0)
    down = observe(Correction(), gpus=1, predicted=300.0, measured=100.0, dt=60.0)
    assert up.ratio(1) * down.ratio(1) == pytest.approx(1.0)


@pytest.mark.parametrize("predicted, measured, dt", [
    (0.0, 100.0, 10.0), (100.0, 0.0, 10.0), (100.0, float("nan"), 10.0), (100.0, 50.0, -1.0)])
def test_broken_measurements_change_nothing(predicted: float, measured: float, dt: float) -> None:
    c = Correction(ratios=((2, 0.7),), seconds=5.0)
    assert observe(c, gpus=2, predicted=predicted, measured=measured, dt=dt) == c
    assert observe(c, gpus=0, predicted=100.0, measured=50.0, dt=10.0) == c


def test_a_wild_measurement_is_clipped() -> None:
    c = observe(Correction(), gpus=1, predicted=1.0, measured=1e6, dt=1e6,
                cfg=CorrectionConfig(bounds=(0.1, 10.0)))
    assert c.ratio(1) == pytest.approx(10.0)


def test_options_and_guarantee_scale_together() -> None:
    job = _job("a", 0, [1, 2], [100.0, 180.0], guarantee=90.0)
    assert corrected(job, Correction()) is job
    c = corrected(job, Correction(ratios=((1, 0.5),)))
    assert [o.samples_per_s for o in c.options] == [50.0, 90.0] and c.guarantee == 45.0
    assert [o.plan for o in c.options] == [o.plan for o in job.options]


def test_a_job_the_model_flatters_loses_its_priority() -> None:
    """One GPU, two waiting jobs with equal work: the model says A is twice as fast as B; A's
    runs measured a third of its prediction. Corrected, B (truly faster) runs first."""
    a = _job("A", 0, [1], [300.0], remaining_samples=2e4, restart_cost_s=10)
    b = _job("B", 0, [1], [150.0], remaining_samples=2e4, restart_cost_s=10)
    node = (Node(node_id="n", gpus=1),)
    assert set(decide(Snapshot(nodes=node, jobs=(a, b))).allocations) == {"A"}
    fixed = corrected(a, Correction(ratios=((1, 1 / 3),)))
    assert set(decide(Snapshot(nodes=node, jobs=(fixed, b))).allocations) == {"B"}


def _measured(*runs: tuple[int, float, float]) -> Correction:
    """A correction after long runs (gpus, predicted, measured), in order: 20 half-lives each."""
    c = Correction()
    for gpus, predicted, measured in runs:
        c = observe(c, gpus=gpus, predicted=predicted, measured=measured, dt=20 * 120.0)
    return c


def test_a_ratio_per_gpu_count_learns_the_curves_shape() -> None:
    """The model says 2 GPUs give 0.8 samples/s and 4 give 1.5; runs measure 1.45 on both (as
    LLaMA-30B's 24 and 32 GPUs under the simulator's flat truth). One ratio a job could not
    tell: measured on both counts, both options read 1.45."""
    job = _job("L", 0, [2, 4, 8], [0.8, 1.5, 1.8])
    c = _measured((2, 0.8, 1.45), (4, 1.5, 1.45))
    assert [n for n, _ in c.ratios] == [2, 4]
    fixed = corrected(job, c)
    assert [o.samples_per_s for o in fixed.options[:2]] == pytest.approx([1.45, 1.45], rel=1e-4)
    # above the largest measured count: 32's slowdown (1.45 / 1.5) is carried up
    assert fixed.options[2].samples_per_s == pytest.approx(1.8 * 1.45 / 1.5, rel=1e-4)


def test_between_measured_counts_the_ratio_is_log_linear_and_below_them_the_smallest_ones() -> None:
    c = Correction(ratios=((2, 0.5), (8, 2.0)))
    assert c.ratio(4) == pytest.approx(1.0)  # halfway in log n: the geometric mean
    assert c.ratio(1) == 0.5 and c.ratio(2) == 0.5 and c.ratio(8) == 2.0
    assert Correction().ratio(7) == 1.0


def test_a_speed_up_is_not_carried_to_more_gpus_than_measured_a_slowdown_is() -> None:
    fast = Correction(ratios=((4, 1.8),))
    assert fast.ratio(2) == 1.8 and fast.ratio(4) == 1.8 and fast.ratio(16) == 1.0
    slow = Correction(ratios=((4, 0.3),))
    assert slow.ratio(2) == slow.ratio(16) == 0.3


def test_a_new_count_starts_from_what_the_others_said() -> None:
    c = Correction(ratios=((1, 0.25),))
    d = observe(c, gpus=4, predicted=100.0, measured=25.0, dt=1e-9)  # barely measured: the prior
    assert d.ratio(4) == pytest.approx(0.25) and [n for n, _ in d.ratios] == [1, 4]


def test_the_guarantee_takes_the_ratio_of_the_requested_count() -> None:
    req = Option(gpus=4, plan=Plan(dp=4, micro_batch=2), samples_per_s=100.0)
    job = _job("G", 0, [2, 4, 8], [60.0, 110.0, 180.0], guarantee=100.0, requested=req)
    fixed = corrected(job, Correction(ratios=((2, 1.0), (8, 0.5))))
    r4 = math.sqrt(0.5)  # halfway between 2 and 8 in log n
    assert fixed.guarantee == pytest.approx(100.0 * r4)
    assert fixed.requested is not None and fixed.requested.samples_per_s == pytest.approx(100.0 * r4)
    assert [o.samples_per_s for o in fixed.options] == pytest.approx([60.0, 110.0 * r4, 90.0])


@pytest.mark.parametrize("kw", [{"half_life_s": 0.0}, {"half_life_s": float("inf")},
                                {"bounds": (0.0, 20.0)}, {"bounds": (2.0, 20.0)}, {"bounds": (0.05, 0.5)}])
def test_bad_correction_config_fails_in_one_line(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"^CorrectionConfig\.(half_life_s|bounds) must") as e:
        CorrectionConfig(**kw)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)
