"""Counting what activation checkpointing keeps (`tidal.planner.activations`), on real models."""

from __future__ import annotations

import pytest
import torch

from tidal.jobs.models import GPTConfig, TinyGPT, lm_loss
from tidal.planner.activations import ActivationCount, count_saved


def _gpt(vocab: int, n_layer: int = 3) -> tuple[TinyGPT, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=vocab, seq_len=16, d_model=32, n_layer=n_layer, n_head=4))
    x = torch.randint(0, vocab, (1, 16))
    return model, (x, torch.roll(x, -1, 1))


def test_counts_blocks_inputs_and_the_rest() -> None:
    model, batch = _gpt(vocab=50)
    c = count_saved(model, lambda: lm_loss(model, batch))
    assert c is not None and c.n_blocks == 3
    assert c.block_input_bytes == 16 * 32 * 4  # one sample × seq × width × fp32
    assert 0 < c.n_blocks * c.block_bytes < c.saved_bytes


def test_checkpointed_forward_keeps_the_rest_and_each_block_input() -> None:
    """The formula's kept part, checked against a checkpointed forward: with checkpointing on,
    autograd's graph keeps the part outside the blocks and each block's input, S − L·B + L·I
    (the blocks' own saves are recomputed in the backward, one block at a time: + B)."""
    model, batch = _gpt(vocab=50)
    c = count_saved(model, lambda: lm_loss(model, batch))
    assert c is not None
    model.set_activation_checkpointing(True)
    kept = count_saved(model, lambda: lm_loss(model, batch))
    assert kept is not None
    n, s, b, i = c.n_blocks, c.saved_bytes, c.block_bytes, c.block_input_bytes
    assert kept.saved_bytes == pytest.approx(s - n * b + n * i)
    assert c.ckpt_ratio == pytest.approx((kept.saved_bytes + b) / s)


def test_ratio_grows_with_the_vocabulary() -> None:
    """Logits are outside the blocks: a large vocabulary keeps more of the activations."""
    small, large = _gpt(vocab=50), _gpt(vocab=5000)
    r_small = count_saved(small[0], lambda: lm_loss(small[0], small[1]))
    r_large = count_saved(large[0], lambda: lm_loss(large[0], large[1]))
    assert r_small is not None and r_large is not None
    assert r_small.ckpt_ratio < r_large.ckpt_ratio <= 1.0


def test_formula_and_no_block_list() -> None:
    c = ActivationCount(saved_bytes=100.0, block_bytes=8.0, block_input_bytes=1.0, n_blocks=10)
    assert c.ckpt_ratio == pytest.approx((100 - 80 + 10 + 8) / 100)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    assert count_saved(mlp, lambda: mlp(torch.ones(1, 4)).sum()) is None
