"""Traffic: the Azure trace's arrivals, the envelope, the demand series, loopback only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tidal.serving.traffic import (
    Envelope,
    check_loopback,
    demand_series,
    poisson_arrivals,
    read_arrivals,
    replay_schedule,
    thin_to_peak,
)

AZURE = (Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure-llm"
         / "AzureLLMInferenceTrace_conv.csv")


def test_arrivals_and_demand() -> None:
    t = read_arrivals(AZURE)
    assert len(t) > 19_000 and t[0] == 0 and np.all(np.diff(t) >= 0) and 3000 < t[-1] < 3700
    env = Envelope(period_s=36_000.0, low=0.2)
    rates = demand_series(t, 36_000.0, 60.0, peak_rps=640.0, envelope=env)
    assert len(rates) == 600 and rates.max() == pytest.approx(640.0)
    assert rates[:30].mean() < 0.5 * rates[270:330].mean()  # the trough at the start, the peak mid-span
    sched = replay_schedule(t, speedup=10.0, envelope=env, max_requests=100)
    assert len(sched) == 100 and np.all(np.diff(sched) >= 0)


def test_thinning_to_a_peak_rate_keeps_the_shape() -> None:
    t = poisson_arrivals(20.0, 600.0, seed=1)
    assert t.min() >= 0 and t.max() < 600 and abs(len(t) - 12_000) < 500
    thin = thin_to_peak(t, 5.0, window_s=5.0, seed=2)
    peak = np.bincount((thin // 5.0).astype(int)).max() / 5.0
    assert 3.5 < peak <= 7.5 and set(thin) <= set(t)
    assert len(thin_to_peak(t, 1e6)) == len(t)  # never more requests than given
    assert len(thin_to_peak(t[:0], 5.0)) == 0


def test_envelope_range() -> None:
    e = Envelope(period_s=100.0, low=0.25)
    v = e(np.linspace(0, 100, 1001))
    assert v.min() == pytest.approx(0.25) and v.max() == pytest.approx(1.0)


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000/", "http://example.com/", "http://192.168.1.2/x"])
def test_replay_refuses_non_loopback(url: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        check_loopback(url)


def test_replay_accepts_loopback() -> None:
    for url in ("http://127.0.0.1:8000/gpt", "http://localhost:8000/", "http://[::1]:8000/"):
        check_loopback(url)


def test_a_malformed_trace_fails_on_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "trace.csv"
    bad.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\nyesterday,12\n")
    with pytest.raises(ValueError, match=r"trace\.csv, line 3: TIMESTAMP must be "
                                         r"'YYYY-MM-DD HH:MM:SS\[\.frac\]', got 'yesterday'"):
        read_arrivals(bad)
    (tmp_path / "none.csv").write_text("time,tokens\n1,2\n")
    with pytest.raises(ValueError, match="no TIMESTAMP column"):
        read_arrivals(tmp_path / "none.csv")
