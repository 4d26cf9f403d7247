"""Where a cluster's scheduler keeps its state, recorded in the cluster itself.

A Ray cluster has one Tidal scheduler, a named detached actor, and the scheduler has one state
file (`SchedulerConfig.state_path`, by default under `$TIDAL_STATE`). Which file is the
cluster's, not each shell's: a client whose `$TIDAL_STATE` differs from the shell that started
the scheduler must still reach that scheduler's jobs, and a scheduler started again after one
was lost for good must open its predecessor's file, not an empty one. So a scheduler records the
file it opened in Ray's cluster KV (namespace `tidal`, key `scheduler/state_path`), and
`sdk.connect` starts a scheduler on the recorded file when it is given none. The record lives as
long as the cluster's GCS; a new cluster (`ray stop`, `ray start`) starts from `$TIDAL_STATE`.

Ray 2.60 has no public cluster KV; Serve and Train use this same module
(`ray.experimental.internal_kv`).
"""

from __future__ import annotations

from tidal.platform.config import NAMESPACE

STATE_KEY = b"scheduler/state_path"
# Ray's own resource on the head node (Serve places its controller with it): the scheduler runs
# where the cluster's GCS does, never on a node that may be scaled away or lost alone
HEAD_NODE_RESOURCE = "node:__internal_head__"


def record_state_path(path: str) -> None:
    """Record the state file this cluster's scheduler opened."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(STATE_KEY, path.encode(), overwrite=True, namespace=NAMESPACE)


def recorded_state_path() -> str | None:
    """The state file this cluster's scheduler last opened; None if none ever started here."""
    from ray.experimental import internal_kv

    raw = internal_kv._internal_kv_get(STATE_KEY, namespace=NAMESPACE)
    return raw.decode() if raw else None
