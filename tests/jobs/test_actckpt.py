"""Activation checkpointing through Tidal's protocol or Hugging Face's (`tidal.jobs.actckpt`),
no cluster: a small Llama from its config, TinyGPT, and a model with neither."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tidal.jobs import actckpt
from tidal.jobs.checkpoint import model_config
from tidal.jobs.models import GPTConfig, TinyGPT


def _llama() -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
                      use_cache=False)
    return AutoModelForCausalLM.from_config(cfg)


def _saved_bytes_loss_and_grads(model: Any) -> tuple[int, float, list[torch.Tensor]]:
    """Bytes autograd keeps for the backward of one batch, its loss, and the gradients."""
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    model.train()
    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return saved[0], float(loss), [p.grad.clone() for p in model.parameters()]


def test_a_hugging_face_model_checkpoints_through_its_own_methods_with_the_same_gradients() -> None:
    model = _llama()
    assert actckpt.protocol(model) == "hf" and not actckpt.is_enabled(model)
    plain_bytes, plain_loss, plain_grads = _saved_bytes_loss_and_grads(model)
    actckpt.set_enabled(model, True)
    assert actckpt.is_enabled(model)
    ckpt_bytes, ckpt_loss, ckpt_grads = _saved_bytes_loss_and_grads(model)
    assert ckpt_bytes < 0.7 * plain_bytes, (ckpt_bytes, plain_bytes)  # it keeps less for the backward
    assert ckpt_loss == pytest.approx(plain_loss, rel=1e-6)
    for a, b in zip(plain_grads, ckpt_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    actckpt.set_enabled(model, False)
    assert not actckpt.is_enabled(model)
    assert _saved_bytes_loss_and_grads(model)[0] == plain_bytes


class _OldHF(torch.nn.Module):
    """A model with only transformers 4's names (`gradient_checkpointing_*`)."""

    supports_gradient_checkpointing = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Any] = []
        self.is_gradient_checkpointing = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: Any = None) -> None:
        self.calls.append(("enable", gradient_checkpointing_kwargs))
        self.is_gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.calls.append(("disable",))
        self.is_gradient_checkpointing = False


def test_older_hugging_face_names_and_tidals_own_protocol_are_used_where_they_are_all_there_is() -> None:
    old = _OldHF()
    assert actckpt.protocol(old) == "hf"
    actckpt.set_enabled(old, True)
    actckpt.set_enabled(old, False)
    assert old.calls == [("enable", {"use_reentrant": False}), ("disable",)]
    tiny = TinyGPT(GPTConfig(vocab_size=10, seq_len=8, d_model=16, n_layer=2, n_head=2))
    assert actckpt.protocol(tiny) == "tidal"
    actckpt.set_enabled(tiny, True)
    assert actckpt.is_enabled(tiny) and tiny.activation_checkpointing


def test_a_model_with_neither_protocol_is_one_line_naming_it() -> None:
    linear = torch.nn.Linear(2, 2)
    assert actckpt.protocol(linear) is None and not actckpt.is_enabled(linear)
    actckpt.set_enabled(linear, False)  # turning off what it never had is fine
    with pytest.raises(ValueError, match=r"^model Linear can not checkpoint its activations"):
        actckpt.set_enabled(linear, True)


def test_a_checkpoint_records_a_hugging_face_models_config_to_rebuild_it() -> None:
    from transformers import AutoConfig

    model = _llama()
    meta = dict(model_config(model) or {})
    assert meta["model_type"] == "llama" and meta["num_hidden_layers"] == 3
    rebuilt = AutoConfig.for_model(meta.pop("model_type"), **meta)
    assert (rebuilt.hidden_size, rebuilt.vocab_size) == (32, 50)
