"""What activation checkpointing keeps, counted from the model's own forward pass.

The memory model needs the ratio of a checkpointed plan's activation memory to a plain one's
when the profiled samples cannot tell the two slopes apart (`memory.fit_memory`). The textbook
answer, 2/L for L blocks (each block's input plus one block's activations), ignores everything
outside the blocks; for a language model with a large vocabulary that part dominates: GPT-2
124M's logits and loss keep ~0.5 GiB per 1024-token sample, and the ratio measured on an H100
is 0.445, not 2/12 = 0.167.

So the profiler counts it: one forward pass of one sample under
`torch.autograd.graph.saved_tensors_hooks`, without checkpointing, records the memory of every
tensor autograd saves for the backward — by storage, so views (a linear layer's transposed
weight, attention's q/k/v of one projection) count once and parameters (whose storages they
are, also when ZeRO-3 has just gathered them) not at all — and which of them were saved inside
the first block of the model's block list (its largest `nn.ModuleList`, the one the runner
checkpoints block by block):

    S  bytes saved per sample in the whole forward
    B  bytes saved inside one block            (the blocks are alike)
    I  bytes of one block's input
    L  number of blocks

With checkpointing the parts outside the blocks are kept as before, each block keeps only its
input, and the backward recomputes one block at a time, so

    ckpt_ratio = (S − L·B + L·I + B) / S

It counts tensors, not the allocator: transient buffers (the gradient of the logits, a kernel's
workspace) are left to the fitted constant and slope.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ActivationCount:
    saved_bytes: float  # S
    block_bytes: float  # B
    block_input_bytes: float  # I
    n_blocks: int  # L

    @property
    def ckpt_ratio(self) -> float:
        """Checkpointed ÷ plain activation bytes: (S − L·B + L·I + B) / S, within (0, 1]."""
        s, b, i, n = self.saved_bytes, self.block_bytes, self.block_input_bytes, self.n_blocks
        kept = s - n * b + n * i + b
        return min(1.0, max(kept / s, 1e-6))


def count_saved(model: Any, forward: Callable[[], Any]) -> ActivationCount | None:
    """Count what `forward()` (a forward pass of `model` on one sample, returning the loss) saves
    for the backward. None when the model has no block list or the blocks did not run."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        return None
    blocks = max(lists, key=len)
    params = list(model.parameters())
    seen: dict[int, tuple[Any, int]] = {}  # storage address → (tensor kept alive, bytes)
    in_block: set[int] = set()
    state = {"inside": False, "input": 0}

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        # against the parameters' storages now (ZeRO-3 gathers them for this very forward)
        if key not in seen and key not in {p.untyped_storage().data_ptr() for p in params}:
            seen[key] = (t, storage.nbytes())
            if state["inside"]:
                in_block.add(key)
        return t

    def pre(_m: Any, args: tuple[Any, ...]) -> None:
        state["inside"] = True
        state["input"] = sum(a.numel() * a.element_size() for a in args if torch.is_tensor(a))

    def post(_m: Any, _args: Any, _out: Any) -> None:
        state["inside"] = False

    hooks = [blocks[0].register_forward_pre_hook(pre), blocks[0].register_forward_hook(post)]
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = forward()
        del loss
    finally:
        for h in hooks:
            h.remove()
    total = sum(b for _, b in seen.values())
    block = sum(seen[k][1] for k in in_block)
    if total <= 0 or not state["input"]:
        return None
    return ActivationCount(saved_bytes=float(total), block_bytes=float(block),
                           block_input_bytes=float(state["input"]), n_blocks=len(blocks))
