"""Checkpoints that any plan can resume: full fp32 weights, Adam moments, step, data position.

DeepSpeed's own checkpoints are sharded by the writer's ZeRO stage and world size; plain
`load_checkpoint` fails when the dp size changes (STACK-NOTES.md). Tidal's checkpoint is
plan-independent instead: every tensor is stored whole, keyed by parameter name.

    params[name]      full fp32 master weight     (safe_get_full_fp32_param, or the module's
    exp_avg[name]     Adam first moment m           own tensor in a plain fp32 engine)
    exp_avg_sq[name]  Adam second moment v
    adam_step         Adam's step count t (bias correction 1 − β^t)
    step              optimizer steps done = the data position (the sampler is a function
                      of (seed, step); see `tidal.jobs.data.StepSampler`)
    seed              the job's seed: the RNG of step k is re-seeded from (seed, k), so no
                      per-rank generator state needs carrying across world sizes
    extra             state of in-job controllers (e.g. the LR tuner), opaque here

Capture is collective (ZeRO gathers shards with all-reduce / all-gather), so every rank calls
it in the same order; only rank 0 keeps the result. Restore runs on every rank of a freshly
built engine: it creates the optimizer state the torch optimizer would create lazily on its
first step, then scatters each full tensor into the local fragments. A restore that fails
part-way leaves the engine half-loaded: callers must treat the exception as fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT = "tidal-checkpoint-v1"
STATE_FILE = "tidal_state.pt"
META_FILE = "tidal_meta.json"
METRICS_FILE = "tidal_metrics.json"  # per-step metrics of the run up to the checkpoint


class CheckpointError(RuntimeError):
    """A checkpoint cannot be restored into this job (wrong model, missing file, ...)."""


@dataclass(kw_only=True)
class TrainState:
    step: int
    seed: int
    adam_step: int
    params: dict[str, torch.Tensor]
    exp_avg: dict[str, torch.Tensor] = field(default_factory=dict)
    exp_avg_sq: dict[str, torch.Tensor] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "format": FORMAT,
                "step": self.step,
                "seed": self.seed,
                "adam_step": self.adam_step,
                "params": self.params,
                "exp_avg": self.exp_avg,
                "exp_avg_sq": self.exp_avg_sq,
                "extra": self.extra,
            },
            d / STATE_FILE,
        )
        meta = {"format": FORMAT, "step": self.step, "seed": self.seed, **self.meta,
                "state_bytes": (d / STATE_FILE).stat().st_size}
        (d / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))

    @classmethod
    def load(cls, directory: str | Path) -> TrainState:
        path = Path(directory) / STATE_FILE
        if not path.exists():
            raise CheckpointError(f"{path} does not exist: not a Tidal checkpoint")
        raw = torch.load(path, map_location="cpu", weights_only=False)
        if raw.get("format") != FORMAT:
            raise CheckpointError(f"{path} has format {raw.get('format')!r}, expected {FORMAT!r}")
        meta_path = Path(directory) / META_FILE
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        return cls(
            step=raw["step"], seed=raw["seed"], adam_step=raw["adam_step"], params=raw["params"],
            exp_avg=raw["exp_avg"], exp_avg_sq=raw["exp_avg_sq"], extra=raw["extra"], meta=meta,
        )


def model_config(module: Any) -> dict[str, Any] | None:
    """The model's own configuration, for a checkpoint's meta (`"model"`): the dataclass a module
    keeps as `cfg` or `config` (this repository's `TinyGPT` keeps its `GPTConfig` as `cfg`), or a
    Hugging Face `PretrainedConfig` (its `to_dict()`, `model_type` included, so that
    `AutoConfig.for_model(**meta["model"])` rebuilds it), as a dict of its JSON scalars; None for
    a module that keeps none. What loads the weights later (the Serve app) builds the model at
    this shape without being told it."""
    import dataclasses

    for name in ("cfg", "config"):
        c: Any = getattr(module, name, None)
        to_dict = getattr(c, "to_dict", None)
        if isinstance(getattr(c, "model_type", None), str) and callable(to_dict):
            d = to_dict()  # a Hugging Face config (a dataclass too, in transformers 5)
        elif dataclasses.is_dataclass(c) and not isinstance(c, type):
            d = dataclasses.asdict(c)
        else:
            continue
        return {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool))}
    return None


def read_meta(directory: str | Path) -> dict[str, Any]:
    """The small JSON description of a checkpoint (step, plan, losses) without loading tensors."""
    path = Path(directory) / META_FILE
    if not path.exists():
        raise CheckpointError(f"{path} does not exist: not a Tidal checkpoint")
    meta: dict[str, Any] = json.loads(path.read_text())
    return meta


def read_complete_meta(directory: str | Path) -> dict[str, Any]:
    """`read_meta` of a checkpoint whose state file is whole: the copy into storage may have been
    cut short (a killed worker) in any file order, so the state's size must be the one its meta
    recorded. Raises CheckpointError for a half-written checkpoint."""
    meta = read_meta(directory)
    path = Path(directory) / STATE_FILE
    size = path.stat().st_size if path.exists() else -1
    if "state_bytes" in meta and size != int(meta["state_bytes"]):
        raise CheckpointError(f"{path} has {size} bytes, its meta says {meta['state_bytes']}: half-written")
    return meta


def read_metrics(directory: str | Path) -> list[dict[str, Any]]:
    """The per-step metrics a checkpoint carries: its run's up to it (an older checkpoint carries
    those since the run's previous checkpoint only; `executor.run_checkpoints` reads both)."""
    path = Path(directory) / METRICS_FILE
    if not path.exists():
        return []
    metrics: list[dict[str, Any]] = json.loads(path.read_text())
    return metrics


def _inner_optimizer(engine: Any) -> torch.optim.Optimizer:
    """The torch optimizer under DeepSpeed's ZeRO / bf16 wrappers (or the optimizer itself)."""
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", opt)
    assert isinstance(inner, torch.optim.Optimizer), type(inner)
    return inner


def _zero_managed(p: torch.nn.Parameter) -> bool:
    """Whether DeepSpeed keeps p's fp32 master copy in (possibly remote) fragments.

    Must agree on every rank, since the gathers behind it are collective: a ZeRO-1/2 parameter
    that lies wholly in another rank's partition has `_hp_mapping = None` here, but still
    joins the all-reduce (DeepSpeed's `safe_get_*` helpers test `hasattr` the same way).
    """
    return hasattr(p, "ds_id") or hasattr(p, "_hp_mapping")


def _is_zero3(p: torch.nn.Parameter) -> bool:
    return hasattr(p, "ds_id")


def _full_shape(p: torch.nn.Parameter) -> torch.Size:
    shape: torch.Size = getattr(p, "ds_shape") if _is_zero3(p) else p.shape  # noqa: B009
    return shape


def capture_state(engine: Any, *, step: int, seed: int, rank: int,
                  extra: dict[str, Any] | None = None, all_ranks: bool = False) -> TrainState | None:
    """Gather the full training state; collective. Returns it on rank 0 (on every rank with
    `all_ranks`: what in-memory snapshots such as AutoLRS's probes need), None elsewhere."""
    from deepspeed.utils import (
        safe_get_full_fp32_param,
        safe_get_full_optimizer_state,
    )

    inner = _inner_optimizer(engine)
    has_moments = any(len(s) > 0 for s in inner.state.values())
    adam_step = 0
    if has_moments:
        first = next(s for s in inner.state.values() if len(s) > 0)
        adam_step = int(first["step"])
    params: dict[str, torch.Tensor] = {}
    m: dict[str, torch.Tensor] = {}
    v: dict[str, torch.Tensor] = {}
    for name, p in engine.module.named_parameters():
        if _zero_managed(p):
            full = safe_get_full_fp32_param(p)
            ea = safe_get_full_optimizer_state(p, "exp_avg") if has_moments else None
            eas = safe_get_full_optimizer_state(p, "exp_avg_sq") if has_moments else None
        else:  # plain fp32 engine: the module's parameters are the master weights
            full = p.detach()
            st = inner.state.get(p, {})
            ea, eas = st.get("exp_avg"), st.get("exp_avg_sq")
        if rank == 0 or all_ranks:
            params[name] = full.detach().float().cpu().clone()
            if ea is not None and eas is not None:
                m[name] = ea.detach().float().cpu().clone()
                v[name] = eas.detach().float().cpu().clone()
    if rank != 0 and not all_ranks:
        return None
    return TrainState(step=step, seed=seed, adam_step=adam_step, params=params, exp_avg=m,
                      exp_avg_sq=v, extra=dict(extra or {}))


def _init_optimizer_state(engine: Any, adam_step: int) -> None:
    """Create the Adam state torch would create lazily at the first step, with step count t.

    Under ZeRO-1/2 DeepSpeed links each parameter's optimizer-state fragment only after the
    first optimizer step; `lazy_init_hp_params_optimizer_state` does that linking now.
    """
    from deepspeed.utils import lazy_init_hp_params_optimizer_state

    inner = _inner_optimizer(engine)
    opt = engine.optimizer
    # ZeRO-3 puts its flat fp32 partitions into the torch optimizer's param_groups only
    # during step(); everywhere else the optimized tensors are the param_groups' params.
    flats = getattr(opt, "fp32_partitioned_groups_flat", None)
    tensors = list(flats) if flats is not None else [
        p for group in inner.param_groups for p in group["params"]
    ]
    # torch's Adam keeps its step as a tensor, DeepSpeedCPUAdam as an int (passed to its kernel);
    # the fused and capturable torch kernels want that tensor on the parameter's device (as
    # torch's own lazy init puts it), the others on the CPU
    cpu_adam = type(inner).__name__ == "DeepSpeedCPUAdam"
    on_device = any(g.get("fused") or g.get("capturable") for g in inner.param_groups)
    for p in tensors:
        inner.state[p] = {
            "step": adam_step if cpu_adam else torch.tensor(
                float(adam_step), dtype=torch.float32, device=p.device if on_device else "cpu"),
            "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
        }
    if hasattr(opt, "single_partition_of_fp32_groups") and hasattr(opt, "bit16_groups"):
        for lp_group, flat in zip(opt.bit16_groups, opt.single_partition_of_fp32_groups, strict=True):
            lazy_init_hp_params_optimizer_state(lp_group, flat, inner.state)
        opt._hp_optimizer_states_linked = True
    elif hasattr(opt, "bf16_groups") and hasattr(opt, "fp32_groups_flat_partition"):
        for lp_group, flat in zip(opt.bf16_groups, opt.fp32_groups_flat_partition, strict=True):
            lazy_init_hp_params_optimizer_state(lp_group, flat, inner.state)


def restore_state(engine: Any, state: TrainState) -> None:
    """Load a full state into an engine of any ZeRO stage / world size, freshly built or not."""
    import deepspeed
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    named = list(engine.module.named_parameters())
    names = {n for n, _ in named}
    if names != set(state.params):
        missing, unexpected = sorted(names - set(state.params)), sorted(set(state.params) - names)
        raise CheckpointError(
            f"checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    for name, p in named:
        if tuple(state.params[name].shape) != tuple(_full_shape(p)):
            raise CheckpointError(
                f"parameter {name}: checkpoint shape {tuple(state.params[name].shape)} "
                f"!= model shape {tuple(_full_shape(p))}"
            )
    with_moments = bool(state.exp_avg)
    # Always (re)create the optimizer state: a state captured before the first step has no
    # moments, and restoring it into an engine that has trained since (an AutoLRS probe) must
    # leave zero moments at step 0 — exactly what torch's Adam would create on its first step.
    _init_optimizer_state(engine, state.adam_step)
    inner = _inner_optimizer(engine)
    for name, p in named:
        value = state.params[name]
        if _zero_managed(p):
            device = p.ds_tensor.device if _is_zero3(p) else p.device
            safe_set_full_fp32_param(p, value.to(device))
            if with_moments:
                safe_set_full_optimizer_state(p, state.exp_avg[name].to(device), "exp_avg")
                safe_set_full_optimizer_state(p, state.exp_avg_sq[name].to(device), "exp_avg_sq")
            # The module's (possibly low-precision, possibly partitioned) copy of the weight.
            if _is_zero3(p):
                with deepspeed.zero.GatheredParameters([p], modifier_rank=0), torch.no_grad():
                    p.data.copy_(value.to(p.device, p.dtype))
            else:
                with torch.no_grad():
                    p.data.copy_(value.to(p.device, p.dtype))
        else:
            with torch.no_grad():
                p.data.copy_(value.to(p.device, p.dtype))
            if with_moments:
                inner.state[p]["exp_avg"].copy_(state.exp_avg[name])
                inner.state[p]["exp_avg_sq"].copy_(state.exp_avg_sq[name])
