"""Per-GPU and host memory of a plan: model states (ZeRO formulas) + activations + a constant.

Model states follow DeepSpeed's own estimators (`estimate_zero2_model_states_mem_needs`,
`estimate_zero3_model_states_mem_needs`), with Ψ parameters, N = data-parallel degree (the
ZeRO partition size), L = parameters of the largest layer, mixed precision (16-bit working
copies, fp32 master weights and Adam moments):

    stage 0 (DDP)          GPU 20Ψ                       2 w16 + 2 g16 + 4 g32 + 4 master + 8 Adam
    stage 1                GPU 4Ψ + 16Ψ/N                fp32 grads, master and Adam partitioned
    stage 2                GPU 2Ψ + 18Ψ/N                DeepSpeed: 18 = 2 g16 + 4 g32 + 4 master + 8 Adam
    stage 2 + opt offload  GPU 2Ψ                        host Ψ·max(4·G, 16)·1.5
    stage 3                GPU 4L + 18Ψ/N                host 4L·G·1.5 (zero.Init)
    stage 3 + opt offload  GPU 4L + 2Ψ/N                 host 16Ψ/n·1.5
    stage 3 + opt + param  GPU 4L                        host 18Ψ/n·1.5

(G = GPUs per node, n = nodes.) Stages 2 and 3 are DeepSpeed's functions verbatim; stages 0
and 1 use the same accounting, which counts the fp32 gradient buffer the ZeRO paper's 16Ψ
leaves out, so the four stages compare on one scale. In fp32 training the working copies are fp32 (w = g = 4
bytes); DeepSpeed still keeps a separate fp32 master partition under ZeRO 1-3, but not at
stage 0, where the working copy is the master:

    stage 0  4 w + 4 g + 8 Adam                = 16Ψ
    stage 1  4 w + 4 g + (4 master + 8 Adam)/N = 8Ψ + 12Ψ/N
    stage 2  4 w + (4 g + 4 master + 8 Adam)/N = 4Ψ + 16Ψ/N      (+ opt offload: 4Ψ)
    stage 3  8L + 20Ψ/N                        (+ opt offload: 8L + 8Ψ/N; + param offload: 8L)

Activations: `act_bytes_per_sample` is measured by the profiler (peak minus model states,
divided by the micro-batch), and scales with the micro-batch; activation checkpointing keeps
only each block's input plus one block's full activations:

    act(mb) = mb · a                     without checkpointing
    act(mb) = mb · a · (1/n_layer + c)   with checkpointing, c = `ckpt_keep` (fitted, or from the
                                         ratio counted in `tidal.planner.activations`)

peak = model states + act(mb) + `const_bytes` (the fitted allocator/workspace constant)
       + `zero_const_bytes` under ZeRO stages 1-3 (fitted: the ZeRO optimizer's own buffers,
         which DeepSpeed's estimators leave out — its contiguous-gradient reduce buckets hold
         `reduce_bucket_size` elements whatever the model's size; on the CPU table a ZeRO
         engine's peak is ~55 MiB above plain DDP's at every micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal.jobs.spec import Plan, Precision


@dataclass(frozen=True, kw_only=True)
class ModelStats:
    """What the memory model needs to know of a model (Ψ, L, activations per sample)."""

    params: int  # Ψ
    largest_layer_params: int  # L
    n_layer: int = 1
    act_bytes_per_sample: float = 0.0  # a: activation bytes per sample of the micro-batch
    ckpt_keep: float | None = None  # c; None → one layer's worth, 1/n_layer
    const_bytes: float = 0.0  # fitted constant (allocator, workspace, buffers)
    zero_const_bytes: float = 0.0  # fitted extra constant of a ZeRO (stage ≥ 1) engine


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    gpu_model_states: float
    gpu_activations: float
    gpu_const: float
    host_bytes: float

    @property
    def gpu_peak(self) -> float:
        return self.gpu_model_states + self.gpu_activations + self.gpu_const


def model_state_bytes(plan: Plan, params: int, largest_layer: int, *, gpus_per_node: int, nodes: int,
                      precision: Precision = "bf16", buffer_factor: float = 1.5) -> tuple[float, float]:
    """(GPU bytes, host bytes) of parameters, gradients and Adam state per GPU; see module doc."""
    psi, lay, n = float(params), float(largest_layer), float(plan.dp)
    g = float(gpus_per_node)
    stage = plan.zero_stage
    if precision == "fp32":
        if stage == 0:
            return 16 * psi, 0.0
        if stage == 1:
            return 8 * psi + 12 * psi / n, 0.0
        if stage == 2:
            if plan.offload_optimizer:
                return 4 * psi, psi * max(4 * plan.num_gpus, 16) * buffer_factor
            return 4 * psi + 16 * psi / n, 4 * psi * g * buffer_factor
        # stage 3
        layer = 8 * lay
        if plan.offload_optimizer and plan.offload_param:
            return layer, psi * 20 / nodes * buffer_factor
        if plan.offload_optimizer:
            return layer + 8 * psi / n, psi * 16 / nodes * buffer_factor
        return layer + 20 * psi / n, lay * 4 * g * buffer_factor
    # mixed precision: DeepSpeed's estimator formulas
    if stage == 0:
        return 20 * psi, 0.0
    if stage == 1:
        return 4 * psi + 16 * psi / n, 0.0
    if stage == 2:
        if plan.offload_optimizer:
            return 2 * psi, psi * max(4 * plan.num_gpus, 16) * buffer_factor
        return 2 * psi + int(18 * psi / n), psi * 4 * g * buffer_factor
    layer = 4 * lay
    if plan.offload_optimizer and plan.offload_param:
        return layer, psi * 18 / nodes * buffer_factor
    if plan.offload_optimizer:
        return layer + int(2 * psi / n), psi * 16 / nodes * buffer_factor
    return layer + int(18 * psi / n), lay * 4 * g * buffer_factor


def activation_bytes(plan: Plan, stats: ModelStats) -> float:
    a = stats.act_bytes_per_sample * plan.micro_batch
    if plan.activation_checkpointing:
        keep = stats.ckpt_keep if stats.ckpt_keep is not None else 1.0 / max(1, stats.n_layer)
        return a * (1.0 / max(1, stats.n_layer) + keep)
    return a


def estimate(plan: Plan, stats: ModelStats, *, gpus_per_node: int, nodes: int,
             precision: Precision = "bf16") -> MemoryEstimate:
    gpu, host = model_state_bytes(plan, stats.params, stats.largest_layer_params,
                                  gpus_per_node=gpus_per_node, nodes=nodes, precision=precision)
    const = stats.const_bytes + (stats.zero_const_bytes if plan.zero_stage >= 1 else 0.0)
    return MemoryEstimate(gpu_model_states=gpu, gpu_activations=activation_bytes(plan, stats),
                          gpu_const=const, host_bytes=host)


def infeasibility(plan: Plan, stats: ModelStats, *, gpu_bytes: float, host_bytes_per_node: float,
                  gpus_per_node: int, nodes: int, precision: Precision = "bf16") -> str | None:
    """None if the plan fits, else why not (which memory, how much over)."""
    est = estimate(plan, stats, gpus_per_node=gpus_per_node, nodes=nodes, precision=precision)
    gib = float(1 << 30)
    if est.gpu_peak > gpu_bytes:
        return (f"GPU memory: needs {est.gpu_peak / gib:.2f} GiB per GPU "
                f"(model states {est.gpu_model_states / gib:.2f} + activations "
                f"{est.gpu_activations / gib:.2f} + const {est.gpu_const / gib:.2f}), "
                f"has {gpu_bytes / gib:.2f}")
    if est.host_bytes > host_bytes_per_node:
        return (f"host memory: needs {est.host_bytes / gib:.2f} GiB per node, "
                f"has {host_bytes_per_node / gib:.2f}")
    return None


def fit_memory(samples: list[tuple[Plan, float]], *, params: int, largest_layer_params: int,
               n_layer: int, gpus_per_node: int = 1, nodes: int = 1,
               precision: Precision = "bf16", ckpt_ratio: float | None = None) -> ModelStats:
    """Fit the activation and constant terms to measured peaks (least squares).

        peak − model_states(plan) = const + z·[stage ≥ 1] + a·mb              no checkpointing
                                  = const + z·[stage ≥ 1] + a·(1/L + c)·mb    checkpointing

    solved for const, z, a, a_ckpt = a·(1/L + c), each only where the samples tell it apart
    from the others: z needs samples with and without ZeRO (else it stays 0 and const holds
    it). When the samples cannot separate a from a_ckpt (the samples of one kind do not span
    two micro-batches, or too few samples: the profiler's default is 3 for 4 unknowns),
    a_ckpt = a·`ckpt_ratio` ties them:
    the ratio the profiler counted from the model's forward (`tidal.planner.activations`), or
    without one the textbook 2/L (each block's input and one block's activations kept). If
    every micro-batch is equal the activation terms are 0 and the constants hold the whole peak.
    Every term is a size, so the least squares are non-negative (`scipy.optimize.nnls`): with 3
    GPU rows plain least squares made the constant −0.38 GiB and the ZeRO constant +1.5 GiB to
    fit them exactly.
    """
    import numpy as np
    from scipy.optimize import nnls

    if not samples:
        raise ValueError("fit_memory needs at least one (plan, peak bytes) sample")
    rows, ys = [], []
    for plan, peak in samples:
        states, _ = model_state_bytes(plan, params, largest_layer_params, gpus_per_node=gpus_per_node,
                                      nodes=nodes, precision=precision)
        ac = plan.activation_checkpointing
        rows.append([1.0, float(plan.zero_stage >= 1), 0.0 if ac else plan.micro_batch,
                     plan.micro_batch if ac else 0.0])
        ys.append(peak - states)
    x, y = np.array(rows), np.array(ys)
    inv_l = 1.0 / max(1, n_layer)
    zero = x[:, 1]
    use_z = bool(zero.any() and not zero.all())
    cols = [0, 2, 3, 1] if use_z else [0, 2, 3]
    # each slope needs its own spread of micro-batches: one checkpointed row fixes a_ckpt only
    # through the constants, which absorb it (GPT-2 124M on an H100, a ZeRO-3 checkpointed row
    # at micro-batch 2 among the fit rows: a_ckpt came out 0 and every checkpointed peak was
    # predicted flat in the micro-batch, −58% at 16)
    spread = all(len({mb for mb in x[:, k] if mb}) > 1 for k in (2, 3))
    tie = not spread or np.linalg.matrix_rank(x[:, cols]) < len(cols)
    ratio = ckpt_ratio if ckpt_ratio is not None else 2 * inv_l
    if tie:  # one activation unknown: a_ckpt = a·ratio
        x = np.column_stack([x[:, 0], x[:, 1], x[:, 2] + ratio * x[:, 3]])
        cols = [0, 2, 1] if use_z else [0, 2]
    while len(cols) > 1 and np.linalg.matrix_rank(x[:, cols]) < len(cols):
        cols.pop()  # too few samples: z goes first, then the activations (equal micro-batches)
    coef = np.zeros(x.shape[1])
    coef[cols] = nnls(x[:, cols], y)[0]
    const, z, a = (float(v) for v in coef[:3])
    a_ckpt = a * ratio if tie else float(coef[3])
    keep = a_ckpt / a - inv_l if a > 0 else inv_l
    return ModelStats(params=params, largest_layer_params=largest_layer_params, n_layer=n_layer,
                      act_bytes_per_sample=max(a, 0.0), ckpt_keep=keep, const_bytes=const,
                      zero_const_bytes=z)
