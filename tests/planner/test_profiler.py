"""The profiler on a real local Ray cluster: real DeepSpeed engines, fresh processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_gpt_spec
from tidal.jobs import Plan
from tidal.planner.fitting import fit_job, sample_plans
from tidal.planner.planner import packed, rank_plans
from tidal.planner.profiler import profile, unschedulable

pytestmark = pytest.mark.integration


def test_profile_fit_and_rank(ray_cluster: Any, tmp_path: Path) -> None:
    spec = tiny_gpt_spec(global_batch=16, max_gpus=2)
    plans = [Plan(dp=1, zero_stage=0, micro_batch=16), Plan(dp=1, zero_stage=3, micro_batch=4, grad_accum=4),
             Plan(dp=1, zero_stage=2, offload_optimizer=True, activation_checkpointing=True, micro_batch=8,
                  grad_accum=2)]
    records = profile(spec, plans, cache=tmp_path, progress=False)
    assert [r.plan for r in records] == plans
    for r in records:
        assert r.status == "ok", r.status
        assert 0 < r.fwd_s < r.iter_s and r.bwd_s > 0 and r.opt_s > 0
        assert r.fwd_s + r.bwd_s + r.opt_s <= r.iter_s * 1.01
        assert r.peak_bytes > 0
        assert 0 < r.ckpt_ratio < 1  # counted from the model's forward (checkpointing or not)
    assert len({r.ckpt_ratio for r in records}) == 1  # a property of the model, not of the plan
    again = profile(spec, plans, cache=tmp_path, progress=False)  # served from the cache
    assert again == records
    fitted = fit_job(spec, records, gpus_per_node=2)
    assert fitted.perf.mape < 0.5
    ranked = rank_plans(spec, fitted.model, packed(1, 2))
    assert ranked and all(c.plan.dp == 1 for c in ranked)
    assert ranked[0].samples_per_s >= ranked[-1].samples_per_s


def test_a_sweeps_jobs_share_their_profiles_and_other_workloads_do_not(tmp_path: Path) -> None:
    """No cluster: the cache key is the workload (model, sample shapes, loss, batch, precision),
    not the job's name, LR, seed or GPU range."""
    import dataclasses
    from functools import partial

    from tidal.jobs.data import shakespeare_train
    from tidal.planner.profiler import _cache_paths

    plans = [Plan(dp=1, micro_batch=8), Plan(dp=2, zero_stage=2, micro_batch=4)]
    base = tiny_gpt_spec()

    def key(spec: Any) -> list[Path]:
        return _cache_paths(spec, plans, "cpu", 3, tmp_path)

    assert len(set(key(base))) == 2  # one per plan
    for same in (dataclasses.replace(base, name="sweep-7", lr=1e-2, seed=3),
                 dataclasses.replace(base, total_steps=999, max_gpus=4, checkpoint_every=7)):
        assert key(same) == key(base)
    others = [tiny_gpt_spec(d_model=128), tiny_gpt_spec(global_batch=16),
              dataclasses.replace(base, precision="bf16"),
              dataclasses.replace(base, dataset=partial(shakespeare_train, 16)),  # short samples
              dataclasses.replace(base, loss=lambda model, batch: base.loss(model, batch))]
    assert key(base) == key(base) and len({key(o)[0] for o in [base, *others]}) == 1 + len(others)
    assert key(base)[0] != _cache_paths(base, plans, "cuda:NVIDIA H100", 3, tmp_path)[0]
    empty = dataclasses.replace(base, dataset=list)  # its profiles fail, saying why; its key is a key
    assert len(key(empty)) == 2 and key(empty) != key(base)
    # the same class, config and shapes running other code: a forward patched on the class or
    # on an instance measures apart (flash attention patched in, say)
    from tidal.jobs.models import Block

    def patched(self: Any, x: Any) -> Any:
        return x + self.fc_out(self.fc(self.ln2(x)))  # no attention

    def patched_model() -> Any:
        model = base.model()
        model.blocks[0].forward = patched.__get__(model.blocks[0])
        return model

    on_instance = key(dataclasses.replace(base, model=patched_model))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Block, "forward", patched)
        on_class = key(base)
    assert len({on_instance[0], on_class[0], key(base)[0]}) == 3 and key(base) == key(base)


def test_a_job_files_model_code_is_keyed_by_its_bytecode(tmp_path: Path) -> None:
    """A job file's classes reach the admission task pickled by value, with no source to read:
    their bytecode keys them, the same in every process, other code apart."""
    import runpy

    from ray import cloudpickle

    from tidal.planner.profiler import code_digest

    def model_of(scale: str) -> Any:
        f = tmp_path / f"job{scale}.py"
        f.write_text("from torch import nn\n\nclass Mine(nn.Module):\n    def __init__(self):\n"
                     "        super().__init__()\n        self.lin = nn.Linear(4, 4)\n\n"
                     f"    def forward(self, x):\n        return self.lin(x) * {scale}\n")
        cls = runpy.run_path(str(f), run_name="tidal_job")["Mine"]
        return cloudpickle.loads(cloudpickle.dumps(cls))()  # as the task unpickles it

    def loss(model: Any, batch: Any) -> Any:
        return model(batch).sum()

    assert code_digest(model_of("2"), loss) == code_digest(model_of("2"), loss)
    assert code_digest(model_of("2"), loss) != code_digest(model_of("3"), loss)


def test_sample_plans_cover_families_within_budget() -> None:
    spec = tiny_gpt_spec(global_batch=16, max_gpus=2)
    plans = sample_plans(spec, 2, 6, gpus_per_node=2)
    assert len(plans) == 6
    # 12 families (stage × offload × checkpointing) exceed the budget: the plainest one at its
    # fewest and most accumulation steps (the compute curve), then four other families
    fams = [(p.zero_stage, p.offload_optimizer, p.activation_checkpointing) for p in plans]
    assert len(set(fams)) == 5
    pair = [p for p, f in zip(plans, fams, strict=True) if fams.count(f) == 2]
    assert pair[0].zero_stage == 0 and not pair[0].activation_checkpointing
    # on the most GPUs: the whole batch per GPU (a micro-batch of 8, not 16) and 8 micro-steps
    assert pair[0].dp == pair[1].dp == 2
    assert (pair[0].micro_batch, pair[0].grad_accum) == (8, 1)
    assert (pair[1].micro_batch, pair[1].grad_accum) == (1, 8)
    assert any(p.offload_optimizer for p in plans) and any(p.zero_stage == 3 for p in plans)
    assert {p.dp for p in plans} == {1, 2}


def test_a_profile_the_cluster_can_never_hold_is_named_before_it_waits() -> None:
    plans = [Plan(dp=1, micro_batch=16), Plan(dp=4, micro_batch=4)]
    why = unschedulable(plans, {"CPU": 2.0, "GPU": 4.0})
    assert why is not None and why.startswith("profiling a 4-worker plan needs 4 CPUs (has 2):")
    assert unschedulable(plans, {"CPU": 4.0, "GPU": 4.0}) is None
    assert "2 GPUs (has 1)" in str(unschedulable(plans, {"CPU": 8.0, "GPU": 1.0}, gpus_per_worker=0.5))
    assert unschedulable(plans, {"CPU": 8.0}, gpus_per_worker=0.0) is None  # profiles on CPUs


def test_measure_plans_writes_the_table_labels_capacity_and_resumes(ray_cluster: Any, tmp_path: Path) -> None:
    """benchmarks/measure_plans.py (the tool the GPU tables come from; a device session has one
    try) on the CPU: the columns perfmodel_accuracy reads, a row above --device-mem-mib labelled
    `oom` with its times kept, and --resume measuring only the plans the table lacks. It joins the
    session's cluster (RAY_ADDRESS): a second local cluster started beside it took over Ray's
    address file, and the next module's scheduler tests failed in CI."""
    import csv
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "table.csv"
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.address}

    def run(plans: str, *extra: str) -> str:
        cmd = [sys.executable, "benchmarks/measure_plans.py", "--models", "tinygpt", "--seq", "32",
               "--global-batch", "8", "--plans", plans, "--out", str(out), *extra]
        return subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, text=True,
                              timeout=600).stdout

    said = run("1@8,2o@4", "--device-mem-mib", "0.001")  # any real peak is above 1 KiB
    assert "measured 2 rows, kept 0" in said, said
    header = out.read_text().splitlines()[0].split(",")
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert header[:11] == ["model", "params", "zero_stage", "offload", "act_ckpt", "micro_batch", "seq",
                           "step_s", "tokens_per_s", "peak_alloc_gib", "status"]
    assert [(r["zero_stage"], r["offload"], r["micro_batch"]) for r in rows] == [("1", "none", "8"),
                                                                               ("2", "cpu", "4")]
    for r in rows:
        assert r["status"] == "oom", r  # labelled at the virtual capacity ...
        assert float(r["step_s"]) > 0 and float(r["fwd_s"]) > 0 and float(r["peak_alloc_gib"]) > 0  # kept
        assert float(r["tokens_per_s"]) == pytest.approx(8 * 32 / float(r["step_s"]), rel=1e-3)
    said = run("0@8,1@8,2o@4", "--resume")
    assert "measured 1 rows, kept 2" in said, said
    with out.open() as f:
        again = list(csv.DictReader(f))
    # written back in the order of --plans; the new row, under no capacity, is ok
    assert [(r["zero_stage"], r["status"]) for r in again] == [("0", "ok"), ("1", "oom"), ("2", "oom")]


def test_measure_plans_cuda_without_a_gpu_is_refused_before_ray() -> None:
    """--cuda on a machine without CUDA was a hang (Ray kept the profile pending); now one line,
    before any cluster starts (CUDA hidden, so that a GPU machine checks the same)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "benchmarks/measure_plans.py", "--cuda", "--models", "tinygpt", "--seq", "32",
           "--global-batch", "8", "--plans", "1@8", "--out", "/dev/null"]
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "measure_plans: --cuda, but this machine has no CUDA device (set RAY_ADDRESS to profile on a "
        "cluster whose nodes have one)"), done.stderr
    assert "Started a local Ray instance" not in done.stderr
