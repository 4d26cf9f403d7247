"""Tidal's node request to Ray's autoscaler: the bundles that waiting jobs and profiles need.

Not `ray.autoscaler.sdk.request_resources` directly: that call replaces the cluster's one
request, and Ray's `AutoscalingCoordinator`, which Ray Train V2 registers every run's workers
with, resends its own merge every 20 s, so a direct request lasts at most 20 s. Tidal registers
with the coordinator as one more requester instead (`NODE_REQUESTER`), and resends while the
request stands (`NODE_REQUEST_REFRESH_S`: a restarted coordinator starts empty); a request
outlives a dead scheduler `NODE_REQUEST_TTL_S`. What to ask for is decided by the pure
`tidal.core.autoscale.node_request`; this is its executor.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import ray

from tidal.platform.capacity import TRAINING_SELECTOR

NODE_REQUESTER = "tidal-scheduler"  # Tidal's requester id with Ray's AutoscalingCoordinator
NODE_REQUEST_TTL_S = 300.0  # a node request outlives a dead scheduler this long
NODE_REQUEST_REFRESH_S = 20.0  # resent this often while it stands: as often as Ray Train refreshes its own
NODE_REQUEST_RETRY_S = 10.0  # after a failed send, the next try waits this long


class NodeRequester:
    """The last request sent and when; `request` sends a new one when it changes or is due."""

    def __init__(self, enabled: bool, note: Callable[[str], None]) -> None:
        self.enabled = enabled  # SchedulerConfig.autoscale
        self.note = note  # the scheduler's event log
        # the last request sent (None: none yet, so the first decision replaces whatever a
        # predecessor asked for), when it was sent and when sending last failed (time.monotonic)
        self.sent: tuple[dict[str, float], ...] | None = None
        self.sent_at = float("-inf")
        self.failed_at = float("-inf")

    def request(self, bundles: tuple[dict[str, float], ...]) -> None:
        """Register the node request with Ray's `AutoscalingCoordinator` (`()` withdraws it),
        when it changes, and again every `NODE_REQUEST_REFRESH_S` to keep it from expiring.

        Each send withdraws the request first, so that it is the *last* requester in the
        coordinator's merge. The autoscaler v2 checks the merged bundles as one all-or-nothing
        constraint, bin-packed in the merge's order where bundles sort alike (`_try_schedule`:
        ours and a Train run's each carry one label selector); a running job's Train registration
        is pinned by `ray.io/node-id`. With ours first, our training-pool bundles took the GPUs of
        the nodes those pinned bundles need, the whole constraint was infeasible and no node was
        ever launched (a job larger than the cluster waited forever). Last, ours
        ask exactly for what the registered runs leave. A run registering after our send is
        ahead of us from our next refresh on.
        """
        now = time.monotonic()
        if not self.enabled or (bundles == self.sent and now - self.sent_at < NODE_REQUEST_REFRESH_S):
            return
        if now - self.failed_at < NODE_REQUEST_RETRY_S:  # one event per failure, not per tick
            return
        try:  # each bundle on the training pool: Ray's autoscaler v2 honours the selector, v1 ignores it
            # the module Ray Train V2 takes it from (internal to Ray: an import error is an event)
            from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
                ResourceRequestPriority,
                get_or_create_autoscaling_coordinator,
            )

            coordinator = get_or_create_autoscaling_coordinator()
            if bundles:  # withdrawn and sent again: last in the merge (docstring)
                ray.get(coordinator.cancel_request.remote(NODE_REQUESTER), timeout=10)
                done = coordinator.request_resources.remote(
                    requester_id=NODE_REQUESTER, resources=[dict(b) for b in bundles],
                    label_selectors=[dict(TRAINING_SELECTOR) for _ in bundles],
                    expire_after_s=NODE_REQUEST_TTL_S, priority=ResourceRequestPriority.HIGH)
            else:
                done = coordinator.cancel_request.remote(NODE_REQUESTER)
            ray.get(done, timeout=10)
        except Exception as e:  # no autoscaler to take it: tried again after NODE_REQUEST_RETRY_S
            self.failed_at = now
            self.note(f"autoscaler request failed: {e}")
            return
        changed, self.sent, self.sent_at = bundles != self.sent, bundles, now
        if changed:
            gpus = sum(b.get("GPU", 0.0) for b in bundles)
            self.note(f"asked the autoscaler for {gpus:g} GPUs in {len(bundles)} bundles" if bundles
                      else "withdrew the autoscaler request: nothing waits")
