"""The measured restart cost (`tidal.core.restarts`): default, medians, window, bad samples."""

from __future__ import annotations

import math

import pytest

from tidal.core.restarts import RestartCost


def test_the_default_stands_until_a_start_is_measured() -> None:
    c = RestartCost(default_s=30.0)
    assert c.seconds == 30.0
    c = c.observe(stop_s=4.0)  # a stop alone adds to the default
    assert c.seconds == 34.0
    c = c.observe(start_s=50.0)
    assert c.seconds == 54.0


def test_medians_over_the_last_window() -> None:
    c = RestartCost(window=3)
    for s in (10.0, 200.0, 40.0, 50.0):  # the 10 falls out of the window
        c = c.observe(start_s=s)
    assert c.starts == (200.0, 40.0, 50.0)
    assert c.seconds == 50.0  # one slow start does not set the price
    c = c.observe(start_s=45.0, stop_s=6.0).observe(stop_s=2.0)
    assert c.seconds == pytest.approx(45.0 + 4.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_samples_that_are_not_durations_are_ignored(bad: float) -> None:
    c = RestartCost().observe(start_s=bad, stop_s=bad)
    assert c.starts == () and c.stops == () and c.seconds == 30.0


@pytest.mark.parametrize("kw", [{"default_s": -1.0}, {"default_s": math.nan}, {"window": 0}])
def test_bad_settings_fail_in_one_line(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="RestartCost"):
        RestartCost(**kw)  # type: ignore[arg-type]


def test_samples_read_back_give_the_same_estimate() -> None:
    c = RestartCost(window=3)
    for start, stop in ((60.0, 5.0), (40.0, 3.0), (55.0, 4.0), (50.0, 9.0)):
        c = c.observe(start_s=start, stop_s=stop)
    again = RestartCost(window=3).restored(c.samples())
    assert again == c and again.seconds == c.seconds == 50.0 + 4.0
    # a window smaller than what was kept keeps the newest samples
    assert RestartCost(window=2).restored(c.samples()).starts == (55.0, 50.0)


@pytest.mark.parametrize("kept", [None, "garbage", [1.0], {"starts": "x"}, {"starts": [True, "7", None]}])
def test_kept_samples_that_are_not_samples_give_the_default(kept: object) -> None:
    c = RestartCost().restored(kept)
    assert c.starts == () and c.stops == () and c.seconds == 30.0


def test_kept_samples_are_checked_like_new_ones() -> None:
    c = RestartCost().restored({"starts": [-5.0, 80.0, math.nan], "stops": [math.inf, 2.0]})
    assert c.starts == (80.0,) and c.stops == (2.0,) and c.seconds == 82.0
