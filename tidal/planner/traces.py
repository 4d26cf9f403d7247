"""Readers of the Rubick ("Morphling") artifact tables in `../shared/traces/rubick/`.

Decodes the artifact's codes (its README, sections 3-5):

* exec_plan `ga` (DDP + accumulation), `gc` (DDP + activation checkpointing), `zero-dp`
  (ZeRO-2), `zero-offload` (ZeRO-2 + CPU optimizer), and three digits `P T D` (pipeline,
  tensor, data-parallel degrees of a Megatron-style 3D plan);
* placement: one digit per node, the GPUs used on it (`2222` = 2 GPUs on each of 4 nodes);
* component times: milliseconds in bert/gpt2/t5/llama30 and the 3D rows of llama7, seconds in
  roberta/vit and llama7's zero-offload rows — normalised to seconds here.

`iter_time` is seconds everywhere; throughput = global batch / iter_time.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from tidal.planner.perfmodel import PlanPoint, Sample, Workload

# Global batch per iteration used by the artifact (README §1) and model sizes. Ψ comes from the
# profile configs (parameter_size × 2^20); llama30's profile files hold LLaMA-2-7B data
# (README §5), so its Ψ is LLaMA-30B's published 32.5 B parameters.
GLOBAL_BATCH = {"bert": 32, "gpt2": 16, "t5": 16, "roberta": 64, "vit": 64, "llama7": 8, "llama30": 4}
PROFILE_NAME = {"bert": "bert", "gpt2": "gpt2", "t5": "t5", "roberta": "roberta", "vit": "vit",
                "llama7": "llama7b", "llama30": None}
SECONDS_COMPONENTS = {"roberta", "vit"}
LLAMA30_PARAMS = 32.5e9
LLAMA30_SEQ_HID = 6656 * 2048 * 60  # hidden × sequence × layers
MODELS = tuple(GLOBAL_BATCH)


@dataclass(frozen=True, kw_only=True)
class TraceRow:
    model: str
    exec_plan: str
    placement: str
    sample: Sample


def decode_placement(code: str) -> tuple[int, ...]:
    if not code.isdigit() or "0" in code:
        raise ValueError(f"bad placement code {code!r}: one digit 1-8 per node")
    return tuple(int(c) for c in code)


def decode_plan(exec_plan: str, placement: tuple[int, ...], cpu_threads: int = 4) -> PlanPoint:
    n = sum(placement)
    if exec_plan in ("ga", "gc", "zero-dp", "zero-offload", "zero-offload+gc"):
        return PlanPoint(
            gpus_per_node=placement, dp=n,
            zero_stage=2 if exec_plan.startswith("zero") else 0,
            offload=exec_plan.startswith("zero-offload"),
            act_ckpt=exec_plan.endswith("gc"),
            cpu_threads=cpu_threads if exec_plan.startswith("zero-offload") else None,
        )
    if len(exec_plan) == 3 and exec_plan.isdigit():
        pp, tp, dp = (int(c) for c in exec_plan)
        if pp * tp * dp != n:
            raise ValueError(f"plan {exec_plan} needs {pp * tp * dp} GPUs, placement has {n}")
        return PlanPoint(gpus_per_node=placement, dp=dp, tp=tp, pp=pp)
    raise ValueError(f"unknown exec_plan code {exec_plan!r}")


def workload(root: Path, model: str) -> Workload:
    prof = PROFILE_NAME[model]
    if prof is None:
        return Workload(params=LLAMA30_PARAMS, global_batch=GLOBAL_BATCH[model], seq_hid=LLAMA30_SEQ_HID)
    with (root / f"{prof}-profile-config.csv").open(encoding="utf-8-sig") as f:
        row = next(csv.DictReader(f))
    return Workload(params=float(row["parameter_size"]) * 2**20, global_batch=GLOBAL_BATCH[model],
                    seq_hid=float(row["seq_hid"]))


def _component_scale(model: str, exec_plan: str) -> float:
    if model in SECONDS_COMPONENTS or (model == "llama7" and exec_plan.startswith("zero")):
        return 1.0
    return 1e-3


def placements(root: Path, model: str) -> list[TraceRow]:
    """Every measured row of `<model>-placements.csv`, times in seconds."""
    out: list[TraceRow] = []
    with (root / f"{model}-placements.csv").open(encoding="utf-8-sig") as f:
        for r in csv.DictReader(f):
            placement = decode_placement(r["placement"])
            point = decode_plan(r["exec_plan"], placement)
            scale = _component_scale(model, r["exec_plan"])
            fwd = float(r["forward"]) * scale
            sample = Sample(point=point, iter_s=float(r["iter_time"]), fwd_s=fwd if fwd > 0 else None,
                            sync_s=float(r["overlap_sync"]) * scale, opt_s=float(r["optimize"]) * scale)
            out.append(TraceRow(model=model, exec_plan=r["exec_plan"], placement=r["placement"],
                                sample=sample))
    return out


def profile_rows(root: Path, model: str) -> list[TraceRow]:
    """The artifact's own profiling samples (`<m>-profile-*.csv`), single node, times in s."""
    prof = PROFILE_NAME[model]
    if prof is None:
        return []
    with (root / f"{prof}-profile-config.csv").open(encoding="utf-8-sig") as f:
        configs = list(csv.DictReader(f))
    with (root / f"{prof}-profile-data.csv").open(encoding="utf-8-sig") as f:
        data = list(csv.DictReader(f))
    out = []
    for c, d in zip(configs, data, strict=True):
        zero = int(c["zero_type"])
        plan = {0: "ga", 1: "zero-offload", 2: "zero-dp"}[zero]
        if d["strategy"][0] == "2":
            plan = "gc"
        placement = (int(c["gpus"]),)
        point = decode_plan(plan, placement, cpu_threads=int(c["num_cpu_threads"]))
        sample = Sample(point=point, iter_s=float(d["iter_time"]) / 1e3,
                        fwd_s=float(d["forward_time"]) / 1e3, sync_s=float(d["Tcc"]) / 1e3,
                        opt_s=float(d["Topt"]) / 1e3)
        out.append(TraceRow(model=model, exec_plan=plan, placement=c["gpus"], sample=sample))
    return out
