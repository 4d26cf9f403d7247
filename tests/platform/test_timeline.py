"""The demo's record: samples from status rows, the summary's integrals, job stories, plots."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.platform.timeline import (
    job_story,
    lent_gpu_seconds,
    longest_serve_wait,
    plot_curves,
    plot_latency,
    plot_timeline,
    restart_rows,
    sample_of,
    serving_stats,
    training_jobs,
    utilisation,
)
from tidal.serving.traffic import Sent

POOL = {"t1": "training", "t2": "training", "i1": "inference"}


def _row(name: str, state: str, alloc: list[list[object]], step: int = 0) -> dict[str, object]:
    return {"name": name, "state": state, "allocation": alloc, "plan": "dp2-z1", "step": step}


def test_a_sample_splits_each_jobs_gpus_by_pool() -> None:
    s = sample_of(3.0, [_row("a", "RUNNING", [["t1", 2], ["i1", 1]]), _row("b", "QUEUED", [])], POOL,
                  {"lendable": 2}, serve_running=1, serve_wanted=2)
    assert s.jobs["a"].gpus == {"training": 2, "inference": 1}
    assert s.jobs["b"].gpus == {"training": 0, "inference": 0}
    assert (s.used("training"), s.used("inference"), s.lendable) == (2, 1, 2)
    # a node the record does not know is the training pool's (unlabelled nodes are)
    unknown = sample_of(0.0, [_row("c", "RUNNING", [["new", 1]])], POOL, {}, 0, 0)
    assert unknown.jobs["c"].gpus["training"] == 1


def test_utilisation_and_lent_gpu_seconds_integrate_step_functions() -> None:
    rows = [
        (0.0, [["t1", 2], ["i1", 2]], 1),   # held 10 s: training 2, lent 2, Serve 1
        (10.0, [["t1", 4]], 4),             # held 30 s: training 4, lent 0, Serve 4
        (40.0, [], 0),                      # the last sample ends the record
    ]
    samples = [sample_of(t, [_row("a", "RUNNING", a)], POOL, {}, serve_running=r, serve_wanted=r)
               for t, a, r in rows]
    u = utilisation(samples, {"training": 4, "inference": 4})
    assert u["training"] == pytest.approx((2 * 10 + 4 * 30) / (4 * 40))
    assert u["inference"] == pytest.approx((3 * 10 + 4 * 30) / (4 * 40))
    assert lent_gpu_seconds(samples) == pytest.approx(20.0)
    assert utilisation(samples[:1], {"training": 4, "inference": 4}) == {"training": 0.0, "inference": 0.0}


def test_serving_stats_count_failures_against_the_slo() -> None:
    sent = [Sent(at=i, latency_s=0.05, status=200) for i in range(97)]
    sent += [Sent(at=97, latency_s=0.5, status=200), Sent(at=98, latency_s=0.01, status=503),
             Sent(at=99, latency_s=30.0, status=0)]
    st = serving_stats(sent, slo_s=0.1)
    assert (st.requests, st.failed) == (100, 2)
    assert st.slo_attainment == pytest.approx(0.97)
    assert st.p50_s == pytest.approx(0.05) and 0.05 < st.p99_s <= 0.5


def test_a_jobs_story_reads_its_state_changes() -> None:
    ev = [{"t": 100.0, "from": None, "to": "PROFILING", "note": "submitted"},
          {"t": 110.0, "from": "PROFILING", "to": "QUEUED", "note": "planned"},
          {"t": 115.0, "from": "QUEUED", "to": "RUNNING", "note": "launched"},
          {"t": 150.0, "from": "RUNNING", "to": "STOPPING", "note": "reclaim: Serve wants 4"},
          {"t": 152.0, "from": "STOPPING", "to": "QUEUED", "note": "stopped"},
          {"t": 153.0, "from": "QUEUED", "to": "RUNNING", "note": "launched"},
          {"t": 160.0, "from": "RUNNING", "to": "STOPPING", "note": "reconfigure: grow"},
          {"t": 200.0, "from": "RUNNING", "to": "SUCCEEDED", "note": "finished"}]
    s = job_story("a", ev, t0=90.0)
    assert (s.submitted, s.started, s.ended, s.final_state) == (10.0, 25.0, 110.0, "SUCCEEDED")
    assert (s.queued, s.jct) == (15.0, 100.0)
    assert [m.what for m in s.markers] == ["submit", "start", "reclaim", "reconfigure", "end"]


def test_the_plots_are_written(tmp_path: Path) -> None:
    samples = [sample_of(float(t), [_row("a", "RUNNING", [["t1", 2], ["i1", t % 3]], step=t)], POOL,
                         {"lendable": 2}, serve_running=1, serve_wanted=1 + t % 2) for t in range(20)]
    stories = [job_story("a", [{"t": 0.0, "to": "PROFILING"}, {"t": 2.0, "to": "RUNNING"},
                               {"t": 9.0, "to": "STOPPING", "note": "reclaim"},
                               {"t": 19.0, "to": "SUCCEEDED"}], 0.0)]
    sent = [Sent(at=i * 0.1, latency_s=0.02 + 0.001 * i, status=200 if i % 50 else 503) for i in range(150)]
    curves = {"a": [{"step": k, "loss": 4.0 / k, "lr": 1e-3, "plan": "dp2" if k < 10 else "dp1"}
                    for k in range(1, 20)]}
    for name, draw in [("t.png", lambda p: plot_timeline(samples, stories, {"training": 4, "inference": 4},
                                                          sent, 0.1, p)),
                       ("l.png", lambda p: plot_latency(sent, 0.1, p)),
                       ("c.png", lambda p: plot_curves(curves, p))]:
        draw(tmp_path / name)
        assert (tmp_path / name).stat().st_size > 10_000


def test_the_longest_wait_for_replicas_is_the_longest_unmet_stretch() -> None:
    pattern = [(0, 1, 1), (5, 4, 1), (9, 4, 2), (17, 4, 4), (20, 2, 1), (23, 2, 2), (30, 2, 2)]
    samples = [sample_of(float(t), [], POOL, {}, serve_running=r, serve_wanted=w) for t, w, r in pattern]
    assert longest_serve_wait(samples) == 12.0
    assert longest_serve_wait(samples[:1]) == 0.0


def test_a_job_trains_only_where_its_compute_steps_advance() -> None:
    """Held GPUs are not training: a run that starts, stops before a step and starts again shows
    as held; the trained utilisation counts the stretch in which it stepped."""
    # job a holds 2 training GPUs from t=0 to 60; it steps only from t=30 to 40
    steps = {t: 0 if t <= 30 else min(t - 30, 10) for t in range(0, 61, 5)}
    samples = [sample_of(float(t), [_row("a", "RUNNING", [["t1", 2]], step=k)], POOL, {}, 0, 0)
               for t, k in steps.items()]
    active = training_jobs(samples, window_s=5.0)
    assert [s.t for s, a in zip(samples, active, strict=True) if "a" in a] == [30.0, 35.0, 40.0, 45.0]
    held = utilisation(samples, {"training": 4, "inference": 4})["training"]
    trained = utilisation(samples, {"training": 4, "inference": 4}, trained=True)["training"]
    assert held == pytest.approx(0.5)
    # with the default window (10 s) the samples at 25-50 s train, each holding 2 GPUs for 5 s
    assert trained == pytest.approx(6 * 2 * 5 / (4 * 60))
    # compute steps count, not data steps: an AutoLRS job probing trains
    probing = [sample_of(float(t), [{**_row("p", "RUNNING", [["t1", 1]], step=3), "compute_steps": t}],
                         POOL, {}, 0, 0) for t in range(0, 20, 5)]
    assert all("p" in a for a in training_jobs(probing, window_s=5.0)[1:])


def test_a_restart_marks_the_first_row_a_new_run_wrote() -> None:
    rows = [{"step": k, "time": 100.0 + k} for k in range(1, 6)]
    rows += [{"step": k, "time": 200.0 + k} for k in range(4, 9)]  # resumed from step 3's checkpoint
    assert restart_rows(rows, [150.0, 180.0]) == [5]  # the second launch never stepped: one mark
    assert restart_rows(rows, [300.0]) == []  # a relaunch after the last row marks nothing
    ev = [{"t": 0.0, "to": "PROFILING"}, {"t": 5.0, "to": "RUNNING"}, {"t": 50.0, "to": "STOPPING"},
          {"t": 52.0, "to": "QUEUED"}, {"t": 53.0, "to": "RUNNING"}, {"t": 90.0, "to": "SUCCEEDED"}]
    assert job_story("a", ev, t0=0.0).relaunches == [53.0]
