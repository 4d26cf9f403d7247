"""Accuracy of the fitted performance model on measured tables.

--rubick DIR: for each model of the Rubick artifact, fit on at most --fit-rows rows (default
8) chosen by `tidal.planner.selection` from that model's profile and placement rows, predict
the iteration time of every other measured row, print a per-model table and, last,
`perfmodel_mape: X` (mean over models of the mean absolute percentage error). --floor adds
each model's in-sample error when fitted on all of its rows (with their parts, and on
iteration times alone): how far the model form can describe the table at all. --orders N
refits with each model's rows in N other seeded orders (the selection breaks ties by row
order) and prints the spread before the final line.

--measurements FILE.csv: single-GPU rows with the columns
model,params,zero_stage,offload,act_ckpt,micro_batch,seq,step_s,tokens_per_s,peak_alloc_gib,status
(global batch = tokens_per_s · step_s / seq) and, optionally, fwd_s,bwd_s,opt_s (the parts
of the step the profiler times; `measure_plans.py` writes them): the fit uses them for its fit
rows, as the live planner does, unless --no-parts. Per model, fit the performance model and the
memory model's fitted terms on at most --fit-rows `ok` rows (default 4, chosen by the same
selection), predict every other row, and print `perfmodel_mape` (step time of ok rows),
`memory_mape` (peak memory of ok rows) and last `feasibility_accuracy` (predicted oom — peak
above --device-mem-gib — against the status, over all rows). --oom-above GIB reads a larger
GPU's table as a smaller one's: an ok row whose peak is above GIB counts as `oom` (its times
are not scored), so an H200's rows give an 80-GB H100's feasibility (`--oom-above 79.2
--device-mem-gib 79.2`); the times stay the larger GPU's.

Memory fit: `tidal.planner.memory.fit_memory` (activation and constant terms, non-negative
least squares); where the fit rows cannot separate checkpointed from plain activations they are
tied at the ratio the profiler would count from the model (`tidal.planner.activations`, counted
here on the CPU for the table's model names, one forward of one sample) when the peaks are the
allocator's live bytes (a GPU table), at the textbook 2/L for a CPU table (`--peaks rss`).
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import re
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from tidal.jobs import Plan
from tidal.jobs.reference import GPT2_SHAPES
from tidal.planner import traces
from tidal.planner.memory import estimate, fit_memory
from tidal.planner.perfmodel import Fit, Hardware, PlanPoint, Sample, Workload, fit
from tidal.planner.selection import family, select
from tidal.platform.argtypes import amount, count


@dataclass(frozen=True)
class Row:
    model: str
    params: int
    plan: Plan
    seq: int
    batch: int
    step_s: float
    peak: float  # bytes
    status: str
    parts: tuple[float, float, float] | None = None  # fwd_s, bwd_s, opt_s where the table has them
    ckpt_ratio: float | None = None  # counted by the profiler, where the table has it

    def sample(self, use_parts: bool) -> Sample:
        fwd, bwd, opt = self.parts if use_parts and self.parts else (None, None, None)
        return Sample(point=self.point, iter_s=self.step_s, fwd_s=fwd, sync_s=bwd, opt_s=opt)

    @property
    def point(self) -> PlanPoint:
        return PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=self.plan.zero_stage,
                         offload=self.plan.offload_optimizer, act_ckpt=self.plan.activation_checkpointing,
                         grad_accum=self.plan.grad_accum, cpu_threads=1)


def _layers(model: str, params: int) -> tuple[int, int]:
    """(layers, largest-layer parameters) from the model name."""
    if model in GPT2_SHAPES:  # vocabulary 50257: the largest layer is the embedding
        d, layers, _ = GPT2_SHAPES[model]
        return layers, 50257 * d
    m = re.match(r"tinygpt-d(\d+)-l(\d+)", model)
    if m:
        d, layers = int(m.group(1)), int(m.group(2))
        return layers, 8 * d * d
    return 12, params // 12


def counted_ckpt_ratio(model: str, seq: int, precision: str) -> float | None:
    """The checkpointing ratio the profiler would count (`tidal.planner.activations`), counted
    here on the CPU for a model named in the table (a forward of one sample: seconds for the
    GPT-2 shapes); None for a name this script cannot build."""
    import torch

    from tidal.jobs.models import GPTConfig, TinyGPT, lm_loss
    from tidal.planner.activations import count_saved

    if model in GPT2_SHAPES:
        d, layers, heads = GPT2_SHAPES[model]
        vocab = 50257
    elif m := re.match(r"tinygpt-d(\d+)-l(\d+)", model):
        from tidal.jobs.data import load_shakespeare

        d, layers, heads, vocab = int(m.group(1)), int(m.group(2)), 4, load_shakespeare().vocab_size
    else:
        return None
    torch.manual_seed(0)
    net = TinyGPT(GPTConfig(vocab_size=vocab, seq_len=seq, d_model=d, n_layer=layers, n_head=heads))
    net = net.to(torch.bfloat16 if precision == "bf16" else torch.float32).train()
    x = torch.randint(0, vocab, (1, seq))
    count = count_saved(net, lambda: lm_loss(net, (x, torch.roll(x, -1, 1))))
    return count.ckpt_ratio if count is not None else None


REQUIRED = ("model", "params", "zero_stage", "offload", "act_ckpt", "micro_batch", "seq", "step_s",
            "tokens_per_s", "peak_alloc_gib", "status")


def read_rows(path: Path) -> list[Row]:
    """The table's rows; a missing file, a missing column or a value that is not a number stops
    the run with one line naming it."""
    if not path.is_file():
        raise SystemExit(f"--measurements: {path}: no such file")
    with path.open() as f:
        reader = csv.DictReader(f)
        if missing := [c for c in REQUIRED if c not in (reader.fieldnames or [])]:
            raise SystemExit(f"{path}: missing column(s) {', '.join(missing)}")
        try:
            rows = _rows(path, reader)
        except ValueError as e:
            raise SystemExit(f"{path}, line {reader.line_num}: {e}") from None
    if not rows:
        raise SystemExit(f"{path}: no rows under the header")
    return rows


def _num(r: dict[str, str], col: str, *, integer: bool = False, empty: float | None = None) -> float:
    """Row `r`'s `col` as a number (an integer if `integer`; `empty` where the cell may be empty),
    else a ValueError naming the column and the value."""
    v = (r.get(col) or "").strip()
    if not v and empty is not None:
        return empty
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or (integer and not x.is_integer()):
        raise ValueError(f"column {col} must be {'an integer' if integer else 'a number'}, got {v!r}")
    return x


def _rows(path: Path, reader: csv.DictReader[str]) -> list[Row]:
    out = []
    for r in reader:
        num = partial(_num, r)
        mb, seq = int(num("micro_batch", integer=True)), int(num("seq", integer=True))
        ok = r["status"] == "ok"
        step = num("step_s", empty=0.0)
        batch = round(num("tokens_per_s") * step / seq) if ok else mb
        batch = max(batch, mb)
        stage = int(num("zero_stage", integer=True))
        plan = Plan(dp=1, zero_stage=stage, offload_optimizer=r["offload"] == "cpu",
                    activation_checkpointing=r["act_ckpt"] in ("1", "True", "true"),
                    micro_batch=mb, grad_accum=max(1, batch // mb))
        peak = num("peak_alloc_gib", empty=0.0) * 2**30
        parts = tuple(num(c) for c in ("fwd_s", "bwd_s", "opt_s")) if all(
            r.get(c) for c in ("fwd_s", "bwd_s", "opt_s")) else None
        ratio = num("ckpt_ratio") if r.get("ckpt_ratio") else None
        params = int(num("params", integer=True, empty=0))  # empty on an oom row
        out.append(Row(r["model"], params, plan, seq, batch, step, peak, r["status"],
                       parts, ratio))  # type: ignore[arg-type]
    # an `oom` row may leave params (and the times) empty: the model's other rows give them, and
    # its global batch (an oom row has no tokens_per_s to read it from)
    known = {row.model: row.params for row in out if row.params > 0}
    batches = {row.model: row.batch for row in out if row.status == "ok"}
    if unsized := sorted(set(batches) - set(known)):  # a model that ran must give its size
        raise SystemExit(f"{path}: no row of model {unsized[0]!r} gives its params")
    return [_with_batch(replace(row, params=known.get(row.model, 0)), batches.get(row.model))
            for row in out]


def _with_batch(row: Row, batch: int | None) -> Row:
    """The row at its model's global batch, as measured on its ok rows (an ok row has it)."""
    if row.status == "ok" or batch is None or batch % row.plan.micro_batch:
        return row
    return replace(row, batch=batch, plan=replace(row.plan, grad_accum=batch // row.plan.micro_batch))


def regret(predicted: list[float], measured: list[float]) -> float:
    """1 − measured(chosen) ÷ measured(best): the throughput lost by running the plan the model
    ranks first (highest predicted throughput; `predicted` is −inf where it predicts no fit)
    instead of the best measured one (`measured`: 0 for a plan that did not run)."""
    best = max(measured)
    if best <= 0:
        return 0.0
    if max(predicted) == -np.inf:  # the model says nothing fits: nothing runs
        return 1.0
    chosen = max(range(len(predicted)), key=lambda i: predicted[i])
    return 1.0 - measured[chosen] / best


def measurements(path: Path, fit_rows: int, precision: str, device_gib: float, use_parts: bool = True,
                 count_ckpt: bool = True, verbose: bool = False,
                 oom_above_gib: float | None = None) -> tuple[float, float, float, float]:
    rows = read_rows(path)
    if oom_above_gib is not None:  # a larger GPU's table read as a smaller one's (its batch kept)
        rows = [replace(r, status="oom") if r.status == "ok" and r.peak > oom_above_gib * 2**30 else r
                for r in rows]
    # a GPU table (allocator peaks) runs on an asynchronous device; a CPU table's host and
    # "device" are the same cores, as the live planner's CPU profiles (`fitting.fit_job`)
    hw = Hardware(cpu_threads_per_gpu=1, async_device=count_ckpt)
    step_apes: list[float] = []
    mem_apes: list[float] = []
    correct = total = 0
    regrets: list[float] = []
    print(f"{'model':<16}{'rows':>5}{'fit':>4}{'step MAPE':>11}{'mem MAPE':>10}{'feasible acc':>14}"
          f"{'ckpt ratio':>12}{'regret':>8}")
    for model in sorted({r.model for r in rows}):
        mine = [r for r in rows if r.model == model]
        ok = [r for r in mine if r.status == "ok"]
        chosen = select(ok, lambda r: r.point, fit_rows)
        if not ok:  # nothing to fit the models on
            print(f"{model:<16}{len(mine):>5}   - every row oom: not fitted, not counted")
            continue
        params, batch = mine[0].params, ok[0].batch if ok else mine[0].batch
        work = Workload(params=params, global_batch=batch, grad_bytes=2 if precision == "bf16" else 4)
        perf = fit([r.sample(use_parts) for r in chosen], work, hw)
        layers, largest = _layers(model, params)
        # the ratio matters only where rows are predicted: none for a model whose rows all fit
        counted = count_ckpt and len(ok) > fit_rows
        in_table = sorted(r.ckpt_ratio for r in ok if r.ckpt_ratio)  # the profiler's, on the device
        ratio = None
        if counted:
            ratio = in_table[len(in_table) // 2] if in_table else counted_ckpt_ratio(model, mine[0].seq,
                                                                                     precision)
        stats = fit_memory([(r.plan, r.peak) for r in chosen], params=params, largest_layer_params=largest,
                           n_layer=layers, precision=precision, ckpt_ratio=ratio)  # type: ignore[arg-type]
        peaks = {id(r): estimate(r.plan, stats, gpus_per_node=1, nodes=1,
                                 precision=precision).gpu_peak for r in mine}  # type: ignore[arg-type]
        steps = {id(r): perf.predict(work, r.point, hw).iter for r in mine}  # predicted step time
        test = [r for r in ok if r not in chosen]
        s_apes = [abs(steps[id(r)] - r.step_s) / r.step_s for r in test]
        m_apes = [abs(peaks[id(r)] - r.peak) / r.peak for r in test]
        hits = [(peaks[id(r)] > device_gib * 2**30) == (r.status == "oom") for r in mine]
        step_apes += s_apes
        mem_apes += m_apes
        correct, total = correct + sum(hits), total + len(hits)
        # the plan the planner would run: the highest predicted tokens/s among rows predicted to fit
        pred_tps = [r.batch * r.seq / steps[id(r)]
                    if peaks[id(r)] <= device_gib * 2**30 else -np.inf for r in mine]
        meas_tps = [r.batch * r.seq / r.step_s if r.status == "ok" and r.step_s > 0 else 0.0 for r in mine]
        regrets.append(regret(pred_tps, meas_tps))
        if verbose:  # every row: fitted or held out, measured against predicted step time and peak
            for r in mine:
                pred = steps[id(r)]
                step = f"{r.step_s:8.3f} s {pred:8.3f} s {100 * (pred - r.step_s) / r.step_s:+7.1f}%" \
                    if r.status == "ok" else f"{'oom':>10} {pred:8.3f} s {'':>8}"
                print(f"  {r.plan.short():<22}{'fit' if r in chosen else '':>4} {step}  "
                      f"{r.peak / 2**30:7.1f} GiB {peaks[id(r)] / 2**30:7.1f} GiB")
        pct = (lambda v: f"{100 * np.mean(v):.1f}%") if test else (lambda v: "-")  # all rows fitted
        print(f"{model:<16}{len(mine):>5}{len(chosen):>4}{pct(s_apes):>11}{pct(m_apes):>10}"
              f"{100 * sum(hits) / len(hits):>13.1f}%{'-' if ratio is None else f'{ratio:.3f}':>12}"
              f"{regrets[-1]:>8.3f}")
    if not step_apes:  # every ok row was a fitting row: nothing held out to score
        raise SystemExit(f"{path}: no model has more than {fit_rows} ok rows, so every row was fitted and "
                         "none is left to score the predictions on (measure more plans per model)")
    return float(np.mean(step_apes)), float(np.mean(mem_apes)), correct / total, float(np.mean(regrets))


@dataclass(frozen=True)
class RubickFit:
    work: Workload
    measured: list[traces.TraceRow]  # the placements table: the fit's candidates and the test rows
    chosen: list[traces.TraceRow]
    test: list[traces.TraceRow]
    fit: Fit
    predicted: list[float]  # iteration time of each test row
    apes: list[float]


def rubick_model(root: Path, model: str, fit_rows: int, order: random.Random | None = None) -> RubickFit:
    """Select at most `fit_rows` of the model's profile and placement rows, fit, predict the rest.
    `order` shuffles the candidates first (profile rows still first, each group shuffled)."""
    hw = Hardware()
    work = traces.workload(root, model)
    measured = traces.placements(root, model)
    prof, meas = traces.profile_rows(root, model), list(measured)
    if order is not None:
        order.shuffle(prof)
        order.shuffle(meas)
    chosen = select(prof + meas, lambda r: r.sample.point, fit_rows)
    keys = {(r.exec_plan, r.placement) for r in chosen}
    model_fit = fit([r.sample for r in chosen], work, hw)
    test = [r for r in measured if (r.exec_plan, r.placement) not in keys]
    predicted = [model_fit.predict(work, r.sample.point, hw).iter for r in test]
    apes = [abs(p - r.sample.iter_s) / r.sample.iter_s for p, r in zip(predicted, test, strict=True)]
    return RubickFit(work=work, measured=measured, chosen=chosen, test=test, fit=model_fit,
                     predicted=predicted, apes=apes)


def rubick_orders(root: Path, fit_rows: int, orders: int) -> list[float]:
    """perfmodel_mape with each model's candidate rows in `orders` other seeded orders. The
    selection's ties go to the earlier row, so this measures how much the figure owes to the
    files' row order."""
    out = []
    for seed in range(1, orders + 1):
        rng = random.Random(seed)
        per_model = [np.mean(rubick_model(root, m, fit_rows, rng).apes) for m in traces.MODELS]
        out.append(float(np.mean(per_model)))
        print(f"  order {seed}: {out[-1]:.4f}", flush=True)
    return out


def floor_mapes(r: RubickFit) -> tuple[float, float]:
    """The model form's reach on one model's table: in-sample MAPE of T_iter when fitted on
    every measured row, with their parts (as the fit runs) and on iteration times alone (the
    scored quantity; the parts of some tables are split differently from their profiles)."""
    rows = [m.sample for m in r.measured]
    bare = [Sample(point=s.point, iter_s=s.iter_s) for s in rows]
    return (fit(rows, r.work, Hardware(), restarts=4).mape, fit(bare, r.work, Hardware(), restarts=4).mape)


def rubick_regret(r: RubickFit) -> float:
    """Mean over GPU counts n of the regret of the resource-matrix choice at n: the measured row
    (plan, placement) on n GPUs the model predicts fastest against the fastest measured one."""
    by_n: dict[int, list[traces.TraceRow]] = {}
    for row in r.measured:
        by_n.setdefault(sum(int(c) for c in row.placement), []).append(row)
    out = []
    for rows in by_n.values():
        pred = [-r.fit.predict(r.work, row.sample.point, Hardware()).iter for row in rows]
        out.append(regret(pred, [1.0 / row.sample.iter_s for row in rows]))
    return float(np.mean(out))


def rubick(root: Path, fit_rows: int, verbose: bool, floor: bool) -> tuple[float, float]:
    print(f"{'model':<9}{'fit':>4}{'pred':>6}{'fit err':>9}{'MAPE':>8}{'max APE':>9}"
          + (f"{'all rows':>9}{'T_iter':>8}" if floor else "") + "  families")
    mapes = []
    regrets = []
    floors: list[tuple[float, float]] = []
    for model in traces.MODELS:
        r = rubick_model(root, model, fit_rows)
        if verbose:
            for row, pred, ape in zip(r.test, r.predicted, r.apes, strict=True):
                print(f"    {row.exec_plan:>13} {row.placement:>9}  measured {row.sample.iter_s:8.3f}  "
                      f"predicted {pred:8.3f}  {100 * ape:5.1f}%")
        mape = float(np.mean(r.apes))
        mapes.append(mape)
        regrets.append(rubick_regret(r))
        fams = sorted({family(c.sample.point) for c in r.chosen})
        low = ""
        if floor:  # the model form's reach: its in-sample error when fitted on every measured row
            floors.append(floor_mapes(r))
            low = f"{100 * floors[-1][0]:>8.1f}%{100 * floors[-1][1]:>7.1f}%"
        print(f"{model:<9}{len(r.chosen):>4}{len(r.test):>6}{100 * r.fit.mape:>8.1f}%{100 * mape:>7.1f}%"
              f"{100 * max(r.apes):>8.1f}%{low}  {','.join(fams)}  regret {regrets[-1]:.3f}")
    if floors:
        with_parts, bare = np.mean(floors, axis=0)
        print(f"fitted on every row (in-sample): mean {with_parts:.4f} with the parts, {bare:.4f} on "
              "iteration times alone")
    return float(np.mean(mapes)), float(np.mean(regrets))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rubick", type=Path, help="directory of the Rubick artifact tables")
    ap.add_argument("--measurements", type=Path, help="CSV of single-GPU measurements")
    ap.add_argument("--fit-rows", type=count(1), default=None)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--device-mem-gib", type=amount(), default=80.0)
    ap.add_argument("--oom-above", type=amount(), default=None, metavar="GIB",
                    help="--measurements: read ok rows whose peak is above GIB as oom (a larger GPU's "
                         "table as a smaller GPU's)")
    ap.add_argument("--no-parts", action="store_true",
                    help="--measurements: fit on step times alone even where the table has the "
                         "profiler's fwd_s, bwd_s, opt_s columns")
    ap.add_argument("--peaks", choices=["allocated", "rss"], default="allocated",
                    help="--measurements: what the table's peak_alloc_gib is: the allocator's live bytes "
                         "(torch.cuda.max_memory_allocated, the issue's column) or a CPU run's resident-set "
                         "growth (measure_plans on the CPU). Live bytes tie checkpointed activations at "
                         "the ratio counted from the model; the resident set, which does not follow live "
                         "tensors, at the textbook 2/L, as the live planner does for CPU profiles. "
                         "rss also marks the table as a CPU run, whose host and device work add "
                         "(Hardware.async_device)")
    ap.add_argument("--orders", type=count(0), default=0,
                    help="--rubick: also refit with each model's rows in N other seeded orders (profile rows "
                         "first, each group shuffled; the selection breaks ties by order) and print the "
                         "spread of perfmodel_mape before the final line (~20 s per order)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--floor", action="store_true",
                    help="also fit every measured row of a model and print that in-sample error, with the "
                         "rows' parts and on iteration times alone: how well the model form can "
                         "describe the table at all (about two minutes)")
    args = ap.parse_args()
    if args.rubick:
        mape, plan_regret = rubick(args.rubick, args.fit_rows or 8, args.verbose, args.floor)
        if args.orders:
            spread = rubick_orders(args.rubick, args.fit_rows or 8, args.orders)
            print(f"in {args.orders} other row orders: median {np.median(spread):.4f}, "
                  f"min {min(spread):.4f}, max {max(spread):.4f} (the files' order: {mape:.4f})")
            mape = float(np.median(spread))  # the median over orders (issue 19)
        print(f"plan_regret: {plan_regret:.4f}")
        print(f"perfmodel_mape: {mape:.4f}")
    elif args.measurements:
        step, mem, feas, plan_regret = measurements(args.measurements, args.fit_rows or 4, args.precision,
                                       args.device_mem_gib, use_parts=not args.no_parts,
                                       count_ckpt=args.peaks == "allocated", verbose=args.verbose,
                                       oom_above_gib=args.oom_above)
        print(f"plan_regret: {plan_regret:.4f}")
        print(f"perfmodel_mape: {step:.4f}")
        print(f"memory_mape: {mem:.4f}")
        print(f"feasibility_accuracy: {feas:.4f}")
    else:
        ap.error("give --rubick DIR or --measurements FILE.csv")


if __name__ == "__main__":
    main()
