"""Best plan per resources against brute force, on small seeded random instances."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tests.conftest import tiny_gpt_spec
from tidal.jobs import PlanSpace
from tidal.planner.memory import ModelStats
from tidal.planner.perfmodel import Theta, Workload
from tidal.planner.planner import (
    JobModel,
    NoFeasiblePlan,
    ResourceShape,
    best_plan,
    packed,
    rank_plans,
    require_feasible,
    resource_matrix,
)

GIB = float(2**30)


def _random_instance(rng: random.Random) -> tuple[object, JobModel, ResourceShape]:
    batch = rng.choice([8, 16, 32, 48, 64])
    spec = tiny_gpt_spec(global_batch=batch, max_gpus=8,
                         plans=PlanSpace(offload_param=(False, True)))
    psi = rng.choice([1e8, 1e9, 7e9])
    model = JobModel(
        work=Workload(params=psi, global_batch=batch, seq_hid=1e6),
        theta=Theta(k_fwd=rng.uniform(1e-3, 5e-2), k_fwd0=rng.uniform(0, 2e-2), k_bwd=rng.uniform(1.5, 2.5),
                    gamma=rng.uniform(1, 4), k_opt=rng.uniform(1e-11, 1e-10), k_cpu=rng.uniform(1e-10, 1e-8),
                    k_off=rng.uniform(0, 0.05), k_const=rng.uniform(0, 0.01), eta=rng.uniform(0.1, 0.9),
                    eta_x=rng.uniform(0.01, 0.3)),
        mem=ModelStats(params=int(psi), largest_layer_params=int(psi / 20), n_layer=24,
                       act_bytes_per_sample=rng.uniform(0.1, 4) * GIB, const_bytes=GIB),
    )
    n = rng.choice([d for d in (1, 2, 4, 8) if batch % d == 0])
    shape = packed(n, rng.choice([1, 2, 4, 8]), gpu_mem_bytes=rng.choice([16, 40, 80]) * GIB,
                   host_mem_per_node=rng.choice([64, 512]) * GIB)
    return spec, model, shape


@pytest.mark.parametrize("seed", range(40))
def test_best_plan_equals_brute_force(seed: int) -> None:
    spec, model, shape = _random_instance(random.Random(seed))
    ranked = rank_plans(spec, model, shape)  # type: ignore[arg-type]
    feasible = [c for c in ranked if c.feasible]
    best = best_plan(spec, model, shape)  # type: ignore[arg-type]
    if not feasible:
        assert best is None
        return
    assert best is not None and best.feasible
    assert best.plan == feasible[0].plan
    assert best.samples_per_s == pytest.approx(max(c.samples_per_s for c in feasible))


@pytest.mark.parametrize("seed", range(20))
def test_infeasible_plans_are_never_chosen(seed: int) -> None:
    spec, model, _ = _random_instance(random.Random(100 + seed))
    matrix = resource_matrix(spec, model, gpus_per_node=4, gpu_mem_bytes=24 * GIB)  # type: ignore[arg-type]
    for n, choice in matrix.items():
        assert choice.feasible and choice.peak_gpu_bytes <= 24 * GIB
        assert choice.plan.dp == n


def test_parameter_offload_is_never_free() -> None:
    # ZeRO-3 with its parameters on the host is the same plan plus host fetches: strictly slower
    spec, model, _ = _random_instance(random.Random(7))
    shape = packed(4, 4, gpu_mem_bytes=80 * GIB, host_mem_per_node=512 * GIB)
    ranked = {c.plan: c for c in rank_plans(spec, model, shape)}  # type: ignore[arg-type]
    pairs = [(c, ranked[replace(p, offload_param=False)]) for p, c in ranked.items() if p.offload_param]
    assert pairs
    assert all(off.samples_per_s < on.samples_per_s for off, on in pairs)


def test_a_job_that_fits_nothing_is_rejected_with_the_reason() -> None:
    spec = tiny_gpt_spec(max_gpus=2)
    huge = JobModel(work=Workload(params=70e9, global_batch=8), theta=Theta(),
                    mem=ModelStats(params=int(70e9), largest_layer_params=int(2e9), n_layer=80,
                                   act_bytes_per_sample=8 * GIB))
    shapes = [packed(n, 8, gpu_mem_bytes=80 * GIB, host_mem_per_node=256 * GIB) for n in (1, 2)]
    with pytest.raises(NoFeasiblePlan, match="fits no plan") as e:
        require_feasible(spec, huge, shapes)
    assert "memory" in str(e.value)
    small = JobModel(work=Workload(params=1e6, global_batch=8), theta=Theta(),
                     mem=ModelStats(params=int(1e6), largest_layer_params=int(1e5)))
    require_feasible(spec, small, shapes)  # fits: no error


def test_matrix_throughput_grows_with_gpus_for_a_compute_bound_job() -> None:
    spec = tiny_gpt_spec(global_batch=64, max_gpus=8)
    model = JobModel(work=Workload(params=1e8, global_batch=64),
                     theta=Theta(k_fwd=0.01, k_fwd0=0.001, k_opt=1e-11, eta=0.9, eta_x=0.5),
                     mem=ModelStats(params=int(1e8), largest_layer_params=int(5e6), act_bytes_per_sample=GIB))
    matrix = resource_matrix(spec, model, gpus_per_node=8)
    assert sorted(matrix) == [1, 2, 4, 8]
    rates = [matrix[n].samples_per_s for n in sorted(matrix)]
    assert rates == sorted(rates)


def test_shape_helpers() -> None:
    assert packed(10, 4).gpus_per_node == (4, 4, 2)
    assert ResourceShape(gpus_per_node=(2, 2)).num_gpus == 4


def test_random_instances_exercise_the_memory_limit() -> None:
    """The oracle test above is only meaningful if memory cuts the space part-way."""
    mixed = 0
    for seed in range(40):
        spec, model, shape = _random_instance(random.Random(seed))
        ranked = rank_plans(spec, model, shape)  # type: ignore[arg-type]
        if any(c.feasible for c in ranked) and not all(c.feasible for c in ranked):
            mixed += 1
    assert mixed >= 10
