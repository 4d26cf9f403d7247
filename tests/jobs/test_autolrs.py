"""AutoLRS: the exponential forecast, the tuner's stage logic, and probes on real DeepSpeed
engines in this process (world of one, gloo). The multi-worker reconfiguration in the middle of
a stage runs on a Ray cluster in test_runner.py."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from itertools import pairwise
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import tiny_gpt_spec
from tidal.jobs import Plan, SpecError
from tidal.jobs.autolrs import (
    AutoLRS,
    Tuner,
    TunerState,
    fit_exponential,
    forecast,
    read_range_test,
    sweep_diverged,
    sweep_lrs,
)
from tidal.jobs.checkpoint import TrainState, capture_state, restore_state
from tidal.jobs.data import StepSampler
from tidal.jobs.engine import build_engine, init_world_of_one, train_step
from tidal.jobs.worker import LoopHooks, run_loop


def test_exponential_fit_recovers_a_b_c_from_a_noisy_curve() -> None:
    rng = np.random.default_rng(7)
    for a, b, c in [(2.0, -0.05, 1.5), (0.8, -0.2, 3.1), (1.2, -0.03, 0.4)]:
        t = np.arange(1, 101, dtype=float)
        y = a * np.exp(b * t) + c + rng.normal(0, 0.01, t.size)
        fa, fb, fc = fit_exponential(t, y)
        assert fa == pytest.approx(a, rel=0.05)
        assert fb == pytest.approx(b, rel=0.05)
        assert fc == pytest.approx(c, abs=0.03)
        assert fb < 0


def test_forecast_extrapolates_a_decaying_curve_and_flags_divergence() -> None:
    t = np.arange(1, 11)
    losses = list(1.0 * np.exp(-0.15 * t) + 2.0)
    assert forecast(losses, 100) == pytest.approx(2.0 + math.exp(-15), abs=1e-3)
    assert math.isinf(forecast([3.0, 4.0, float("nan")], 50))


def test_bad_settings_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="lr_min < lr_max"):
        AutoLRS(lr_min=1e-2, lr_max=1e-3)
    with pytest.raises(ValueError, match=r"AutoLRS\.trials"):
        AutoLRS(trials=1)
    with pytest.raises(SpecError, match=r"JobSpec\.lr"):
        tiny_gpt_spec(lr="autolr")
    assert tiny_gpt_spec(lr="autolrs").autolrs == AutoLRS()


def _drive(tuner: Tuner, curve: Any, *, compute: int = 0,
           position: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Run the tuner's stage logic with a synthetic loss curve(lr, position, t) instead of a model,
    from `position` with `compute` steps spent: (the tuner's history, the compute steps spent)."""
    st = tuner.state
    while compute < tuner.budget:
        if st.searching:
            while not tuner.search_done():
                lr = tuner.ask()
                compute += st.probe_len
                tuner.tell(lr, [curve(lr, position, i) for i in range(st.probe_len)])
            tuner.choose()
            position += st.probe_len
        take = min(tuner.stage_end - position, tuner.budget - compute)
        position += take
        compute += take
        if position >= tuner.stage_end and compute < tuner.budget:  # as the worker: not past the end
            tuner.next_stage(position, compute)
    return st.history, compute


def test_tuner_stays_within_budget_prefers_good_lrs_and_is_deterministic() -> None:
    cfg = AutoLRS(lr_min=1e-4, lr_max=1e-1, trials=6, startup_trials=3, first_stage=40, probe_fraction=0.1,
                  min_probe=4, warmup_steps=0, anneal=0, search_down=True)

    def curve(lr: float, position: int, i: int) -> float:  # best LR 3e-3, decaying with progress
        return 2.0 + 0.5 * math.log10(lr / 3e-3) ** 2 + 1.0 / (1 + 0.01 * (position + i))

    a = Tuner(cfg, seed=3, budget=600)
    hist, compute = _drive(a, curve)
    assert compute <= 600
    assert [h["tau"] for h in hist][:3] == [40, 80, 160]  # τ doubles
    for h in hist:
        assert 1e-3 <= h["lr"] <= 1e-2, h  # the forecast ranks by the curve's LR penalty
    b = Tuner(cfg, seed=3, budget=600)
    assert _drive(b, curve)[0] == hist  # same state, same proposals


def test_the_adaptive_search_spends_fewer_probes_and_starts_from_the_last_winner() -> None:
    def curve(lr: float, position: int, i: int) -> float:  # best LR 3e-3 at every stage
        return 2.0 + 0.5 * math.log10(lr / 3e-3) ** 2 + 1.0 / (1 + 0.01 * (position + i))

    base = dict(lr_min=1e-4, lr_max=1e-1, trials=6, startup_trials=3, first_stage=40, probe_fraction=0.1,
                min_probe=4, warmup_steps=0, anneal=0, search_down=True)
    full = Tuner(AutoLRS(**base, min_trials=0, reuse_winner=False), seed=3, budget=1200)
    full_hist, _ = _drive(full, curve)
    adaptive = Tuner(AutoLRS(**base), seed=3, budget=1200)
    hist, compute = _drive(adaptive, curve)
    assert compute <= 1200 and len(hist) >= 3
    assert all(len(h["trials"]) == 6 for h in full_hist)
    assert all(len(h["trials"]) <= 6 for h in hist) and any(len(h["trials"]) < 6 for h in hist)
    for prev, h in pairwise(hist):
        assert h["trials"][0][0] == prev["lr"]  # the last winner is the first candidate
        # ... and the others lie within AutoLRS.max_change (3×) of it
        assert all(prev["lr"] / 3 * (1 - 1e-9) <= lr <= prev["lr"] * 3 * (1 + 1e-9) for lr, _ in h["trials"])
    # the stages both ran (the probes the adaptive search saved bought it a further stage)
    losing = lambda hs: sum((len(h["trials"]) - 1) * h["probe_len"] for h in hs[:4])  # noqa: E731
    assert [h["tau"] for h in hist[:4]] == [h["tau"] for h in full_hist[:4]]
    assert losing(hist) < 0.5 * losing(full_hist)
    for h in hist:
        assert 1e-3 <= h["lr"] <= 1e-2, h
    # a stage with no winner to start from tries its random start-up candidates and one more
    assert len(hist[0]["trials"]) >= 4
    with pytest.raises(ValueError, match=r"AutoLRS\.min_trials"):
        AutoLRS(trials=4, min_trials=5)
    with pytest.raises(ValueError, match=r"AutoLRS\.max_change"):
        AutoLRS(max_change=0.5)


def test_a_resumed_tuner_asks_what_the_original_would() -> None:
    cfg = AutoLRS(lr_min=1e-4, lr_max=3e-2, trials=5, startup_trials=2, first_stage=20)
    a = Tuner(cfg, seed=1, budget=200)
    for _ in range(3):
        lr = a.ask()
        a.tell(lr, [3.0 - 0.1 * i - lr for i in range(a.state.probe_len)])
    copy = Tuner(cfg, seed=1, budget=200, state=TunerState.from_dict(a.state.to_dict()))
    assert copy.ask() == a.ask()


@pytest.fixture(scope="module")
def world_of_one() -> Iterator[None]:
    init_world_of_one("gloo")
    yield


@pytest.mark.parametrize("stage", [1, 3])
def test_probes_leave_no_trace(world_of_one: None, stage: int) -> None:
    """k probes of τ′ steps at different LRs, each from the same snapshot, then a restore: the
    next step's loss (and the one after) equal those of an engine that never probed."""
    spec = tiny_gpt_spec(weight_decay=0.1)
    plan = Plan(dp=1, zero_stage=stage, micro_batch=4, grad_accum=2)
    data = spec.dataset()
    sampler = StepSampler(len(data), spec.global_batch, spec.seed)
    cpu = torch.device("cpu")

    def steps(engine: Any, positions: range, lr: float) -> list[float]:
        return [float(train_step(engine, spec, plan, data, sampler, k, 0, cpu, lr)) for k in positions]

    plain = build_engine(spec, plan, cpu)
    steps(plain, range(0, 5), 3e-3)
    expected = steps(plain, range(5, 7), 3e-3)

    probed = build_engine(spec, plan, cpu)
    steps(probed, range(0, 5), 3e-3)
    snap = capture_state(probed, step=5, seed=spec.seed, rank=0, all_ranks=True)
    assert snap is not None
    seen = []
    for lr in (1e-2, 1e-4, 3e-2):
        restore_state(probed, snap)
        seen.append(steps(probed, range(5, 8), lr))
    assert seen[0] != seen[1]  # the probes really trained with different LRs
    restore_state(probed, snap)
    assert steps(probed, range(5, 7), 3e-3) == pytest.approx(expected, rel=1e-6)


class _Keep(LoopHooks):
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.saved: TrainState | None = None

    def emit(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def save(self, state: TrainState | None, row: dict[str, Any]) -> None:
        self.saved = state


def _run(spec: Any, plan: Plan, start: TrainState | None, stop_at: int | None) -> _Keep:
    engine = build_engine(spec, plan, torch.device("cpu"))
    if start is not None:
        restore_state(engine, start)
    hooks = _Keep()
    run_loop(engine, spec, plan, torch.device("cpu"), rank=0, world=1, dataset=spec.dataset(),
             start=start, stop_at=stop_at, hooks=hooks)
    return hooks


@pytest.mark.parametrize("stop_at", [7, 14])  # in the middle of a probe; in the stage's training
def test_a_stop_in_the_middle_of_a_stage_resumes_it_under_another_plan(world_of_one: None,
                                                                        stop_at: int) -> None:
    tuner = AutoLRS(lr_min=1e-4, lr_max=3e-2, trials=3, startup_trials=2, first_stage=12, min_probe=3,
                    warmup_steps=0, anneal=0)
    spec = tiny_gpt_spec(lr=tuner, total_steps=50, checkpoint_every=1000)
    a = Plan(dp=1, zero_stage=1, micro_batch=8)
    whole = _run(spec, a, None, None)
    assert whole.saved is not None and whole.saved.extra["compute"] == 50
    history = whole.saved.extra["autolrs"]["history"]
    assert len(history) >= 2 and whole.rows[-1]["probe_steps"] > 0

    first = _run(spec, a, None, stop_at)
    assert first.saved is not None and first.saved.extra["compute"] == stop_at
    mid = first.saved.extra["autolrs"]
    assert mid["stage"] == 0 and (mid["searching"] if stop_at < 9 else not mid["searching"])
    second = _run(spec, Plan(dp=1, zero_stage=2, micro_batch=4, grad_accum=2), first.saved, None)
    assert second.saved is not None
    resumed = second.saved.extra["autolrs"]["history"]
    # the same stages and winners, and the same loss at every data step both runs trained
    assert [(h["stage"], h["start"], h["lr"]) for h in resumed[: len(history) - 1]] == [
        (h["stage"], h["start"], h["lr"]) for h in history[: len(history) - 1]]
    ref = {r["step"]: r["loss"] for r in whole.rows}
    got = {r["step"]: r["loss"] for r in first.rows + second.rows}
    common = sorted(set(ref) & set(got))
    assert len(common) >= 30
    # (the plans differ in micro-batching, which alone moves losses by ~2e-4 after 50 steps)
    assert [got[k] for k in common] == pytest.approx([ref[k] for k in common], rel=1e-3)


def test_warmup_comes_before_the_first_stage_and_counts_against_the_budget() -> None:
    cfg = AutoLRS(lr_min=1e-4, lr_max=3e-2, first_stage=20, warmup_steps=10, warmup_lr=2e-3, anneal=0)
    t = Tuner(cfg, seed=0, budget=100)
    assert t.state.stage_start == 10 and t.state.searching
    assert t.warmup_lr(0) == pytest.approx(2e-4) and t.warmup_lr(9) == pytest.approx(2e-3)
    tight = Tuner(cfg, seed=0, budget=20)  # 10 steps left after warm-up: no room for a search
    assert not tight.state.searching and tight.state.tau == 10


def test_a_stage_the_budget_cuts_short_probes_for_the_stage_it_runs() -> None:
    cfg = AutoLRS(lr_min=1e-4, lr_max=3e-2, first_stage=100, growth=4.0, max_stage=400, trials=2,
                  startup_trials=2, probe_fraction=0.05, min_probe=5, warmup_steps=0, anneal=0)

    def second_stage(budget: int) -> TunerState:
        t = Tuner(cfg, seed=0, budget=budget)
        assert (t.state.tau, t.state.probe_len) == (100, 5)
        t.next_stage(position=100, compute=105)  # the first stage's losing probe spent
        return t.state

    roomy = second_stage(1000)
    assert (roomy.tau, roomy.probe_len, roomy.searching) == (400, 20, True)
    cut = second_stage(105 + 146)  # 146 steps left: a 7-step probe, not a 400-step stage's 20
    assert (cut.tau, cut.probe_len, cut.searching) == (146 - 7, 7, True)
    # cut below the first stage's length, a search would cost as much as the stage: none
    short = second_stage(105 + 60)
    assert (short.tau, short.probe_len, short.searching) == (60, 0, False)


def test_the_incumbent_is_read_off_the_steps_that_trained_with_it(world_of_one: None) -> None:
    """After the first stage the last winner is not probed: its trial is the last τ′ trained
    steps' losses, forecast at τ′ + τ; only challengers cost probe steps, and a stage that a
    challenger wins loses none."""
    tuner = AutoLRS(lr_min=1e-4, lr_max=3e-2, trials=2, startup_trials=2, first_stage=12, min_probe=3,
                    probe_fraction=0.2, warmup_steps=0, anneal=0)
    spec = tiny_gpt_spec(lr=tuner, total_steps=90, checkpoint_every=1000)
    run = _run(spec, Plan(dp=1, zero_stage=1, micro_batch=8), None, None)
    assert run.saved is not None
    history = run.saved.extra["autolrs"]["history"]
    assert len(history) >= 3
    assert history[0]["observed"] == [False, False]  # no warm-up: the first stage probes both
    loss_at = {r["step"]: r["loss"] for r in run.rows}
    losing = 0
    for prev, h in pairwise(history):
        assert h["observed"] == [True, False]
        inc, value = h["trials"][0]
        assert inc == prev["lr"]
        tail = [loss_at[k] for k in range(h["start"] - h["probe_len"] + 1, h["start"] + 1)]
        assert value == pytest.approx(forecast(tail, h["probe_len"] + h["tau"]))
    for h in history:
        probed = [not o for o in h["observed"]]
        winner = min(range(len(h["trials"])), key=lambda i: h["trials"][i][1])
        losing += h["probe_len"] * (sum(probed) - probed[winner])
    assert run.rows[-1]["probe_steps"] == losing
    # with the incumbent probed (the setting off) every stage loses one probe
    off_cfg = replace(tuner, observe_incumbent=False)
    spec_off = tiny_gpt_spec(lr=off_cfg, total_steps=90, checkpoint_every=1000)
    off = _run(spec_off, Plan(dp=1, zero_stage=1, micro_batch=8), None, None)
    assert off.saved is not None
    off_history = off.saved.extra["autolrs"]["history"]
    assert off.rows[-1]["probe_steps"] == sum(h["probe_len"] for h in off_history)
    assert not any(any(h["observed"]) for h in off_history)


def _sweep_loss(lr: float) -> float:
    """A range test's loss at `lr`: falling with the LR up to 5e-3, rising past it."""
    x = math.log10(lr / 5e-3)
    return 2.0 - 0.3 * x if x <= 0 else 2.0 + 1.5 * x


def test_the_range_test_reads_the_lowest_smoothed_loss_and_stops_at_divergence() -> None:
    rng = np.random.default_rng(0)
    lrs = sweep_lrs(1e-5, 1e-1, 60)
    assert lrs[0] == pytest.approx(1e-5) and lrs[-1] == pytest.approx(1e-1)
    # a sweep's loss: falling with the LR up to 5e-3, rising past it, one noisy batch at 1e-4
    noisy = [_sweep_loss(lr) + rng.normal(0, 0.02) for lr in lrs]
    noisy[20] -= 1.0  # a single lucky batch far below the curve does not decide it
    # the knee: where the fall of 0.3 per decade from 1e-5 has 10% of its 0.81 left, 0.27 decades
    # below the lowest point (a plain argmin would be 5e-3)
    best = read_range_test(lrs, noisy)
    knee = 5e-3 * 10 ** (-0.1 * 0.3 * math.log10(5e-3 / 1e-5) / 0.3)
    assert knee / 1.5 <= best <= knee * 1.5 and best < 5e-3 / 1.5
    # cut at the first loss back above the first one: read over the steps before it
    k = next(i for i, x in enumerate(noisy) if i > 30 and x > noisy[0])
    assert not any(sweep_diverged(noisy[:j]) for j in range(k + 1)) and sweep_diverged(noisy[: k + 1])
    assert read_range_test(lrs[: k + 1], noisy[: k + 1]) == pytest.approx(best, rel=0.6)
    assert sweep_diverged([3.0, float("nan")])
    assert not sweep_diverged([3.0, 3.05, 2.8, 3.1])  # noise before the sweep has trained


def test_with_no_hints_the_budget_is_range_test_warmup_stages_anneal() -> None:
    """`lr="autolrs"`: every length from the budget; the range test sets the warm-up's peak and
    the candidates' range; the stages end where the anneal's last half of the budget begins,
    and the anneal takes the winner to zero along a half cosine by the budget's last step."""
    t = Tuner(AutoLRS(), seed=0, budget=1000)
    assert (t.range_steps, t.warmup_steps, t.first_stage, t.anneal_steps) == (40, 50, 100, 500)
    assert t.state.ranging and not t.state.searching
    losses: list[float] = []
    for lr in t.sweep():  # as the worker runs it: up to the first loss above the first
        losses.append(_sweep_loss(lr))
        if sweep_diverged(losses):
            break
    assert len(losses) < 40
    t.tell_range(losses)
    assert t.state.peak is not None and t.state.lr_range is not None
    assert t.state.lr_range == pytest.approx([t.state.peak / 10, t.state.peak * 3])
    assert t.state.peak == pytest.approx(read_range_test(t.sweep()[: len(losses)], losses))  # the knee
    assert t.warmup_lr(49) == pytest.approx(t.state.peak) and t.incumbent() == t.state.peak
    assert t.state.searching and t.state.stage_start == 50

    best = t.state.peak * 2

    def curve(lr: float, position: int, i: int) -> float:
        return 2.0 + 0.5 * math.log10(lr / best) ** 2 + 1.0 / (1 + 0.01 * (position + i))

    # the compute spent so far: the range test and the warm-up
    hist, compute = _drive(t, curve, compute=40 + 50, position=50)
    assert compute == 1000 and t.state.annealing
    anneal_start = t.state.stage_start
    assert t.state.tau == 500 and all(h["start"] + h["tau"] <= anneal_start for h in hist)
    w = t.lr
    lrs_anneal = [t.lr_at(anneal_start + k) for k in range(500)]
    assert lrs_anneal[0] == pytest.approx(w * 0.5 * (1 + math.cos(math.pi / 501)))
    assert lrs_anneal[249] == pytest.approx(w * 0.5 * (1 + math.cos(math.pi * 250 / 501)))
    assert all(a > b > 0 for a, b in pairwise(lrs_anneal)) and lrs_anneal[-1] < 0.04 * w
    for h in hist:  # every candidate inside the measured range, none below the incumbent
        assert all(t.state.lr_range[0] * (1 - 1e-9) <= lr <= t.state.lr_range[1] * (1 + 1e-9)
                   for lr, _ in h["trials"])
        assert all(lr >= h["trials"][0][0] * (1 - 1e-9) for lr, _ in h["trials"])
    assert hist[-1]["lr"] > t.state.peak  # the curve's best LR is above the peak: it climbed


@pytest.mark.parametrize("stop_at", [17, 33, 50])  # in the warm-up, a stage, the anneal
def test_lr_autolrs_resumes_each_phase_under_another_plan(world_of_one: None, stop_at: int) -> None:
    """With no hints, on a 60-step budget: a 15-step range test, a 3-step warm-up, a stage that
    searches, a stage that trains on, a 12-step anneal (a fifth of the budget: the default half
    would leave a 60-step budget no room for a search). Stopped in the warm-up, a stage's
    training or the anneal and resumed under another plan, the run makes the same decisions,
    trains every data step to the same loss, and spends exactly the budget. (A stop in the
    middle of a probe or the range test redoes it: test_a_stop_in_the_middle_of_a_stage...,
    test_a_range_test_the_budget_cuts_runs_again_on_resume.)"""
    spec = tiny_gpt_spec(lr=AutoLRS(anneal=0.2), total_steps=60, checkpoint_every=1000)
    a = Plan(dp=1, zero_stage=1, micro_batch=8)
    whole = _run(spec, a, None, None)
    assert whole.saved is not None and whole.saved.extra["compute"] == 60
    state = whole.saved.extra["autolrs"]
    assert len(state["sweep"]) <= 15 and state["peak"] is not None and state["annealing"]
    rows = whole.rows
    assert rows[-1]["compute_steps"] == 60 and rows[-1]["probe_steps"] >= len(state["sweep"])
    anneal = [r["lr"] for r in rows[-12:]]
    assert all(x > y for x, y in pairwise(anneal)) and anneal[-1] < 0.3 * anneal[0]
    assert rows[0]["lr"] < rows[2]["lr"] == pytest.approx(state["peak"])  # the warm-up's ramp

    first = _run(spec, a, None, stop_at)
    assert first.saved is not None and first.saved.extra["compute"] == stop_at
    # ZeRO-2 at the same micro-batch: a micro-batch of 4 × 2 sums each gradient in another
    # order, and at the knee's LR (~0.04 for this model) fp32's 1e-7 grows to a percent within
    # 30 steps (measured); the losses here are compared to 1e-3, the decisions exactly
    second = _run(spec, Plan(dp=1, zero_stage=2, micro_batch=8), first.saved, None)
    assert second.saved is not None and second.saved.extra["compute"] == 60
    resumed = second.saved.extra["autolrs"]["history"]
    assert [(h["stage"], h["start"], h["tau"], [lr for lr, _ in h["trials"]], h["lr"]) for h in resumed] == [
        (h["stage"], h["start"], h["tau"], [lr for lr, _ in h["trials"]], h["lr"]) for h in state["history"]]
    ref = {r["step"]: (r["loss"], r["lr"]) for r in rows}
    got = {r["step"]: (r["loss"], r["lr"]) for r in first.rows + second.rows}
    assert sorted(got) == sorted(ref)
    assert [got[k][1] for k in sorted(ref)] == pytest.approx([ref[k][1] for k in sorted(ref)], rel=1e-9)
    assert [got[k][0] for k in sorted(ref)] == pytest.approx([ref[k][0] for k in sorted(ref)], rel=1e-3)


def test_a_range_test_the_budget_cuts_runs_again_on_resume(world_of_one: None) -> None:
    spec = tiny_gpt_spec(lr="autolrs", total_steps=60, checkpoint_every=1000)
    first = _run(spec, Plan(dp=1, zero_stage=1, micro_batch=8), None, 10)
    assert first.saved is not None and first.saved.extra["compute"] == 10 and first.saved.step == 0
    assert first.saved.extra["autolrs"]["ranging"] and not first.rows
    second = _run(spec, Plan(dp=1, zero_stage=0, micro_batch=8), first.saved, None)
    assert second.saved is not None and second.saved.extra["compute"] == 60
    state = second.saved.extra["autolrs"]
    assert not state["ranging"] and len(state["sweep"]) <= 15 and state["annealing"]


def test_the_anneal_decays_along_the_shape_asked_for() -> None:
    """x = (k + 1)/(n + 1) at the anneal's k-th of n steps: w·½(1 + cos πx) by default, w·(1 − √x)
    with `anneal_shape="sqrt"`; both fall every step and end near zero."""
    shapes = (("cosine", lambda x: 0.5 * (1 + math.cos(math.pi * x))), ("sqrt", lambda x: 1 - math.sqrt(x)))
    for shape, at in shapes:
        t = Tuner(AutoLRS(lr_min=1e-3, lr_max=1e-2, anneal=0.5, anneal_shape=shape, warmup_steps=0), seed=0,
                  budget=100)
        t.state.annealing, t.state.stage_start, t.state.tau, t.state.lr = True, 50, 50, 4e-3
        lrs = [t.lr_at(50 + k) for k in range(50)]
        assert lrs == pytest.approx([4e-3 * at((k + 1) / 51) for k in range(50)])
        assert all(a > b > 0 for a, b in pairwise(lrs)) and lrs[-1] < 0.15 * lrs[0]
    with pytest.raises(ValueError, match="anneal_shape must be 'sqrt' or 'cosine', got 'linear'"):
        AutoLRS(anneal_shape="linear")
