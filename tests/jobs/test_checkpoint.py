"""Plan-independent checkpoints on real DeepSpeed engines in this process (world size 1, gloo).

The multi-worker version of the same property (dp changes too) runs on a Ray cluster in
test_runner.py; this one needs no cluster and checks every ZeRO stage's capture/restore.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import tiny_gpt_spec
from tidal.jobs import Plan
from tidal.jobs.checkpoint import (
    STATE_FILE,
    CheckpointError,
    TrainState,
    capture_state,
    read_complete_meta,
    read_meta,
    restore_state,
)
from tidal.jobs.data import StepSampler
from tidal.jobs.engine import build_engine, init_world_of_one, train_step


@pytest.fixture(scope="module")
def dist_world_of_one() -> Iterator[None]:
    init_world_of_one("gloo")
    yield


def _train(spec: Any, plan: Plan, start: int, steps: int,
           state: TrainState | None) -> tuple[list[float], TrainState]:
    engine = build_engine(spec, plan, torch.device("cpu"))
    if state is not None:
        restore_state(engine, state)
    data = spec.dataset()
    sampler = StepSampler(len(data), spec.global_batch, spec.seed)
    losses = [float(train_step(engine, spec, plan, data, sampler, k, 0, torch.device("cpu")))
              for k in range(start, start + steps)]
    out = capture_state(engine, step=start + steps, seed=spec.seed, rank=0)
    assert out is not None
    return losses, out


def test_every_stage_resumes_every_other(dist_world_of_one: None, tmp_path: Path) -> None:
    spec = tiny_gpt_spec(weight_decay=0.1)
    reference, _ = _train(spec, Plan(dp=1, zero_stage=0, micro_batch=8), 0, 15, None)
    chain = [
        Plan(dp=1, zero_stage=1, micro_batch=4, grad_accum=2),
        Plan(dp=1, zero_stage=3, micro_batch=2, grad_accum=4, activation_checkpointing=True),
        Plan(dp=1, zero_stage=2, offload_optimizer=True, micro_batch=8),
        Plan(dp=1, zero_stage=3, offload_optimizer=True, offload_param=True, micro_batch=4, grad_accum=2),
        Plan(dp=1, zero_stage=0, micro_batch=1, grad_accum=8),
    ]
    losses: list[float] = []
    state: TrainState | None = None
    for i, plan in enumerate(chain):
        seg, state = _train(spec, plan, 3 * i, 3, state)
        losses += seg
        state.save(tmp_path / f"seg{i}")  # and through the file format
        state = TrainState.load(tmp_path / f"seg{i}")
    assert state is not None and state.step == 15 and state.adam_step == 15
    assert read_meta(tmp_path / "seg4")["step"] == 15
    for k, (a, b) in enumerate(zip(reference, losses, strict=True)):
        assert abs(a - b) / abs(a) <= 1e-5, f"step {k}: {a} vs {b}"
    assert losses[-1] < losses[0]


def test_restore_refuses_another_model(dist_world_of_one: None, tmp_path: Path) -> None:
    spec = tiny_gpt_spec()
    _, state = _train(spec, Plan(dp=1, zero_stage=1, micro_batch=8), 0, 1, None)
    other = tiny_gpt_spec(d_model=32)
    engine = build_engine(other, Plan(dp=1, zero_stage=1, micro_batch=8), torch.device("cpu"))
    with pytest.raises(CheckpointError, match="shape"):
        restore_state(engine, state)
    with pytest.raises(CheckpointError, match="not a Tidal checkpoint"):
        TrainState.load(tmp_path)


def test_a_checkpoint_cut_short_in_storage_is_not_complete(dist_world_of_one: None, tmp_path: Path) -> None:
    """The copy into storage may stop anywhere (a killed worker), in any file order."""
    _, state = _train(tiny_gpt_spec(), Plan(dp=1, micro_batch=8), 0, 1, None)
    state.save(tmp_path / "whole")
    assert read_complete_meta(tmp_path / "whole")["step"] == 1
    state.save(tmp_path / "cut")
    data = (tmp_path / "cut" / STATE_FILE).read_bytes()
    (tmp_path / "cut" / STATE_FILE).write_bytes(data[: len(data) // 2])
    assert read_meta(tmp_path / "cut")["step"] == 1  # its meta alone looks fine
    with pytest.raises(CheckpointError, match="half-written"):
        read_complete_meta(tmp_path / "cut")


def test_model_config_is_the_modules_own_dataclass() -> None:
    """What a checkpoint's meta records as the model's shape: the dataclass a module keeps."""
    import dataclasses

    from tidal.jobs.checkpoint import model_config
    from tidal.jobs.models import GPTConfig, TinyGPT

    cfg = GPTConfig(vocab_size=65, seq_len=16, d_model=32, n_layer=1, n_head=2)
    assert model_config(TinyGPT(cfg)) == dataclasses.asdict(cfg)
    assert model_config(torch.nn.Linear(2, 2)) is None  # a module without one: nothing recorded
