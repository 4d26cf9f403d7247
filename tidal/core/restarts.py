"""What a restart costs, measured from the scheduler's own runs. Pure.

The policy prices every change of a running job's option, and every start, at the job's restart
cost (`JobView.restart_cost_s`: T_j = restart + work ÷ samples/s, `tidal.core.policy`). A
constant is right on no cluster for long: the cost is what the cluster takes to bring a run up,
and that depends on the model, the checkpoint's size, the nodes and how busy they are (on the
demo's 2-core host a launch took ~50 s or more before its first step, priced at a constant
30 s; Rubick's traces charge 260 s). So the live scheduler measures the two halves of each
reconfiguration as its runs go through them:

    stop_s   = stop request → the run ended          (the next step boundary and its checkpoint)
    start_s  = launch → the new run's first step     (Ray Train's worker group, the DeepSpeed
                                                      engines, the checkpoint's load, one step)
    restart_cost = median(start_s) + median(stop_s)  over the last `window` of each;
                   default_s until a start has been measured (a stop alone adds to the default)

The median, not the mean: one run stuck behind a node's start-up or a profile sharing its
cores should not move the price of every later decision. Samples that are not finite or are
negative (clock steps) are ignored.

The samples outlive the scheduler actor: it keeps them in its store (`Store.set_measured`) and a
restarted actor starts from them (`RestartCost.restored`), not from the default. Without that a
restart of the actor priced every decision at 30 s again, on the demo's host where a restart
had measured ~50 s or more, until its runs had been relaunched and measured anew.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True)
class RestartCost:
    default_s: float = 30.0
    window: int = 20
    starts: tuple[float, ...] = ()  # the last `window` launch → first step times, oldest first
    stops: tuple[float, ...] = ()  # the last `window` stop request → run ended times

    def __post_init__(self) -> None:
        if not (0.0 <= self.default_s < math.inf):
            raise ValueError(f"RestartCost.default_s must be seconds >= 0, got {self.default_s!r}")
        if not (isinstance(self.window, int) and self.window >= 1):
            raise ValueError(f"RestartCost.window must be an integer >= 1, got {self.window!r}")

    def restored(self, samples: object) -> RestartCost:
        """This estimate with samples kept earlier (`samples()`) observed: anything but a mapping of
        lists of numbers is ignored, and so is each sample `observe` would ignore."""
        def numbers(key: str) -> list[float]:
            values = samples.get(key) if isinstance(samples, dict) else None
            return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)] \
                if isinstance(values, list) else []

        cost = self
        for start in numbers("starts"):
            cost = cost.observe(start_s=start)
        for stop in numbers("stops"):
            cost = cost.observe(stop_s=stop)
        return cost

    def samples(self) -> dict[str, list[float]]:
        """The measurements behind the estimate, as `restored` reads them back."""
        return {"starts": list(self.starts), "stops": list(self.stops)}

    def observe(self, *, start_s: float | None = None, stop_s: float | None = None) -> RestartCost:
        """This estimate with one more measured start and/or stop (the module docstring)."""
        starts, stops = self.starts, self.stops
        if start_s is not None and 0.0 <= start_s < math.inf:
            starts = (*starts, float(start_s))[-self.window:]
        if stop_s is not None and 0.0 <= stop_s < math.inf:
            stops = (*stops, float(stop_s))[-self.window:]
        return replace(self, starts=starts, stops=stops)

    @property
    def seconds(self) -> float:
        """restart_cost = median(start_s) + median(stop_s); default_s stands in for the start
        until one is measured, 0 for the stop."""
        start = statistics.median(self.starts) if self.starts else self.default_s
        stop = statistics.median(self.stops) if self.stops else 0.0
        return start + stop
