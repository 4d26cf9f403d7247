"""Host settings of a training worker (`tidal.jobs.engine`), no cluster."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading

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
