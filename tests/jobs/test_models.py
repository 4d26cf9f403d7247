from __future__ import annotations

import pytest
import torch

from tidal.jobs.models import GPTConfig, TinyGPT, lm_loss
from tidal.jobs.reference import GPT2_SHAPES, shakespeare_gpt


def test_forward_shape_and_param_count() -> None:
    cfg = GPTConfig(vocab_size=50, seq_len=16, d_model=32, n_layer=3, n_head=4)
    model = TinyGPT(cfg)
    x = torch.randint(0, 50, (2, 16))
    assert model(x).shape == (2, 16, 50)
    assert sum(p.numel() for p in model.parameters()) == cfg.n_params


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    cfg = GPTConfig(vocab_size=30, seq_len=8, d_model=16, n_layer=2, n_head=2)
    torch.manual_seed(0)
    a = TinyGPT(cfg)
    b = TinyGPT(cfg)
    b.load_state_dict(a.state_dict())
    b.set_activation_checkpointing(True)
    x = torch.randint(0, 30, (4, 8))
    batch = (x, torch.roll(x, -1, dims=1))
    lm_loss(a, batch).backward()
    lm_loss(b, batch).backward()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert pa.grad is not None and pb.grad is not None
        torch.testing.assert_close(pa.grad, pb.grad)


def test_loss_is_near_uniform_at_init() -> None:
    cfg = GPTConfig(vocab_size=84, seq_len=16)
    x = torch.randint(0, 84, (8, 16))
    loss = lm_loss(TinyGPT(cfg), (x, x)).detach()
    assert abs(float(loss) - float(torch.log(torch.tensor(84.0)))) < 0.2


def test_gpt2_shapes_have_gpt2_parameter_counts() -> None:
    """The GPT-2 shapes the plan tables name: Ψ with a tied head is GPT-2's published count;
    ours is untied (+ 50257·d + 50257), so a table's `params` column says which it measured."""
    published = {"gpt2-124m": 124.4e6, "gpt2-355m": 354.8e6, "gpt2-774m": 774.0e6, "gpt2-1.5b": 1557.6e6}
    for name, (d, layers, heads) in GPT2_SHAPES.items():
        cfg = GPTConfig(vocab_size=50257, seq_len=1024, d_model=d, n_layer=layers, n_head=heads)
        tied = cfg.n_params - 50257 * d - 50257
        assert abs(tied - published[name]) / published[name] < 0.01, (name, tied)
    with pytest.raises(ValueError, match="vocab_size"):
        shakespeare_gpt(vocab_size=10)
