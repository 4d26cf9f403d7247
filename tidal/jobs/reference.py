"""The repository's reference job: a tiny character-level GPT on Shakespeare.

Used by the demo, the benchmarks and the tests, so that all of them measure the same thing.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from tidal.jobs.data import CharCorpus, load_shakespeare, shakespeare_train, shakespeare_val
from tidal.jobs.models import GPTConfig, TinyGPT, lm_loss
from tidal.jobs.spec import JobSpec

# GPT-2's (hidden, layers, heads) by name; its vocabulary is 50257.
GPT2_SHAPES = {"gpt2-124m": (768, 12, 12), "gpt2-355m": (1024, 24, 16),
               "gpt2-774m": (1280, 36, 20), "gpt2-1.5b": (1600, 48, 25)}


def shakespeare_gpt(*, name: str = "shakespeare-gpt", seq_len: int = 64, d_model: int = 128,
                    n_layer: int = 4, n_head: int = 4, vocab_size: int | None = None,
                    **spec_fields: Any) -> JobSpec:
    """A JobSpec for the tiny GPT; `spec_fields` override JobSpec fields (global_batch, ...).

    `vocab_size` defaults to the corpus's characters; a larger one (GPT-2's 50257, to measure a
    GPT-2-shaped model) leaves the extra rows of the embedding and head unused by the data."""
    chars = load_shakespeare().vocab_size
    if vocab_size is not None and vocab_size < chars:
        raise ValueError(f"vocab_size {vocab_size} < the corpus's {chars} characters")
    cfg = GPTConfig(vocab_size=vocab_size or chars, seq_len=seq_len, d_model=d_model,
                    n_layer=n_layer, n_head=n_head)
    fields: dict[str, Any] = dict(
        name=name, model=partial(TinyGPT, cfg), dataset=partial(shakespeare_train, seq_len),
        eval_dataset=partial(shakespeare_val, seq_len), loss=lm_loss, global_batch=32,
        total_steps=100, min_gpus=1, max_gpus=4, lr=3e-3, weight_decay=0.01,
    )
    fields.update(spec_fields)
    return JobSpec(**fields)


def load_model(spec: JobSpec, params: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The spec's model with the full fp32 weights of a Tidal checkpoint (on CPU, eval mode)."""
    model: torch.nn.Module = spec.model()
    model.load_state_dict(params)
    return model.eval()


@torch.no_grad()
def evaluate(spec: JobSpec, model: torch.nn.Module, *, batches: int = 20, batch_size: int = 32) -> float:
    """Mean loss over the first `batches` × `batch_size` items of the held-out split."""
    from torch.utils.data import default_collate

    if spec.eval_dataset is None:
        raise ValueError(f"job {spec.name} has no eval_dataset")
    data = spec.eval_dataset()
    n = min(len(data), batches * batch_size)
    total = 0.0
    for start in range(0, n, batch_size):
        batch = default_collate([data[i] for i in range(start, min(n, start + batch_size))])
        total += float(spec.loss(model, batch)) * len(batch[0])
    return total / n


@torch.no_grad()
def generate(model: torch.nn.Module, corpus: CharCorpus, prompt: str, n: int, *, seed: int = 0) -> str:
    """Sample `n` characters after `prompt` (temperature 0.8)."""
    g = torch.Generator().manual_seed(seed)  # sampling on the CPU: the same text on any device
    seq_len = int(getattr(model, "cfg").seq_len)  # noqa: B009
    device = next(model.parameters()).device
    idx = torch.from_numpy(corpus.encode(prompt).astype("int64"))[None, :].to(device)
    for _ in range(n):
        logits = model(idx[:, -seq_len:])[0, -1].float().cpu() / 0.8
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)
        idx = torch.cat([idx, nxt[None, :].to(device)], dim=1)
    return corpus.decode(idx[0].tolist())


__all__ = ["evaluate", "generate", "lm_loss", "load_model", "shakespeare_gpt"]
