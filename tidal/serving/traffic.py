"""Inference traffic: the Azure LLM trace's arrivals, time-scaled, under a diurnal envelope, as
a demand series for the simulator and as real HTTP requests for a live Serve app.

The trace (`../shared/traces/azure-llm/`, README there) covers one hour; a day's ebb and flow
comes from the envelope

    e(t) = low + (1 − low) · ½ (1 − cos(2π (t / period + phase)))

(low at phase 0, peak half a period later). Arrivals are thinned by e(t) for a replay (each
request kept with probability e(t), seeded), or weighted by it for a demand series.

The replayer sends each request at its scheduled time from a bounded thread pool, to a loopback
address only (127.0.0.0/8, localhost, ::1), and stops by itself after `max_requests` or
`max_s`; it records every request's send time, latency and HTTP status.
"""

from __future__ import annotations

import csv
import ipaddress
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse

import numpy as np


@dataclass(frozen=True, kw_only=True)
class Envelope:
    period_s: float = 86_400.0
    low: float = 0.15
    phase: float = 0.0  # fraction of a period at t = 0 (0: the trough)

    def __call__(self, t: np.ndarray | float) -> np.ndarray:
        x = np.asarray(t, dtype=float) / self.period_s + self.phase
        return self.low + (1.0 - self.low) * 0.5 * (1.0 - np.cos(2.0 * np.pi * x))


def read_arrivals(path: str | Path) -> np.ndarray:
    """Seconds from the first request, sorted (the trace's TIMESTAMP column)."""
    stamps = []
    with Path(path).open(encoding="utf-8") as f:
        r = csv.DictReader(f)
        if r.fieldnames is None or "TIMESTAMP" not in r.fieldnames:
            raise ValueError(f"{path}: no TIMESTAMP column (an Azure LLM inference trace has one)")
        for row in r:
            ts = (row["TIMESTAMP"] or "").strip()
            head, _, frac = ts.partition(".")
            try:
                stamps.append(datetime.strptime(head, "%Y-%m-%d %H:%M:%S").timestamp()
                              + (float("0." + frac) if frac else 0.0))
            except ValueError:
                raise ValueError(f"{path}, line {r.line_num}: TIMESTAMP must be "
                                 f"'YYYY-MM-DD HH:MM:SS[.frac]', got {ts!r}") from None
    if len(stamps) < 2:
        raise ValueError(f"{path}: needs at least two requests")
    t = np.sort(np.array(stamps))
    return t - t[0]


def scale_to(arrivals: np.ndarray, span_s: float) -> np.ndarray:
    """The arrivals stretched (or squeezed) to cover `span_s` seconds."""
    return arrivals * (span_s / max(float(arrivals[-1]), 1e-9))


def demand_series(arrivals: np.ndarray, span_s: float, interval_s: float, *, peak_rps: float,
                  envelope: Envelope | None = None) -> np.ndarray:
    """Requests/s per interval over [0, span_s): the trace time-scaled to the span, weighted by
    the envelope, scaled so that the busiest interval has `peak_rps`."""
    t = scale_to(arrivals, span_s)
    n = max(1, math.ceil(span_s / interval_s))
    counts = np.bincount(np.minimum((t // interval_s).astype(int), n - 1), minlength=n).astype(float)
    if envelope is not None:
        counts *= envelope((np.arange(n) + 0.5) * interval_s)
    top = counts.max()
    if top <= 0:
        raise ValueError("the trace has no requests in the span")
    return counts * (peak_rps / top)


def replay_schedule(arrivals: np.ndarray, *, speedup: float, envelope: Envelope | None = None,
                    seed: int = 0, start_s: float = 0.0, max_requests: int | None = None) -> np.ndarray:
    """Send times (s from the replay's start) of the trace from `start_s` (trace seconds),
    `speedup` times faster, thinned by the envelope (evaluated in replay time)."""
    t = arrivals[arrivals >= start_s] - start_s
    t = t / speedup
    if envelope is not None:
        keep = np.random.default_rng(seed).random(len(t)) < envelope(t)
        t = t[keep]
    return t[:max_requests] if max_requests is not None else t


def thin_to_peak(schedule: np.ndarray, peak_rps: float, *, window_s: float = 5.0,
                 seed: int = 0) -> np.ndarray:
    """The schedule with each request kept with one probability (seeded), chosen so that its
    busiest `window_s` window has about `peak_rps` requests/s (never more requests than given)."""
    if len(schedule) == 0:
        return schedule
    counts = np.bincount((np.asarray(schedule) // window_s).astype(int))
    keep = min(1.0, peak_rps * window_s / counts.max())
    return schedule[np.random.default_rng(seed).random(len(schedule)) < keep]


def poisson_arrivals(rate: float, span_s: float, seed: int = 0) -> np.ndarray:
    """A seeded Poisson process of `rate` requests/s over [0, span_s) (a stand-in trace)."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * span_s * 1.5) + 10))
    return t[t < span_s]


@dataclass(frozen=True, kw_only=True)
class Sent:
    at: float  # seconds from the replay's start (scheduled)
    latency_s: float
    status: int  # HTTP status; 0 for a connection error or timeout


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"replay target {url!r}: only loopback addresses (127.0.0.0/8, localhost, ::1)")


def post_json(url: str, body: dict, timeout_s: float) -> tuple[int, dict | None]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError):
        return 0, None


def replay(url: str, schedule: Sequence[float], body: Callable[[int], dict], *, max_s: float,
           concurrency: int = 16, timeout_s: float = 30.0,
           on_sent: Callable[[Sent], None] | None = None) -> list[Sent]:
    """POST `body(i)` to `url` at each scheduled time (bounded: at most len(schedule) requests,
    none scheduled after `max_s`); returns what every request got, in send order."""
    check_loopback(url)
    out: list[Sent | None] = [None] * len(schedule)
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(i: int, at: float) -> None:
        s = time.monotonic()
        status, _ = post_json(url, body(i), timeout_s)
        sent = Sent(at=at, latency_s=time.monotonic() - s, status=status)
        with lock:
            out[i] = sent
        if on_sent is not None:
            on_sent(sent)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for i, at in enumerate(schedule):
            if at > max_s:
                out = out[:i]
                break
            delay = at - (time.monotonic() - t0)
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, i, float(at))
    return [s for s in out if s is not None]


def p99(latencies: Sequence[float]) -> float:
    return float(np.percentile(latencies, 99)) if len(latencies) else float("nan")
