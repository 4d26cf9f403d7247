"""Lending on a real local Ray cluster: a training job runs on inference GPUs that Serve does not
need; a surge replayed over HTTP makes Serve want them; the scheduler's loan step takes them back
by stopping the job at a step boundary with a checkpoint; Serve's replicas start on the freed
GPUs; the job goes on on fewer workers, its loss curve that of the same plans run undisturbed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.serving.lending import hold_training_gpus, lending_config, submit_borrower, wait

pytestmark = pytest.mark.integration


@pytest.mark.timeout(1200)
def test_lent_gpus_go_back_to_serve_on_a_surge(ray_cluster: Any, inference_node: str, tmp_path: Path) -> None:
    import ray
    from ray import serve

    from tests.conftest import tiny_gpt_spec
    from tidal.jobs.runner import Resources, launch
    from tidal.platform import sdk
    from tidal.platform.cli import format_pools
    from tidal.serving.app import gpt_app
    from tidal.serving.demand import replicas_running, replicas_wanted
    from tidal.serving.traffic import p99, replay

    others = hold_training_gpus(ray_cluster)  # the job grows past 2 GPUs only onto lent ones

    port = 8432
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    scheduler = None
    try:
        serve.run(gpt_app(model=dict(seq_len=32, d_model=64, n_layer=2, n_head=4), min_replicas=1,
                          max_replicas=4, replica_rps=2.0, upscale_delay_s=1.0, downscale_delay_s=900.0),
                  name="gpt", route_prefix="/gpt")
        cfg = lending_config(tmp_path)
        scheduler = sdk.connect(cfg)
        spec = tiny_gpt_spec(name="on-loan", total_steps=2400, max_gpus=4, checkpoint_every=100)
        # nothing is lent until the demand's history can bound its rise at the loan's risk
        # (`tidal.serving.loans`: H + 9 intervals at a risk of 10%): the job starts on the training
        # pool's 2 GPUs and grows onto the 2 lent ones once they are offered
        job, options = submit_borrower(scheduler, spec)
        grown = job.status()["step"]  # the surge comes once it has stepped on the loan
        wait(lambda: job.status()["step"] >= grown + 20, "20 steps on the lent GPUs", 300)
        st = job.status()
        assert st["gpus"] == 4 and inference_node in st["nodes"], (
            st, ray.get(scheduler.recent_events.remote()))
        print(format_pools(ray.get(scheduler.pools.remote())))

        url = f"http://127.0.0.1:{port}/gpt"
        body = lambda i: {"prompt": "To be, or not", "max_new_tokens": 32, "seed": i}  # noqa: E731
        rng = np.random.default_rng(0)

        def traffic(rate: float, secs: float) -> list[Any]:
            sched = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * secs * 2)))
            return replay(url, sched[sched < secs], body, max_s=secs, concurrency=64, timeout_s=120)

        before = traffic(2.0, 5.0)
        # the surge, with the GPUs' return timed from a second thread
        import threading

        marks: dict[str, float] = {}

        def watch() -> None:
            t_end = time.time() + 90
            while time.time() < t_end:
                status = serve.status()
                want = replicas_wanted(status)
                running = replicas_running(status)
                if want >= 4 and "want" not in marks:
                    marks["want"] = time.time()
                if running >= 4 and "want" in marks:
                    marks["back"] = time.time()
                    return
                time.sleep(0.2)

        # a scheduler restarted in the middle: once the reclaim has stopped the job, the actor is
        # killed (Ray restarts it, as a node's loss or an OOM would; the job's runs, driven by the
        # run host, live on and are adopted); the new life reads the loan state from the store, so
        # it has the demand's history at once, where a blind one would have none (and lend nothing
        # for H + 9 intervals)
        restart: dict[str, Any] = {}

        def stopped_after_reclaim(events: list[str]) -> bool:
            reclaims = [i for i, e in enumerate(events) if " reclaim: " in e]
            return bool(reclaims) and any("stopped at step" in e for e in events[reclaims[-1]:])

        def restart_mid_surge() -> None:
            t_end = time.time() + 60
            while time.time() < t_end:
                events = ray.get(scheduler.recent_events.remote())
                if stopped_after_reclaim(events):
                    break
                time.sleep(0.25)
            restart["events"] = events  # an actor's events live in its memory, lost with it
            restart["before"] = ray.get(scheduler.pools.remote())
            life = ray.get(scheduler.incarnation.remote())
            ray.kill(scheduler, no_restart=False)
            restart["killed"] = time.time()
            wait(lambda: ray.get(scheduler.incarnation.remote(), timeout=30) != life,
                 "the scheduler's next life", 60)
            wait(lambda: "history" in ray.get(scheduler.pools.remote()), "the new life's loan step", 30)
            restart["back"] = time.time()
            restart["after"] = ray.get(scheduler.pools.remote())

        watcher = threading.Thread(target=watch)
        restarter = threading.Thread(target=restart_mid_surge)
        watcher.start()
        marks["surge"] = time.time()
        restarter.start()
        surge = traffic(40.0, 25.0)
        watcher.join()
        restarter.join()
        after = traffic(2.0, 5.0)
        for name, sent in (("before", before), ("surge", surge), ("after", after)):
            lat = [s.latency_s for s in sent if s.status == 200]
            print(f"{name:>6}: {len(sent)} requests, p99 {p99(lat):.3f} s, "
                  f"failed {sum(s.status != 200 for s in sent)}")
            failed = [(s.status, round(s.at, 1), round(s.latency_s, 1)) for s in sent if s.status != 200]
            assert sent and not failed, f"{name}: (status, sent at s, latency s) of the failed: {failed[:20]}"
        assert "after" in restart, f"the scheduler did not come back: {restart}"
        events = restart["events"] + ray.get(scheduler.recent_events.remote())
        print("\n".join(events))
        before_kill, after_restart = restart["before"], restart["after"]
        print(f"scheduler killed mid-surge, its first loan step {restart['back'] - restart['killed']:.1f} s "
              f"later: demand history {before_kill['history']} -> {after_restart['history']} samples, "
              f"forecast {before_kill['forecast']} -> {after_restart['forecast']}")
        assert before_kill["history"] > 0 and after_restart["history"] >= before_kill["history"]
        assert after_restart["forecast"] is not None  # bounded at once: the history came back
        print({k: time.strftime("%H:%M:%S", time.localtime(v)) + f".{int(v % 1 * 10)}"
               for k, v in marks.items()})
        assert "back" in marks, f"Serve's 4 replicas never ran: {marks}; {events}"
        took = marks["back"] - marks["want"]
        print(f"lent GPUs back to Serve: {took:.1f} s after it wanted them")
        # the reclaim's own part: the job has stopped (its GPUs free) after the surge began and
        # within 15 s of Serve's want. This guards against a reclaim path that waits for a tick,
        # a timeout or the job's end. The stop may come first: the loan manager forecasts demand
        # `lead_s` ahead, and the watcher sees Serve's want late on cores the surge saturates
        # (CI, 2026-11-29: stopped at 20:59:07, want seen at 20:59:09). The replicas' start after
        # that is Serve's: measured 14.6 s and 19.0 s in all, and once (CI) 36.7 s, of which the
        # stop took 3 s
        def clock(t: float) -> int:  # seconds of the day, as the events' HH:MM:SS
            lt = time.localtime(t)
            return lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec

        def since(hms: str, t: float) -> int:  # signed seconds from t to the event's time
            h, m, sec = (int(x) for x in hms.split(":"))
            return (h * 3600 + m * 60 + sec - clock(t) + 43200) % 86400 - 43200

        stops = [e for e in events if "stopped at step" in e]
        assert stops, events
        stopped = stops[-1].split()[0]
        assert since(stopped, marks["surge"]) >= 0, (marks, events)  # a stop of the surge's
        assert since(stopped, marks["want"]) <= 15, (marks, events)
        assert took <= 90.0, events
        assert any("reclaim" in e for e in events), events
        print(format_pools(ray.get(scheduler.pools.remote())))

        final = job.wait(timeout=900, poll_s=2)
        assert final["state"] == "SUCCEEDED", (final, events)
        assert final["restarts"] >= 1
        curve = job.logs()
        plans = {m.get("plan") for m in curve}
        print("plans the job ran:", sorted(str(p) for p in plans))
    finally:
        serve.shutdown()
        if scheduler is not None:
            ray.kill(scheduler, no_restart=True)
        for o in others:
            ray.kill(o)
    # the job after the reclaim ran on the training pool's 2 GPUs; its curve equals that of runs
    # not disturbed by the scheduler: the same plans, each to the step the job left it at, each
    # resumed from the last one's checkpoint. (Against one uninterrupted dp-2 run the gap is
    # float rounding of 4 against 2 ranks, ~1e-6 at first, which 2,400 steps amplify: measured
    # 1e-4 by step 1,000 and 1.7e-3 at the end on one machine, within 1e-3 on others. Against the
    # segments it measured 0: a lost optimizer state, data position or RNG would show at once.)
    assert [m["step"] for m in curve] == list(range(1, spec.total_steps + 1))
    by_name = {o.plan.short(): o.plan for o in options}
    ends = [(m["plan"], m["step"]) for m, nxt in zip(curve, [*curve[1:], {}], strict=True)
            if m["plan"] != nxt.get("plan")]
    reference: list[float] = []
    checkpoint = None
    for name, end in ends:
        plan = by_name[name]
        part = launch(spec, plan, Resources(num_workers=plan.dp, gpus_per_worker=1), checkpoint,
                      stop_at_step=end).result(timeout=900)
        reference += part.losses
        checkpoint = part.checkpoint
    rel = [abs(x - m["loss"]) / x for x, m in zip(reference, curve, strict=True)]
    print(f"segments {ends}; largest relative loss gap to the undisturbed runs: {max(rel):.2e}")
    assert max(rel) <= 1e-6
