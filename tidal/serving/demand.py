"""Serve's demand on the inference pool, read from the running Serve instance (the live input of
the loan manager, `tidal.serving.loans`).

Serve's autoscaler sets each deployment's target replica count from its ongoing requests; the
target shows as replicas in every state but STOPPING/STOPPED (`serve.status()`: RUNNING,
STARTING, ... — a replica waiting for a GPU that training holds stays STARTING). So the
replicas Serve wants now is the sum of those counts over the deployments whose replicas select the
inference pool. Without a Serve instance the demand is 0 (nothing starts one from here: the
controller actor is looked up first).
"""

from __future__ import annotations

from typing import Any

WANTED = ("RUNNING", "STARTING", "PENDING_MIGRATION", "RECOVERING", "UPDATING")


def replicas_wanted(status: Any) -> int:
    """Replicas wanted over every application and deployment of a `serve.status()` result."""
    total = 0
    for app in (getattr(status, "applications", None) or {}).values():
        for dep in (getattr(app, "deployments", None) or {}).values():
            states = getattr(dep, "replica_states", None) or {}
            total += sum(int(n) for s, n in states.items() if str(getattr(s, "value", s)) in WANTED)
    return total


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


def current_demand() -> int:
    """Replicas Serve wants now (0 when no Serve instance runs)."""
    if not serve_running():
        return 0
    from ray import serve

    return replicas_wanted(serve.status())


def current_running() -> int:
    """Replicas Serve runs now (0 when no Serve instance runs)."""
    if not serve_running():
        return 0
    from ray import serve

    return replicas_running(serve.status())
