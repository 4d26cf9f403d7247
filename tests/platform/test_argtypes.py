from __future__ import annotations

import argparse

import pytest

from tidal.platform.argtypes import amount, count, free_port, listed


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


def test_count_with_a_ceiling() -> None:
    assert count(1, 65535)("65535") == 65535
    for text in ("0", "65536"):
        says = rf"^must be an integer in \[1, 65535\], got {text}$"
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            count(1, 65535)(text)


def test_listed_parses_each_item_and_names_the_bad_one() -> None:
    assert listed(amount())("5, 10,2.5") == [5.0, 10.0, 2.5]
    assert listed(count(1))("16") == [16]
    for text, says in (("5,0", "'0' in '5,0': must be a finite number > 0, got 0"),
                       ("1,x", "'x' in '1,x': expected a number, got 'x'"),
                       ("1,,2", "'' in '1,,2': expected a number, got ''")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{says}$"):
            listed(amount())(text)


@pytest.mark.parametrize(("script", "args", "says"), [
    ("serve_capacity", ["--rates", "5,x"], "argument --rates: 'x' in '5,x': expected a number, got 'x'"),
    ("serve_capacity", ["--port", "80000"], "argument --port: must be an integer in [1, 65535], got 80000"),
    ("measure_plans", ["--micro-batches", "4,0"],
     "argument --micro-batches: '0' in '4,0': must be an integer >= 1, got 0"),
])
def test_benchmark_list_and_port_options_are_refused_in_one_line(
        script: str, args: list[str], says: str) -> None:
    """They were tracebacks: a ValueError from float('x'), an OverflowError from Serve's bind()
    after Ray and Serve had started, a ZeroDivisionError for a rate of 0."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, f"benchmarks/{script}.py", *args], cwd=root, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == f"{script}.py: error: {says}"


def test_free_port_refuses_a_port_something_listens_on() -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        says = f"^127.0.0.1:{port} is in use .*pick another port$"
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            free_port(str(port))
    assert free_port(str(port)) == port  # closed: free again
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be an integer in \[1, 65535\]"):
        free_port("0")
