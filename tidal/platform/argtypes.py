"""argparse types for numeric options: a value out of range is refused in one line, naming the
option, before any work starts (`tidal plan --steps 0` used to profile six plans and print six
worker tracebacks). Used by the `tidal` CLI and the benchmarks.

    ap.add_argument("--steps", type=count(1))          # an integer >= 1
    ap.add_argument("--gpu-mem-gib", type=amount())    # a finite number > 0
    ap.add_argument("--jitter-s", type=amount(0.0, strict=False))   # >= 0
    ap.add_argument("--port", type=count(1, 65535))    # an integer in [1, 65535]
    ap.add_argument("--rates", type=listed(amount()))  # comma-separated, each a number > 0
    ap.add_argument("--port", type=free_port, default="8000")  # a string default is checked too
"""

from __future__ import annotations

import argparse
import math
import socket
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def count(low: int = 1, high: int | None = None) -> Callable[[str], int]:
    """An integer >= `low` (and <= `high`)."""
    want = f">= {low}" if high is None else f"in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < low or (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"must be an integer {want}, got {v}")
        return v

    parse.__name__ = f"integer {want}"
    return parse


def amount(low: float = 0.0, *, strict: bool = True) -> Callable[[str], float]:
    """A finite number > `low` (>= `low` when not `strict`)."""
    op = ">" if strict else ">="

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(v) or v < low or (strict and v == low):
            raise argparse.ArgumentTypeError(f"must be a finite number {op} {low:g}, got {text}")
        return v

    parse.__name__ = f"number {op} {low:g}"
    return parse


def listed(item: Callable[[str], T]) -> Callable[[str], list[T]]:
    """Comma-separated values, each parsed by `item` (one of the types above); a bad one is named
    with the list it is in."""

    def parse(text: str) -> list[T]:
        out = []
        for tok in text.split(","):
            try:
                out.append(item(tok.strip()))
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(f"{tok.strip()!r} in {text!r}: {e}") from None
        return out

    parse.__name__ = f"comma-separated {getattr(item, '__name__', 'values')}"
    return parse


def free_port(text: str) -> int:
    """A TCP port nothing listens on at 127.0.0.1 now: Serve's proxy binds it only after Ray and
    Serve have started, and a busy one was a traceback then (a minute into the demo)."""
    port = count(1, 65535)(text)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed one in TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise argparse.ArgumentTypeError(f"127.0.0.1:{port} is in use ({e.strerror}): "
                                             "stop what holds it or pick another port") from None
    return port


free_port.__name__ = "free port"
