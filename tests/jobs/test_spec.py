"""Validation of JobSpec / Plan / PlanSpace: each bad input is a SpecError naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from tidal.jobs import JobSpec, Plan, PlanError, PlanSpace, SpecError, plans_for
from tidal.jobs.models import lm_loss


def _model() -> Any:
    import torch

    return torch.nn.Linear(2, 2)


def _spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = dict(name="j", model=_model, dataset=lambda: list(range(10)), loss=lm_loss,
                                global_batch=8, total_steps=10, min_gpus=1, max_gpus=4)
    base.update(kw)
    return JobSpec(**base)


def _field(exc: pytest.ExceptionInfo[SpecError]) -> str:
    return exc.value.field


def test_valid_spec_builds() -> None:
    spec = _spec(plan=Plan(dp=2, zero_stage=2, micro_batch=2, grad_accum=2), requested_gpus=2,
                 guaranteed=True)
    assert spec.dp_degrees() == [1, 2, 4]
    assert spec.plan is not None and spec.plan.global_batch == 8


def test_global_batch_no_plan_can_produce() -> None:
    with pytest.raises(SpecError) as e:
        _spec(global_batch=7, min_gpus=2, max_gpus=4)
    assert _field(e) == "JobSpec.global_batch"
    assert "global_batch=7" in str(e.value)
    with pytest.raises(SpecError) as e:
        _spec(global_batch=8, min_gpus=1, max_gpus=1, plans=PlanSpace(micro_batches=(3, 5)))
    assert _field(e) == "JobSpec.global_batch"


def test_unknown_zero_stage() -> None:
    with pytest.raises(PlanError) as e:
        Plan(dp=1, zero_stage=4)
    assert _field(e) == "Plan.zero_stage"
    assert "unknown ZeRO stage 4" in str(e.value)
    with pytest.raises(SpecError) as e2:
        PlanSpace(zero_stages=(0, 5))
    assert _field(e2) == "PlanSpace.zero_stages"


def test_min_greater_than_max_gpus() -> None:
    with pytest.raises(SpecError) as e:
        _spec(min_gpus=4, max_gpus=2)
    assert _field(e) == "JobSpec.min_gpus"
    assert "min_gpus (4) > max_gpus (2)" in str(e.value)


@pytest.mark.parametrize("name", ["model", "dataset", "loss"])
def test_missing_factory(name: str) -> None:
    with pytest.raises(SpecError) as e:
        _spec(**{name: None})
    assert _field(e) == f"JobSpec.{name}"
    assert "missing factory" in str(e.value)
    with pytest.raises(SpecError) as e:
        _spec(**{name: 42})
    assert "must be callable" in str(e.value)


def test_offload_needs_stage() -> None:
    with pytest.raises(PlanError) as e:
        Plan(dp=1, zero_stage=1, offload_optimizer=True)
    assert _field(e) == "Plan.offload_optimizer"
    with pytest.raises(PlanError) as e:
        Plan(dp=1, zero_stage=2, offload_param=True)
    assert _field(e) == "Plan.offload_param"


@pytest.mark.parametrize("field,value", [("dp", 0), ("micro_batch", -1), ("grad_accum", 1.5)])
def test_plan_integers(field: str, value: Any) -> None:
    kw: dict[str, Any] = dict(dp=1, micro_batch=1, grad_accum=1)
    kw[field] = value
    with pytest.raises(PlanError) as e:
        Plan(**kw)
    assert _field(e) == f"Plan.{field}"


def test_user_plan_must_match_job() -> None:
    with pytest.raises(PlanError) as e:
        _spec(plan=Plan(dp=2, micro_batch=2, grad_accum=1))  # global batch 4, job's is 8
    assert _field(e) == "JobSpec.plan"
    assert "global batch of 4" in str(e.value)
    with pytest.raises(PlanError) as e:
        _spec(plan=Plan(dp=8, micro_batch=1), max_gpus=4)
    assert "outside [min_gpus, max_gpus]" in str(e.value)
    with pytest.raises(PlanError) as e:
        _spec(plan=Plan(dp=1, zero_stage=3, micro_batch=8), plans=PlanSpace(zero_stages=(0, 1)))
    assert "ZeRO stage 3 not in allowed" in str(e.value)


def test_guarantee_needs_plan_and_request() -> None:
    with pytest.raises(SpecError) as e:
        _spec(guaranteed=True)
    assert _field(e) == "JobSpec.guaranteed"


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"name": "has space"}, "JobSpec.name"),
        ({"total_steps": 0}, "JobSpec.total_steps"),
        ({"report_every": 0}, "JobSpec.report_every"),
        ({"keep_checkpoints": 0}, "JobSpec.keep_checkpoints"),
        ({"keep_checkpoints": 1.5}, "JobSpec.keep_checkpoints"),
        ({"resume_from": ""}, "JobSpec.resume_from"),
        ({"resume_from": 40}, "JobSpec.resume_from"),
        ({"lr": -1.0}, "JobSpec.lr"),
        ({"precision": "fp8"}, "JobSpec.precision"),
        ({"requested_gpus": 9}, "JobSpec.requested_gpus"),
        ({"min_gpus": 100, "max_gpus": 100}, "JobSpec.min_gpus"),  # not the global batch's fault
    ],
)
def test_other_fields(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as e:
        _spec(**kw)
    assert _field(e) == field


def test_tensor_parallel_plan_is_not_runnable() -> None:
    spec = _spec()
    plan = Plan(dp=1, tp=2, micro_batch=8)
    assert not plan.runnable
    assert "tensor/pipeline" in (spec.plan_error(plan) or "")


def test_plans_for_enumerates_allowed_space() -> None:
    spec = _spec(plans=PlanSpace(zero_stages=(1, 2), activation_checkpointing=(False,),
                                 offload_param=(False,)))
    plans = plans_for(spec, 2)
    # per-worker batch 4 → micro-batches 1, 2, 4; stage 1: no offload; stage 2: with/without
    assert len(plans) == 3 * (1 + 2)
    assert all(p.global_batch == 8 and p.dp == 2 for p in plans)
    assert all(spec.plan_error(p) is None for p in plans)
    assert plans_for(spec, 3) == []


def test_plan_round_trip_and_label() -> None:
    p = Plan(dp=2, zero_stage=2, offload_optimizer=True, activation_checkpointing=True,
             micro_batch=4, grad_accum=2)
    assert Plan.from_dict(p.to_dict()) == p
    assert p.short() == "dp2-z2o-ac-mb4x2"


def test_spec_errors_survive_pickling() -> None:
    # Ray hands an actor's exception to its caller by pickle (a rejected `submit`)
    import pickle

    from tidal.planner.planner import NoFeasiblePlan

    for cls in (SpecError, PlanError, NoFeasiblePlan):
        e = pickle.loads(pickle.dumps(cls("JobSpec.min_gpus", "needs 8 GPUs, the cluster has 4")))
        assert type(e) is cls and e.field == "JobSpec.min_gpus"
        assert str(e) == "JobSpec.min_gpus: needs 8 GPUs, the cluster has 4"
