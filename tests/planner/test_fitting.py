"""From profile records to a job model (`tidal.planner.fitting.fit_job`), without a cluster."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_gpt_spec
from tidal.jobs import Plan
from tidal.planner.fitting import fit_job
from tidal.planner.profiler import ProfileRecord


def _records(device: str, ratio: float) -> list[ProfileRecord]:
    """Three profiles, four memory unknowns: the fit must tie checkpointed to plain activations."""
    plans = [Plan(dp=1, zero_stage=0, micro_batch=2, grad_accum=4),
             Plan(dp=1, zero_stage=0, micro_batch=8, activation_checkpointing=True),
             Plan(dp=1, zero_stage=1, micro_batch=4, grad_accum=2, activation_checkpointing=True)]
    return [ProfileRecord(plan=p, status="ok", fwd_s=0.01 * p.grad_accum, bwd_s=0.02 * p.grad_accum,
                          opt_s=0.005, iter_s=0.04 * p.grad_accum, peak_bytes=5e7 + 1e6 * p.micro_batch,
                          device=device, ckpt_ratio=ratio) for p in plans]


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_counted_ratio_ties_gpu_profiles_only(device: str) -> None:
    spec = tiny_gpt_spec(global_batch=8)
    fitted = fit_job(spec, _records(device, 0.7), gpus_per_node=1)
    inv_l = 1 / 2  # tiny_gpt_spec: 2 blocks
    keep = fitted.model.mem.ckpt_keep
    # GPU: the allocator's peak follows live tensors, the counted ratio ties them; CPU: the
    # resident set does not, the textbook 2/L (keep = 1/L) does
    assert keep == pytest.approx(0.7 - inv_l if device == "cuda" else inv_l)
