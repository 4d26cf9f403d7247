from __future__ import annotations

import itertools
import math

import pytest

from tidal.jobs.lr import Constant, WarmupCosine


def test_constant() -> None:
    assert Constant(lr=0.1).at(0) == Constant(lr=0.1).at(10_000) == 0.1
    with pytest.raises(ValueError):
        Constant(lr=0.0)


def test_warmup_cosine_shape() -> None:
    s = WarmupCosine(peak=1.0, warmup=10, total=110, floor=0.1)
    assert s.at(0) == pytest.approx(0.1)
    assert s.at(9) == pytest.approx(1.0)
    assert s.at(10) == pytest.approx(1.0)
    assert s.at(60) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert s.at(110) == pytest.approx(0.1)
    assert s.at(500) == pytest.approx(0.1)
    values = [s.at(k) for k in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(values))
    with pytest.raises(ValueError):
        WarmupCosine(peak=1.0, warmup=10, total=10)
