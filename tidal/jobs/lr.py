"""Learning-rate schedules as pure functions of the optimizer step.

The runner sets the LR of every parameter group before each step from `schedule.at(step)`, so
the LR depends on the step only — never on the plan, the worker count or a restart — and a
checkpoint need not carry scheduler state.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class LRSchedule(ABC):
    """Base class: `at(step)` is the LR used by optimizer step `step` (0-based)."""

    @abstractmethod
    def at(self, step: int) -> float: ...

    def describe(self) -> str:
        return type(self).__name__


@dataclass(frozen=True, kw_only=True)
class Constant(LRSchedule):
    lr: float

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"Constant.lr must be > 0, got {self.lr!r}")

    def at(self, step: int) -> float:
        return self.lr

    def describe(self) -> str:
        return f"constant({self.lr:g})"


@dataclass(frozen=True, kw_only=True)
class WarmupCosine(LRSchedule):
    """Linear warm-up to `peak` over `warmup` steps, then cosine decay to `floor` at `total`.

    lr(s) = peak·(s+1)/warmup                                    for s < warmup
    lr(s) = floor + ½(peak − floor)(1 + cos(π·(s − warmup)/(total − warmup)))   otherwise
    """

    peak: float
    warmup: int
    total: int
    floor: float = 0.0

    def __post_init__(self) -> None:
        if not self.peak > 0:
            raise ValueError(f"WarmupCosine.peak must be > 0, got {self.peak!r}")
        if self.warmup < 0 or self.total <= self.warmup:
            raise ValueError(
                f"WarmupCosine needs 0 <= warmup < total, got warmup={self.warmup}, total={self.total}"
            )
        if not 0 <= self.floor <= self.peak:
            raise ValueError(f"WarmupCosine.floor must lie in [0, peak], got {self.floor!r}")

    def at(self, step: int) -> float:
        if step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        t = min(1.0, (step - self.warmup) / (self.total - self.warmup))
        return self.floor + 0.5 * (self.peak - self.floor) * (1.0 + math.cos(math.pi * t))

    def describe(self) -> str:
        return f"warmup_cosine(peak={self.peak:g}, warmup={self.warmup}, total={self.total})"


def constant(lr: float) -> Constant:
    return Constant(lr=lr)
