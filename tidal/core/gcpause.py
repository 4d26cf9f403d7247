"""Pause Python's cyclic garbage collector around a burst of allocation, as the callers of a
pure function choose to: the function itself leaves the interpreter alone.

A policy round allocates hundreds of thousands of short-lived tuples and lists, all freed by
reference counting; the cyclic collector, triggered by the allocation count, would meanwhile
scan the snapshot's long-lived objects again and again (about a quarter of a 5,000-job round:
`benchmarks/policy_latency.py`). The collector's state is restored as it was, so a caller that
had it off keeps it off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the `with` block with the cyclic collector off, then restore it as it was."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()
