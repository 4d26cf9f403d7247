from __future__ import annotations

import argparse

import pytest

from tidal.platform.argtypes import amount, count


def test_count_takes_integers_from_its_floor() -> None:
    assert count(0)("0") == 0 and count(1)("7") == 7
    for text, says in (("0", "must be an integer >= 1, got 0"), ("-3", "must be an integer >= 1, got -3"),
                       ("2.5", "expected an integer, got '2.5'"), ("", "expected an integer, got ''")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{says}$"):
            count(1)(text)


def test_amount_takes_finite_numbers_above_or_from_its_floor() -> None:
    assert amount()("0.5") == 0.5 and amount(0.0, strict=False)("0") == 0.0
    for parse, text, says in ((amount(), "0", "> 0, got 0"), (amount(), "-1", "> 0, got -1"),
                              (amount(), "inf", "> 0, got inf"), (amount(), "nan", "> 0, got nan"),
                              (amount(0.0, strict=False), "-0.1", ">= 0, got -0.1")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^must be a finite number {says}$"):
            parse(text)
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a number, got 'x'$"):
        amount()("x")
