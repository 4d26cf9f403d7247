"""A Hugging Face causal LM as a Tidal job: a small Llama, built from its config (random
weights, nothing downloaded), trained on Shakespeare's characters.

    pip install 'tidal[hf]'                      # transformers, pinned
    tidal plan examples/hf_job.py --gpus 2       # profile it and rank its plans on 2 GPUs
    tidal submit examples/hf_job.py              # run it under the scheduler

Any `AutoModelForCausalLM` works the same way. What Tidal needs of the model is only what
`transformers` already gives: a `torch.nn.Module` whose forward takes `input_ids` and `labels`
and returns `.loss`, and, for plans with activation checkpointing,
`gradient_checkpointing_enable()` (Tidal turns it on and off per plan).

The result does not depend on the plan or the GPU count, so the model has no dropout: a dropout
mask is drawn per micro-batch, so splitting a step differently would draw different masks.
"""

from __future__ import annotations

from typing import Any

import torch

from tidal import JobSpec, WarmupCosine
from tidal.jobs.data import load_shakespeare, shakespeare_train, shakespeare_val

SEQ_LEN = 64


def make_model() -> torch.nn.Module:
    """A 4-layer Llama with 128-wide hidden states, over the corpus's characters."""
    from transformers import AutoModelForCausalLM, LlamaConfig  # inside: only workers need it

    config = LlamaConfig(
        vocab_size=load_shakespeare().vocab_size, hidden_size=128, intermediate_size=344,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=SEQ_LEN + 1, attention_dropout=0.0, use_cache=False,
        tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


class CausalLMBlocks(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Shakespeare as Hugging Face batches: `input_ids` and `labels` of SEQ_LEN + 1 characters
    (the model shifts the labels itself, so it predicts SEQ_LEN of them)."""

    def __init__(self, split: str) -> None:
        self.blocks = shakespeare_train(SEQ_LEN) if split == "train" else shakespeare_val(SEQ_LEN)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.blocks[i]
        ids = torch.cat([x, y[-1:]])
        return {"input_ids": ids, "labels": ids}


def train_data() -> CausalLMBlocks:
    return CausalLMBlocks("train")


def val_data() -> CausalLMBlocks:
    return CausalLMBlocks("val")


def causal_lm_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's own loss: the mean cross-entropy over the micro-batch's predicted tokens."""
    return model(**batch).loss


def make_spec(**fields: Any) -> JobSpec:
    spec: dict[str, Any] = dict(
        name="shakespeare-llama", model=make_model, dataset=train_data, eval_dataset=val_data,
        loss=causal_lm_loss, global_batch=32, total_steps=300, min_gpus=1, max_gpus=4,
        lr=WarmupCosine(peak=3e-3, warmup=30, total=300), weight_decay=0.01,
    )
    spec.update(fields)
    return JobSpec(**spec)
