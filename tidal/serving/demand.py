"""Serve's demand on the inference pool, read from the running Serve instance (the live input of
the loan manager, `tidal.serving.loans`).

Serve's autoscaler sets each deployment's target replica count from its ongoing requests; the
target shows as replicas in every state but STOPPING/STOPPED (`serve.status()`: RUNNING,
STARTING, ... — a replica waiting for a GPU that training holds stays STARTING). So the
replicas Serve wants now is the sum of those counts over the deployments whose replicas select the
inference pool. Without a Serve instance the demand is 0 (nothing starts one from here: the
controller actor is looked up first).

A deployment that runs Tidal's autoscaling policy (`tidal.serving.autoscaling`) publishes the
replicas its requests need, before Serve's delays; its demand is that need while it is fresh
(`NEED_TTL_S`), and its replica count otherwise. `ServeDemand` reads the demand each tick and
publishes back the replicas the loan step keeps, shared out as each deployment's floor.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from tidal.serving.autoscaling import (
    FLOORS_KEY,
    NEED_TTL_S,
    RayKV,
    deployment_key,
    floors,
    need_key,
)

WANTED = ("RUNNING", "STARTING", "PENDING_MIGRATION", "RECOVERING", "UPDATING")


def replicas_wanted(status: Any) -> int:
    """Replicas wanted over every application and deployment of a `serve.status()` result."""
    return sum(_wanted(dep) for app in (getattr(status, "applications", None) or {}).values()
               for dep in (getattr(app, "deployments", None) or {}).values())


def _wanted(dep: Any) -> int:
    states = getattr(dep, "replica_states", None) or {}
    return sum(int(n) for s, n in states.items() if str(getattr(s, "value", s)) in WANTED)


def split_demand(status: Any, needs: Mapping[str, float]) -> tuple[dict[str, float], float]:
    """(the published need of each deployment that has one, the wanted replicas of the others)
    over a `serve.status()` result; `needs`: the fresh needs by `deployment_key`."""
    tidal: dict[str, float] = {}
    others = 0
    for app_name, app in (getattr(status, "applications", None) or {}).items():
        for name, dep in (getattr(app, "deployments", None) or {}).items():
            key = deployment_key(app_name, name)
            if key in needs:
                tidal[key] = float(needs[key])
            else:
                others += _wanted(dep)
    return tidal, float(others)


def replicas_running(status: Any) -> int:
    """Replicas RUNNING (serving requests) over every application and deployment."""
    return sum(int(n) for app in (getattr(status, "applications", None) or {}).values()
               for dep in (getattr(app, "deployments", None) or {}).values()
               for s, n in (getattr(dep, "replica_states", None) or {}).items()
               if str(getattr(s, "value", s)) == "RUNNING")


def serve_running() -> bool:
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return False
    return True


def current_running() -> int:
    """Replicas Serve runs now (0 when no Serve instance runs)."""
    if not serve_running():
        return 0
    from ray import serve

    return replicas_running(serve.status())


class ServeDemand:
    """The scheduler's view of Serve, one tick at a time: call it for the demand (the published
    needs of Tidal's deployments plus the replicas the others want), then `publish` the replicas
    the loan step keeps. `get`/`put`: the cluster's KV (Ray's, in Tidal's namespace, by default);
    `clock`: wall-clock seconds, the clock the policy stamps its needs with."""

    def __init__(self, get: Callable[[str], bytes | None] | None = None,
                 put: Callable[[str, bytes], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        kv = RayKV()
        self._get, self._put, self.clock = get or kv.get, put or kv.put, clock
        self.needs: dict[str, float] = {}  # Tidal's deployments' needs at the last call
        self.others = 0.0  # the other deployments' wanted replicas at the last call

    def __call__(self) -> float:
        if not serve_running():
            self.needs, self.others = {}, 0.0
            return 0.0
        from ray import serve

        return self.read(serve.status())

    def read(self, status: Any) -> float:
        """The demand over a `serve.status()` result, reading each deployment's need."""
        now, fresh = self.clock(), {}
        for app_name, app in (getattr(status, "applications", None) or {}).items():
            for name in (getattr(app, "deployments", None) or {}):
                key = deployment_key(app_name, name)
                need = _fresh_need(self._get(need_key(key)), now)
                if need is not None:
                    fresh[key] = need
        self.needs, self.others = split_demand(status, fresh)
        return sum(self.needs.values()) + self.others

    def publish(self, kept: int | None) -> None:
        """The loan step's kept replicas, shared out as floors (`autoscaling.floors`); None (no
        bound on the demand yet, or no pool): no floors, Serve's need alone."""
        share = floors(kept, self.needs, self.others) if kept is not None and self.needs else {}
        self._put(FLOORS_KEY, json.dumps({"at": self.clock(), "floors": share}).encode())


def _fresh_need(raw: bytes | None, now: float) -> float | None:
    try:
        rec = json.loads(raw) if raw else None
        if not isinstance(rec, dict):
            return None
        need = float(rec["need"])
        return need if 0 <= need < float("inf") and now - float(rec["at"]) <= NEED_TTL_S else None
    except (ValueError, KeyError, TypeError):
        return None

