from __future__ import annotations

import torch

from tidal.jobs.models import GPTConfig, TinyGPT, lm_loss


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
