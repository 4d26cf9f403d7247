"""The planner's entry (`tidal.planner.jobplan`) without a cluster: the GPU counts a job may
run on, the cheap checks before any model is built, the plans it profiles and which of them are
still to measure. `plan_job` itself profiles on real engines: tests/planner/test_profiler.py and
the admission tests run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tiny_gpt_spec
from tidal.jobs.spec import SpecError
from tidal.planner.jobplan import Cluster, ProfileConfig, check_fits, gpu_counts, profile_plans, to_measure
from tidal.planner.profiler import _cache_paths


def test_gpu_counts_divide_the_batch_within_the_jobs_range_and_the_cluster() -> None:
    spec = tiny_gpt_spec(global_batch=12, min_gpus=2, max_gpus=8)
    assert gpu_counts(spec, Cluster(node_gpus=(4, 4))) == [2, 3, 4, 6]  # 5, 7 and 8 do not divide 12
    assert gpu_counts(spec, Cluster(node_gpus=(2, 1))) == [2, 3]  # no more than the cluster has
    small = tiny_gpt_spec(global_batch=8, min_gpus=1, max_gpus=4)
    assert gpu_counts(small, Cluster(node_gpus=(2,))) == [1, 2]


@pytest.mark.parametrize(("spec", "cluster", "says"), [
    (tiny_gpt_spec(), Cluster(node_gpus=()), r"^cluster: the Ray cluster has no node with GPUs$"),
    (tiny_gpt_spec(global_batch=8, min_gpus=4, max_gpus=4), Cluster(node_gpus=(2, 1)),
     r"^JobSpec.min_gpus: needs 4 GPUs, the cluster has 3$"),
    (tiny_gpt_spec(global_batch=9, min_gpus=2, max_gpus=3), Cluster(node_gpus=(1, 1)),  # 3 would do
     r"^JobSpec.global_batch: no GPU count in \[2, 2\] divides the global batch 9 "
     r"with a plan the job allows$"),
])
def test_a_job_that_can_never_run_here_is_refused_before_any_model_is_built(
        spec: object, cluster: Cluster, says: str) -> None:
    with pytest.raises(SpecError, match=says):
        check_fits(spec, cluster)  # type: ignore[arg-type]
    check_fits(tiny_gpt_spec(global_batch=8, min_gpus=1, max_gpus=4), Cluster(node_gpus=(2, 1)))


def test_what_is_left_to_measure_is_every_profile_named_by_its_cache_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an empty cache every plan `plan_job` would profile is to measure, each with the name
    of the entry `profile` will write (admission's SHARING stage compares jobs by these); a plan
    whose entry exists is not."""
    monkeypatch.setenv("TIDAL_PROFILE_CACHE", str(tmp_path))
    spec, cluster, cfg = tiny_gpt_spec(max_gpus=2), Cluster(node_gpus=(2,)), ProfileConfig(samples=3)
    plans = profile_plans(spec, cluster, cfg)
    todo = to_measure(spec, cluster, cfg)
    assert [p for p, _ in todo] == plans and len(plans) == 3
    assert [k for _, k in todo] == [path.name for path in _cache_paths(spec, plans, "cpu", cfg.steps, None)]
    assert len({k for _, k in todo}) == 3
    (tmp_path / todo[1][1]).write_text("{}")  # an entry there: that plan is measured
    assert to_measure(spec, cluster, cfg) == [todo[0], todo[2]]


def test_a_job_wider_than_max_profile_gpus_is_profiled_on_its_minimum() -> None:
    """Profiles run on at most `max_profile_gpus` (2) GPUs, but never on fewer than the job's
    `min_gpus`: a 4-GPU-minimum job used to get no plan to profile and be rejected."""
    spec = tiny_gpt_spec(min_gpus=4, max_gpus=4)
    plans = profile_plans(spec, Cluster(node_gpus=(2, 2, 2)), ProfileConfig(samples=2))
    assert plans and all(p.dp * p.tp * p.pp == 4 for p in plans), plans
    small = profile_plans(tiny_gpt_spec(min_gpus=1, max_gpus=4), Cluster(node_gpus=(2, 2, 2)),
                          ProfileConfig(samples=4))
    assert max(p.dp * p.tp * p.pp for p in small) <= 2  # the cap still holds above the minimum


@pytest.mark.parametrize(("field", "value"), [("samples", 0), ("samples", 9), ("steps", 0), ("steps", 1.5),
                                              ("max_profile_gpus", 0), ("gpus_per_worker", -1.0),
                                              ("cpus_per_gpu", float("nan"))])
def test_profile_config_refuses_what_would_fail_in_the_workers(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^ProfileConfig\.{field} must be .*, got {value!r}$"):
        ProfileConfig(**{field: value})  # type: ignore[arg-type]
    ProfileConfig(samples=8, steps=1, max_profile_gpus=None, gpus_per_worker=0.0)  # the edges are fine
