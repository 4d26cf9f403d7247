"""Tidal's Serve autoscaling policy: one brain for Serve's replicas and the loans.

Serve's default policy asks for `ongoing requests ÷ target_ongoing_requests` replicas, so a
replica is started once requests have queued; the loan step (`tidal.serving.loanstep`) keeps
for Serve the replicas its forecast of the demand needs until a reclaim could take effect, and
lends the rest. Without a shared signal the two disagree: the loan step read Serve's replica
count (which moves only after the queue has), and the GPUs it kept for a forecast rise sat idle,
while the simulator counts every GPU not lent as serving. With this policy both come from one
signal and one forecast:

    need_d  = total_num_requests_d / target_ongoing_requests_d     (replicas deployment d needs now)
    want_d  = max(need_d, floor_d)                                  (what Serve is asked to run)

* **the signal**: each deployment's `need` (running and queued requests over Serve's look-back,
  the default policy's own numerator) is published every `PUBLISH_S` to Ray's KV
  (`need_key`); the scheduler's loan step reads it as Serve's demand
  (`tidal.serving.demand.ServeDemand`), so a surge moves the loan decision as soon as Serve's
  routers report it, not after Serve's replicas changed;
* **the forecast**: the scheduler publishes per deployment the replicas its loan decision keeps
  (`FLOORS_KEY`, `floors`): `floor_d` is at least `⌈need_d⌉` and shares out the kept GPUs beyond
  today's need. The kept GPUs run warm replicas instead of idling, so a rise within the forecast
  is served by running replicas, as the simulator assumes, not by ones that start when requests
  have queued.

A floor older than `FLOOR_TTL_S` (no scheduler) is ignored: Serve's own need alone, as with the
default policy. A deployment that does not use this policy publishes no need, and the scheduler
reads its replica count as before. Serve applies its own delays, factors and replica bounds to
`want_d` (`upscale_delay_s`, `downscale_delay_s`, `min_replicas`, `max_replicas`).

Serve pickles this module by value into its controller, so it imports only the standard library
and, inside the one function that touches the cluster, Ray's KV.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

KV_NAMESPACE = "tidal"
FLOORS_KEY = "serve/floors"  # {"at": time, "floors": {"app/deployment": replicas}}
PUBLISH_S = 1.0  # how often a deployment publishes its need and reads its floor
NEED_TTL_S = 10.0  # a need older than this is not read (its deployment's policy no longer runs)
FLOOR_TTL_S = 30.0  # a floor older than this is ignored (its scheduler no longer runs)


def deployment_key(app: str | None, deployment: str) -> str:
    return f"{app or ''}/{deployment}"


def need_key(key: str) -> str:
    """Where a deployment publishes `{"need": replicas, "at": time}`."""
    return f"serve/need/{key}"


def replicas_needed(total_requests: float, target_ongoing: float) -> float:
    """Replicas the requests in flight need: Serve's default policy's ratio (Little's law at the
    target), before Serve's delays and bounds."""
    return max(0.0, float(total_requests)) / max(float(target_ongoing), 1e-9)


def floors(kept: int, needs: Mapping[str, float], others: float = 0.0) -> dict[str, int]:
    """Each Tidal deployment's floor when the loan step keeps `kept` replicas for the pool whose
    deployments need `needs` (Tidal's) and `others` (replicas of deployments without this
    policy): every deployment its `⌈need⌉`, and the spare `kept − ⌈Σ needs + others⌉` one by
    one, most needed first (name breaks ties), so it lands where a rise costs most requests."""
    out = {k: math.ceil(max(0.0, n)) for k, n in needs.items()}
    spare = max(0, int(kept) - math.ceil(sum(max(0.0, n) for n in needs.values()) + max(0.0, others)))
    order = sorted(needs, key=lambda k: (-needs[k], k))
    for i in range(spare if order else 0):
        out[order[i % len(order)]] += 1
    return out


def desired(need: float, floor: int | None) -> float:
    """What Serve is asked to run: the need, raised to the loan step's floor."""
    return max(need, float(floor or 0))


class KV(Protocol):
    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, value: bytes) -> None: ...


def decide(ctx: Any, kv: KV | None, now: float) -> tuple[float, dict[str, Any]]:
    """One call of the policy on Serve's `AutoscalingContext` `ctx`: publishes the need and reads
    the floor every `PUBLISH_S` (`kv` None: no cluster store, the need alone), and returns the
    replicas wanted and the state kept for the next call."""
    state = dict(ctx.policy_state or {})
    key = deployment_key(ctx.app_name, ctx.deployment_name)
    need = replicas_needed(ctx.total_num_requests, ctx.config.get_target_ongoing_requests())
    if kv is not None and now - float(state.get("tidal_published_at", -math.inf)) >= PUBLISH_S:
        state["tidal_published_at"] = now
        kv.put(need_key(key), json.dumps({"need": need, "at": now}).encode())
        state["tidal_floor"] = _fresh_floor(kv.get(FLOORS_KEY), key, now)
    return desired(need, state.get("tidal_floor")), state


def _fresh_floor(raw: bytes | None, key: str, now: float) -> int | None:
    """This deployment's floor in the scheduler's record, if it is fresh and well-formed."""
    try:
        rec = json.loads(raw) if raw else None
        if not isinstance(rec, dict) or now - float(rec["at"]) > FLOOR_TTL_S:
            return None
        floor = rec["floors"].get(key)
        return int(floor) if isinstance(floor, int) and floor >= 0 else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class RayKV:
    """Ray's cluster KV (the GCS), in Tidal's namespace."""

    def get(self, key: str) -> bytes | None:
        from ray.experimental.internal_kv import _internal_kv_get

        return _internal_kv_get(key, namespace=KV_NAMESPACE)

    def put(self, key: str, value: bytes) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(key, value, overwrite=True, namespace=KV_NAMESPACE)


def tidal_policy(ctx: Any) -> tuple[float, dict[str, Any]]:
    """The policy Serve calls (`AutoscalingPolicy(policy_function=...)`) on every control-loop
    tick. A KV that fails costs this tick's publication, never Serve's decision."""
    from ray.experimental.internal_kv import _internal_kv_initialized

    now = float(ctx.current_time or time.time())
    try:
        return decide(ctx, RayKV() if _internal_kv_initialized() else None, now)
    except Exception:  # Serve must scale on its need even when the GCS stalls
        state = {**(ctx.policy_state or {}), "tidal_published_at": now}  # try again in PUBLISH_S
        need = replicas_needed(ctx.total_num_requests, ctx.config.get_target_ongoing_requests())
        return desired(need, state.get("tidal_floor")), state


POLICY = f"{__name__}:{tidal_policy.__name__}"  # the import path Serve's config names
