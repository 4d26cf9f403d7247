"""A Hugging Face causal LM through Tidal (`examples/hf_job.py`: a Llama built from its config,
random weights, nothing downloaded), on the session's real two-node Ray cluster.

Through the scheduler: admitted (dry run, profiles of its plans, the performance and memory
models), run, SUCCEEDED. Through the runner that the scheduler's runs use: plan changes (ZeRO
0 → 3 → 2 with CPU Adam, activation checkpointing on and off through the model's own
`activation_checkpointing_enable`) and worker-count changes (2 → 1 → 2) reproduce an
uninterrupted run's loss curve, and the checkpoints carry the model's Hugging Face config.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import ray

from tests.platform.conftest import wait
from tidal.jobs import Plan
from tidal.jobs.checkpoint import read_meta
from tidal.jobs.runner import Resources, run
from tidal.platform import sdk
from tidal.platform.store import Store

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_job.py"


def hf_job() -> Any:
    """The example's module, imported as `tidal submit` would (its directory on sys.path)."""
    if "hf_job" not in sys.modules:
        spec = importlib.util.spec_from_file_location("hf_job", EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["hf_job"] = module
        spec.loader.exec_module(module)
    return sys.modules["hf_job"]


def test_a_hugging_face_model_keeps_its_loss_curve_across_plans_and_worker_counts(ray_cluster: Any) -> None:
    # without the scheduler (`tidal.run`), as `ray.init` users ship code: the job's directory
    spec = hf_job().make_spec(name="hf-reconfig", total_steps=15, lr=3e-3, checkpoint_every=100,
                              runtime_env={"working_dir": str(EXAMPLE.parent)})
    whole = run(spec, Plan(dp=2, zero_stage=1, micro_batch=8, grad_accum=2),
                Resources(num_workers=2, gpus_per_worker=1))
    assert whole.finished and len(whole.losses) == 15
    segments = [
        (Plan(dp=2, zero_stage=0, micro_batch=16, activation_checkpointing=True), 5),
        (Plan(dp=1, zero_stage=3, micro_batch=8, grad_accum=4, activation_checkpointing=True), 10),
        (Plan(dp=2, zero_stage=2, offload_optimizer=True, micro_batch=4, grad_accum=4), None),
    ]
    losses: list[float] = []
    ckpt = None
    for plan, stop in segments:
        r = run(spec, plan, Resources(num_workers=plan.dp, gpus_per_worker=1), ckpt, stop_at_step=stop)
        assert all(m["plan"] == plan.short() for m in r.history)
        losses += r.losses
        ckpt = r.checkpoint
        assert ckpt is not None
        meta = read_meta(ckpt)
        assert meta["step"] == r.final_step and meta["plan"] == plan.to_dict()
        # what serves it rebuilds the model from this (`AutoConfig.for_model`)
        assert meta["model"]["model_type"] == "llama" and meta["model"]["hidden_size"] == 128
    assert r.finished and len(losses) == 15
    rel = [abs(a - b) / abs(a) for a, b in zip(whole.losses, losses, strict=True)]
    print(f"\nHugging Face Llama, 15 steps over 3 plans: max relative loss difference {max(rel):.2e}")
    assert max(rel) <= 1e-3, f"max relative difference {max(rel):.2e} at step {rel.index(max(rel))}"
    assert sum(losses[-3:]) / 3 < losses[0] - 0.3  # and it learned something


def test_a_hugging_face_model_is_admitted_planned_and_run_by_the_scheduler(scheduler: Any,
                                                                        tmp_path: Path) -> None:
    spec = hf_job().make_spec(name="hf-sched", total_steps=20, max_gpus=2, lr=3e-3, checkpoint_every=10,
                              runtime_env={"working_dir": str(EXAMPLE.parent)})  # as `tidal submit` sets it
    job = sdk.submit(spec)
    wait(lambda: job.status()["state"] != "PROFILING", "the Hugging Face job's admission", 300)
    record = Store(tmp_path / "tidal.sqlite").get(job.job_id)
    # its resource matrix: the fastest plan the performance model finds on 1 and 2 GPUs among
    # those the memory model lets fit
    assert sorted(o.gpus for o in record.options) == [1, 2], record.options
    assert all(o.samples_per_s > 0 and o.plan.dp == o.gpus for o in record.options), record.options
    final = job.wait(timeout=400, poll_s=2)
    assert final["state"] == "SUCCEEDED", final
    curve = job.logs()
    assert [m["step"] for m in curve] == list(range(1, 21)), [m["step"] for m in curve]
    assert read_meta(final["checkpoint"])["model"]["model_type"] == "llama"
    events = ray.get(scheduler.job_events.remote(job.job_id))
    assert [e["to"] for e in events][:2] == ["PROFILING", "QUEUED"], events
