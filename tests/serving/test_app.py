"""The GPT Serve application on a real local Ray cluster, over real HTTP: a Tidal job's checkpoint
served on the inference pool's labelled node, bad input answered 400, and a replayed surge that
Serve's autoscaler answers with a second replica and no failed request."""

from __future__ import annotations

import contextlib
import http.client
import json
import multiprocessing as mp
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import torch

from tidal.serving.app import BadRequest, parse_request

VOCAB = "abc :\n"


def test_parse_request_names_the_field() -> None:
    assert parse_request({"prompt": "ab", "max_new_tokens": 3}, VOCAB) == ("ab", 3, 0)
    for body, field in [([], "JSON object"), ({}, "prompt"), ({"prompt": "xyz"}, "vocabulary"),
                        ({"prompt": "a", "max_new_tokens": 0}, "max_new_tokens"),
                        ({"prompt": "a", "max_new_tokens": True}, "max_new_tokens"),
                        ({"prompt": "a", "seed": "1"}, "seed"), ({"prompt": "a", "seed": 2**64}, "seed"),
                        ({"prompt": "a", "seed": -(2**63) - 1}, "seed")]:
        with pytest.raises(BadRequest, match=field):
            parse_request(body, VOCAB)
    for seed in (-(2**63), 2**64 - 1):  # the ends of the range: torch seeds a generator with them
        assert parse_request({"prompt": "a", "seed": seed}, VOCAB)[2] == seed
        torch.Generator().manual_seed(seed)


def flood_once(url: str, n: int = 300) -> list[tuple[int, float, str | None, float | None]]:
    """`n` concurrent requests at once, from their own threads: for each, (status, seconds to
    the answer, Retry-After, seconds the model spent on it when served)."""
    answers: list[tuple[int, float, str | None, float | None]] = []
    lock, go = threading.Lock(), threading.Event()

    def one(i: int) -> None:
        req = urllib.request.Request(url, method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"prompt": "To be, or not", "max_new_tokens": 32,
                                                      "seed": i}).encode())
        go.wait()
        t = time.monotonic()
        got: tuple[int, float, str | None, float | None]
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                out = json.loads(r.read())
                got = (r.status, time.monotonic() - t, None, out["seconds"])
        except urllib.error.HTTPError as e:
            got = (e.code, time.monotonic() - t, e.headers.get("Retry-After"), None)
        except OSError:
            got = (0, time.monotonic() - t, None, None)
        with lock:
            answers.append(got)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    go.set()
    for th in threads:
        th.join()
    return answers


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_serve_a_tidal_checkpoint_under_a_surge(ray_cluster: Any, inference_node: str) -> None:
    import ray
    from ray import serve
    from ray.util.state import list_actors

    from tests.conftest import tiny_gpt_spec
    from tidal import Plan, Resources, run
    from tidal.serving.app import gpt_app
    from tidal.serving.demand import ServeDemand
    from tidal.serving.traffic import p99, post_json, replay

    model = dict(seq_len=32, d_model=64, n_layer=2, n_head=4)
    spec = tiny_gpt_spec(total_steps=10, checkpoint_every=10)
    trained = run(spec, Plan(dp=1, micro_batch=8), Resources(num_workers=1, gpus_per_worker=1,
                                                              node_ids=(ray_cluster.node_ids[0],)))
    assert trained.finished and trained.checkpoint

    port = 8431
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(gpt_app(checkpoint=trained.checkpoint, model=model, min_replicas=1, max_replicas=2,
                          replica_rps=10.0, upscale_delay_s=1.0, downscale_delay_s=600.0),
                  name="gpt", route_prefix="/gpt")
        url = f"http://127.0.0.1:{port}/gpt"
        # serve.run returns once the app runs; the proxy learns its route a moment later (a 404
        # until then, seen once on a loaded host)
        deadline = time.time() + 30
        while (status_out := post_json(url, {"prompt": "ROMEO:", "max_new_tokens": 8}, 30))[0] == 404:
            assert time.time() < deadline, "the route /gpt never appeared"
            time.sleep(0.5)
        status, out = status_out
        assert status == 200 and out is not None and len(out["completion"]) == 8 and out["step"] == 10
        status, _ = post_json(url, {"prompt": "ROMEO:", "max_new_tokens": 10_000}, 30)
        assert status == 400

        def replicas() -> list[Any]:
            return [a for a in list_actors(filters=[("state", "=", "ALIVE")])
                    if "ServeReplica:gpt" in (a.class_name or "")]

        assert [a.node_id for a in replicas()] == [inference_node]  # placed by the pool label

        body = lambda i: {"prompt": "To be, or not", "max_new_tokens": 32, "seed": i}  # noqa: E731
        rng = np.random.default_rng(0)
        phases = {}
        for name, rate, secs in (("before", 2.0, 6.0), ("surge", 60.0, 15.0), ("after", 2.0, 6.0)):
            sched = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * secs * 2)))
            sent = replay(url, sched[sched < secs], body, max_s=secs, concurrency=48)
            phases[name] = sent
            if name == "surge":
                deadline = time.time() + 30
                while len(replicas()) < 2 and time.time() < deadline:
                    time.sleep(0.5)
                scaled = len(replicas())
        for name, sent in phases.items():
            lat = [s.latency_s for s in sent if s.status == 200]
            print(f"{name:>6}: {len(sent)} requests, p99 {p99(lat):.3f} s, "
                  f"errors {sum(s.status != 200 for s in sent)}")
            failed = [(s.status, round(s.at, 1), round(s.latency_s, 1)) for s in sent if s.status != 200]
            assert sent and not failed, f"{name}: (status, sent at s, latency s) of the failed: {failed[:20]}"
        assert scaled == 2, "Serve did not add a replica under the surge"
        assert all(a.node_id == inference_node for a in replicas())

        # overload: a 10-MB body is refused from its length, before any parsing (the answer comes
        # while the body is still being sent: the client reads it after the first megabyte, as
        # one that sends `Expect: 100-continue` would not even send that)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        t = time.monotonic()
        conn.putrequest("POST", "/gpt")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(10_000_000))
        conn.endheaders()
        with contextlib.suppress(OSError):  # the server may answer and close before it is through
            conn.send(b"{" + b" " * 1_000_000)
        code = conn.getresponse().status
        took = time.monotonic() - t
        conn.close()
        print(f"10-MB body: {code} in {1000 * took:.0f} ms")
        assert code == 413 and took < 0.1
        # floods of 300 concurrent requests at an app of one replica and a short queue: each is
        # answered within 5 s, served or refused with 503 and Retry-After, none waits long; a
        # training run beside them is undisturbed
        serve.run(gpt_app(checkpoint=trained.checkpoint, model=model, min_replicas=1, max_replicas=1,
                          max_queued_requests=8), name="flood", route_prefix="/flood")
        flood = f"http://127.0.0.1:{port}/flood"
        deadline = time.time() + 30
        while post_json(flood, {"prompt": "ROMEO:", "max_new_tokens": 8}, 30)[0] == 404:
            assert time.time() < deadline, "the route /flood never appeared"
            time.sleep(0.5)

        # the floods go on until a training run on the training pool, the same as the first, has
        # ended (Ray Train's driver runs in this process; the floods come from another, as users'
        # requests would): each flood is answered as above, and the run ends as the first did,
        # loss for loss
        floods: list[list[tuple[int, float, str | None, float | None]]] = []
        trained_again = threading.Event()
        clients = mp.get_context("spawn").Pool(1)

        def keep_flooding() -> None:
            while not floods or not trained_again.is_set():
                floods.append(clients.apply(flood_once, (flood,)))

        flooder = threading.Thread(target=keep_flooding)
        flooder.start()
        try:
            again = run(spec, Plan(dp=1, micro_batch=8), Resources(num_workers=1, gpus_per_worker=1,
                                                                   node_ids=(ray_cluster.node_ids[0],)))
        finally:
            trained_again.set()
            flooder.join()
            clients.close()
        for k, answers in enumerate(floods, 1):
            codes = {c: sum(a[0] == c for a in answers) for c in {a[0] for a in answers}}
            for c in sorted(codes):
                lat = sorted(a[1] for a in answers if a[0] == c)
                print(f"flood {k} of 300: {codes[c]} answered {c}, latency p50 "
                      f"{lat[len(lat) // 2]:.2f} s, max {lat[-1]:.2f} s")
            print(f"flood {k}: the longest a served request spent in the model "
                  f"{max((a[3] for a in answers if a[3] is not None), default=0):.2f} s")
            assert len(answers) == 300 and set(codes) <= {200, 503} and codes.get(200, 0) >= 1
            assert codes.get(503, 0) >= 1 and max(a[1] for a in answers) <= 5.0
            assert all(a[2] == "1" for a in answers if a[0] == 503)  # shed ones say when to come back
        print(f"training under {len(floods)} floods: {again.final_step} steps in {again.wall_s:.0f} s")
        assert again.finished and again.losses == pytest.approx(trained.losses, rel=1e-6, abs=0)

        # one brain: every app runs Tidal's autoscaling policy in Serve's controller, which
        # publishes each deployment's need; the scheduler's side reads them and publishes the
        # replicas the loan step keeps as floors, and Serve runs them warm with no traffic
        serve.delete("flood")
        serve.run(gpt_app(checkpoint=trained.checkpoint, model=model, min_replicas=1, max_replicas=2,
                          upscale_delay_s=1.0), name="warm", route_prefix="/warm")
        demand = ServeDemand()
        deadline = time.time() + 30
        while set(demand.needs) != {"gpt/gpt", "warm/gpt"}:
            assert time.time() < deadline, f"needs never published: {demand.needs}"
            demand()
            time.sleep(0.5)
        assert demand.others == 0 and all(n < 1 for n in demand.needs.values())  # no traffic

        def warm() -> int:
            return sum(1 for a in list_actors(filters=[("state", "=", "ALIVE")])
                       if "ServeReplica:warm" in (a.class_name or ""))

        assert warm() == 1
        t = time.monotonic()
        deadline = time.time() + 60
        while warm() < 2:  # 4 kept, needs ~0: a spare of 4 shared 2 and 2 (each app's maximum)
            assert time.time() < deadline, "Serve never ran the floor's replicas"
            demand.publish(4)  # the scheduler publishes each tick
            time.sleep(1.0)
        print(f"floor of 2: the second replica alive {time.monotonic() - t:.1f} s after it was published")
    finally:
        serve.shutdown()
    assert ray.is_initialized()
