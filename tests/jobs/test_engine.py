"""Host settings of a training worker (`tidal.jobs.engine`), no cluster."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import threading
import time

import pytest

from tidal.jobs.engine import CPU_TRAINING_NICE, yield_cpu_to_serving


def _priority_after(use_cuda: bool, q: mp.Queue) -> None:
    """The priorities of every thread: one started before the call, the caller, one after."""
    stop = threading.Event()
    before = threading.Thread(target=stop.wait)
    before.start()
    yield_cpu_to_serving(use_cuda)
    yield_cpu_to_serving(use_cuda)  # a second call does not lower it further
    after = threading.Thread(target=stop.wait)
    after.start()
    q.put([os.getpriority(os.PRIO_PROCESS, t) for t in (before.native_id, 0, after.native_id)])
    stop.set()


@pytest.mark.parametrize("use_cuda", [False, True])
def test_training_yields_the_cpu_to_serve_on_logical_gpus_only(use_cuda: bool) -> None:
    """On logical GPUs a worker runs at nice CPU_TRAINING_NICE (Serve's replicas share its
    cores); on a real GPU its priority is left alone."""
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    p = ctx.Process(target=_priority_after, args=(use_cuda, q))
    p.start()
    got = q.get(timeout=60)
    p.join()
    here = os.getpriority(os.PRIO_PROCESS, 0)
    assert got == [here if use_cuda else max(here, CPU_TRAINING_NICE)] * 3


def _claim_from_ray_nice(q: mp.Queue) -> None:
    """A replica's view: started at Ray's worker nice 15, then claims the CPU."""
    from tidal.serving.app import claim_cpu_before_training

    os.setpriority(os.PRIO_PROCESS, 0, 15)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    ok = claim_cpu_before_training()
    q.put((ok, [os.getpriority(os.PRIO_PROCESS, t) for t in (0, other.native_id)]))
    stop.set()


def test_a_replica_on_logical_gpus_claims_the_cpu_where_the_os_allows() -> None:
    """A Serve replica without a GPU moves every thread, and every thread of Serve's HTTP proxy
    on the machine (a process titled as Ray titles it), from Ray's nice 15 to SERVING_NICE where
    it may raise priorities (root, CAP_SYS_NICE), and says whether it could; elsewhere they stay
    at 15 and training's yield alone separates them."""
    from tidal.serving.app import SERVING_NICE, serve_proxies

    proxy = subprocess.Popen(["bash", "-c", "exec -a ray::ProxyActor sleep 60"],
                             preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, 15))
    try:
        deadline = time.monotonic() + 10
        while proxy.pid not in serve_proxies():
            assert time.monotonic() < deadline, "the stand-in proxy was never found"
            time.sleep(0.05)
        ctx = mp.get_context("spawn")
        q: mp.Queue = ctx.Queue()
        p = ctx.Process(target=_claim_from_ray_nice, args=(q,))
        p.start()
        ok, nices = q.get(timeout=60)
        p.join()
        proxy_nice = os.getpriority(os.PRIO_PROCESS, proxy.pid)
    finally:
        proxy.kill()
        proxy.wait()
    may_raise = os.geteuid() == 0  # CAP_SYS_NICE without root is not set up by this project
    assert ok is may_raise
    assert nices == [SERVING_NICE if may_raise else 15] * 2
    assert proxy_nice == (SERVING_NICE if may_raise else 15)
    assert os.getpid() not in serve_proxies()
