"""Turning a model's activation checkpointing on and off, whichever protocol it speaks.

A plan with `activation_checkpointing=True` asks the model to keep only each block's input and
recompute the rest in the backward. Two protocols are understood, in this order:

1. Tidal's: `model.set_activation_checkpointing(enabled: bool)`, its state in
   `model.activation_checkpointing` (the reference `TinyGPT`; any module may define it).
2. Hugging Face's: a `transformers.PreTrainedModel` with `supports_gradient_checkpointing`
   gets `activation_checkpointing_enable({"use_reentrant": False})` / `..._disable()`, its state
   in `is_activation_checkpointing` (transformers 5.2x's names; older releases' `gradient_*`
   names, deprecated there, are used where the new ones are missing). The non-reentrant form
   is PyTorch's recommended one: it works when the block's inputs need no grad and with
   ZeRO-3's gathered parameters, where the reentrant one warns or drops grads.

Neither imports `transformers`: a Hugging Face model is recognised by its methods.
"""

from __future__ import annotations

from typing import Any


def _hf_prefix(model: Any) -> str | None:
    """"activation" or "gradient": the name of the model's Hugging Face checkpointing methods."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        return None
    for prefix in ("activation", "gradient"):
        if (callable(getattr(type(model), f"{prefix}_checkpointing_enable", None))
                and callable(getattr(type(model), f"{prefix}_checkpointing_disable", None))):
            return prefix
    return None


def protocol(model: Any) -> str | None:
    """"tidal", "hf", or None when the model cannot checkpoint its activations."""
    if callable(getattr(model, "set_activation_checkpointing", None)):
        return "tidal"
    return "hf" if _hf_prefix(model) else None


def is_enabled(model: Any) -> bool:
    """Whether the model checkpoints its activations now."""
    kind = protocol(model)
    if kind == "tidal":
        return bool(getattr(model, "activation_checkpointing", False))
    if kind == "hf":
        return bool(getattr(model, f"is_{_hf_prefix(model)}_checkpointing", False))
    return False


def set_enabled(model: Any, enabled: bool) -> None:
    """Turn checkpointing on or off; ValueError naming the model when it speaks no protocol."""
    kind = protocol(model)
    if kind == "tidal":
        model.set_activation_checkpointing(enabled)
    elif kind == "hf":
        prefix = _hf_prefix(model)
        if enabled:
            getattr(model, f"{prefix}_checkpointing_enable")({"use_reentrant": False})
        else:
            getattr(model, f"{prefix}_checkpointing_disable")()
    elif enabled:
        raise ValueError(
            f"model {type(model).__name__} can not checkpoint its activations: define "
            "set_activation_checkpointing(bool), or use a Hugging Face model that supports "
            "activation (gradient) checkpointing")
