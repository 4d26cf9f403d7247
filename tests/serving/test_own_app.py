"""A Serve app the user wrote (`examples/own_serve_app.py`: not Tidal's GPT app, no Tidal code in
it), placed on the inference pool by its label: the loan manager reads the replicas Serve wants
for it, lends the pool's idle GPUs to a training job, and takes them back when Serve's own
autoscaler wants more replicas under load; no request fails."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.serving.lending import hold_training_gpus, lending_config, submit_borrower, wait

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_serve_app.py"


def _user_app() -> Any:
    spec = importlib.util.spec_from_file_location("own_serve_app", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["own_serve_app"] = module
    spec.loader.exec_module(module)
    return module.app


@pytest.mark.timeout(900)
def test_a_users_own_serve_app_lends_its_idle_gpus_and_takes_them_back(
        ray_cluster: Any, inference_node: str, tmp_path: Path) -> None:
    import ray
    from ray import cloudpickle, serve

    from tests.conftest import tiny_gpt_spec
    from tidal.platform import sdk
    from tidal.serving.demand import replicas_running, replicas_wanted
    from tidal.serving.traffic import p99, replay

    others = hold_training_gpus(ray_cluster)  # the job grows past 2 GPUs only onto lent ones
    port = 8433
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    scheduler = None
    try:
        app = _user_app()
        cloudpickle.register_pickle_by_value(sys.modules["own_serve_app"])  # as `serve run` ships it
        serve.run(app, name="classifier", route_prefix="/classify")
        cfg = lending_config(tmp_path)
        scheduler = sdk.connect(cfg)
        spec = tiny_gpt_spec(name="on-loan-own", total_steps=100_000, max_gpus=4, checkpoint_every=100)
        # the user's app wants 1 replica: the pool's other 3 GPUs are idle, and 2 are lent
        job, _ = submit_borrower(scheduler, spec)
        st = job.status()
        assert inference_node in st["nodes"], st
        lent: dict[str, Any] = {"gpu_s": 0.0, "on": True}

        def count_lent() -> None:  # GPU-seconds the job held on the inference node, until reclaimed
            last = time.time()
            while lent["on"]:
                time.sleep(0.5)
                now = time.time()
                held = sum(g for n, g in job.status()["allocation"] if n == inference_node)
                lent["gpu_s"] += held * (now - last)
                last = now

        counter = threading.Thread(target=count_lent)
        counter.start()

        url = f"http://127.0.0.1:{port}/classify"
        rng = np.random.default_rng(0)

        def traffic(rate: float, secs: float) -> list[Any]:
            sched = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * secs * 2)))
            return replay(url, sched[sched < secs], lambda i: {"text": f"good day {i}"}, max_s=secs,
                          concurrency=64, timeout_s=120)

        marks: dict[str, float] = {}

        def watch() -> None:  # when Serve wants 4 replicas, and when they all run
            t_end = time.time() + 120
            while time.time() < t_end and "back" not in marks:
                status = serve.status()
                if replicas_wanted(status) >= 4:
                    marks.setdefault("want", time.time())
                if replicas_running(status) >= 4 and "want" in marks:
                    marks["back"] = time.time()
                time.sleep(0.2)

        before = traffic(2.0, 5.0)
        watcher = threading.Thread(target=watch)
        watcher.start()
        surge = traffic(30.0, 30.0)  # 6 requests in flight on average: Serve wants 3-4 replicas
        watcher.join()
        lent["on"] = False
        counter.join()
        after = traffic(2.0, 5.0)
        for name, sent in (("before", before), ("surge", surge), ("after", after)):
            lat = [s.latency_s for s in sent if s.status == 200]
            failed = [(s.status, round(s.at, 1)) for s in sent if s.status != 200]
            print(f"{name:>6}: {len(sent)} requests, p99 {p99(lat):.3f} s, failed {len(failed)}")
            assert sent and not failed, f"{name}: (status, sent at s) of the failed: {failed[:20]}"
        events = ray.get(scheduler.recent_events.remote())
        assert "back" in marks, f"the user's 4 replicas never ran: {marks}; {events}"
        print(f"the user's app got its lent GPUs back {marks['back'] - marks['want']:.1f} s after it "
              "wanted them")
        reclaims = [e for e in events if " reclaim: " in e]
        print(f"lent to the job: {lent['gpu_s']:.0f} GPU-seconds (from its growth onto the pool to the "
              f"surge's end); the reclaim: {reclaims[:1]}")
        assert reclaims, events
        assert lent["gpu_s"] > 0
        assert any("stopped at step" in e for e in events), events
        # the job goes on with what is left to it: the training pool's 2 GPUs
        wait(lambda: (s := job.status())["state"] == "RUNNING" and s["restarts"] >= 1
             and inference_node not in s["nodes"], "the job to go on off the inference pool", 300)
        job.cancel()
        assert job.wait(timeout=200, poll_s=1)["state"] == "CANCELLED"
    finally:
        serve.shutdown()
        if scheduler is not None:
            ray.kill(scheduler, no_restart=True)
        for o in others:
            ray.kill(o)
