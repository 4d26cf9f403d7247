"""The dry run before submission: a broken job is a SpecError naming the field, in seconds."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pytest
import torch

from tests.conftest import tiny_gpt_spec
from tidal.jobs.dryrun import dry_run
from tidal.jobs.spec import SpecError


def _empty() -> list[Any]:
    return []


def _raises() -> Any:
    raise RuntimeError("CUDA out of memory while building the model\nsecond line")


def _nan_loss(model: Any, batch: Any) -> Any:
    return torch.tensor(float("nan"))


def test_a_good_job_passes() -> None:
    t = time.time()
    dry_run(tiny_gpt_spec())
    assert time.time() - t < 30


@pytest.mark.parametrize("override, field, words", [
    (dict(dataset=_empty), "JobSpec.dataset", "is empty"),
    (dict(model=_raises), "JobSpec.model", "RuntimeError: CUDA out of memory while building the model"),
    (dict(model=partial(torch.nn.Linear, 3)), "JobSpec.model", "TypeError"),
    (dict(loss=_nan_loss), "JobSpec.loss", "nan"),
])
def test_broken_jobs_name_the_field(override: dict[str, Any], field: str, words: str) -> None:
    t = time.time()
    with pytest.raises(SpecError) as e:
        dry_run(tiny_gpt_spec(**override))
    assert time.time() - t < 10
    assert e.value.field == field and words in str(e.value), str(e.value)
    assert "\n" not in str(e.value)  # one line


def test_a_hanging_factory_is_reported_at_the_limit() -> None:
    with pytest.raises(SpecError, match=r"took more than 0\.5 s"):
        dry_run(tiny_gpt_spec(dataset=partial(time.sleep, 5)), timeout_s=0.5)


def _plain_lm() -> torch.nn.Module:
    """A language model with no activation-checkpointing protocol (`tidal.jobs.actckpt`)."""
    from tidal.jobs.data import load_shakespeare

    vocab = load_shakespeare().vocab_size
    return torch.nn.Sequential(torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab))


def test_a_model_that_cannot_checkpoint_is_refused_only_where_checkpointing_is_required() -> None:
    from tidal.jobs.spec import Plan, PlanSpace

    dry_run(tiny_gpt_spec(model=_plain_lm))  # the default plan space also has plans without it
    with pytest.raises(SpecError, match=r"^JobSpec\.plan: activation_checkpointing=True, but model Seq"):
        dry_run(tiny_gpt_spec(model=_plain_lm, plan=Plan(dp=1, micro_batch=8, activation_checkpointing=True)))
    with pytest.raises(SpecError, match=r"^JobSpec\.plans: allows only activation_checkpointing=True"):
        dry_run(tiny_gpt_spec(model=_plain_lm, plans=PlanSpace(activation_checkpointing=(True,))))
