"""What each node offers Tidal now: the real cluster in the policy's snapshot. A pure builder.

Ray reports per node its total and its *available* resources (`ray.nodes()`,
`ray._private.state.available_resources_per_node()`) and its labels. What Tidal may use is what
is free plus what Tidal's own runs hold there, never more than the node has:

    offer_n(r) = min(total_n(r), available_n(r) + tidal_n(r))     for r in GPU, CPU, memory

so anything else on the node — Serve's replicas, another Ray job's actors, a placement group
left behind — is invisible capacity, not Tidal's. The node label `tidal.io/pool` names its pool
(`training` when absent). A node of the inference pool offers training only the GPUs the loan
manager lends there (`lent`, `tidal.serving.loans.lend_by_node`), never more than are free of
Serve's replicas, and marks them `recallable`; with no loan it offers none.

The live scheduler calls it on what Ray reports (`Scheduler._nodes`, with the loan step's `lent`);
the tests call it on recorded states. Profile reservations count as Tidal's holdings here and
are subtracted after it (`tidal.platform.reservations.without`), so a profile that runs is
counted once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tidal.core.policy import Node

POOL_LABEL = "tidal.io/pool"
# A Ray label selector for the nodes `pool_of` calls training: any node not labelled inference
# (unlabelled ones included). Tidal's node requests carry it, so that Ray's autoscaler launches
# training nodes, not inference ones, for training demand.
TRAINING_SELECTOR = {POOL_LABEL: "!inference"}


@dataclass(frozen=True, kw_only=True)
class Held:
    """What Tidal's own runs (and profile reservations) hold on one node."""

    gpus: float = 0.0
    cpus: float = 0.0
    memory: float = 0.0


# Ray's label on the nodes its autoscaler launched: the node type's name (RAY_NODE_TYPE_NAME)
NODE_GROUP_LABEL = "ray.io/node-group"


def launchable_gpus(config: Mapping[str, Any], ray_nodes: Sequence[Mapping[str, Any]]) -> list[int]:
    """The GPU counts of the training nodes Ray's autoscaler may still launch, one per node, read
    off its config (a cluster-launcher YAML: `available_node_types`): for every worker type with
    GPUs in its `resources` and not labelled inference (`pool_of`'s rule),
    `max_workers` − its alive nodes (`NODE_GROUP_LABEL`). Admission sizes jobs against the nodes
    alive now plus these, so that a job larger than today's cluster queues (and its node request
    brings the nodes) instead of being rejected."""
    types: Mapping[str, Any] = config.get("available_node_types") or {}
    alive = Counter((n.get("Labels") or {}).get(NODE_GROUP_LABEL) for n in ray_nodes if n.get("Alive"))
    out: list[int] = []
    for name, t in sorted(types.items()):
        gpus = int((t.get("resources") or {}).get("GPU", 0))
        if name == config.get("head_node_type") or gpus < 1 or pool_of(t) == "inference":
            continue
        out += [gpus] * max(0, int(t.get("max_workers", 0)) - alive[name])
    return out


def pool_of(node: Mapping[str, Any]) -> Literal["training", "inference"]:
    """A `ray.nodes()` entry's pool (or a launcher node type's: `labels`): "inference" if labelled
    so, else "training"."""
    labels = node.get("Labels") or node.get("labels") or {}
    return "inference" if labels.get(POOL_LABEL) == "inference" else "training"


def build_nodes(ray_nodes: Sequence[Mapping[str, Any]], available: Mapping[str, Mapping[str, float]],
                held: Mapping[str, Held], lent: Mapping[str, int] | None = None,
                recall_risk: float = 1.0) -> list[Node]:
    """`ray_nodes`: `ray.nodes()` entries (NodeID, Alive, Resources, Labels); `available`:
    available resources per node id; `held`: Tidal's holdings per node id; `lent`: inference
    GPUs lent per node id (module docstring). Nodes without GPUs are left out."""
    out = []
    for n in ray_nodes:
        total = n.get("Resources") or {}
        if not n.get("Alive") or total.get("GPU", 0) < 1:
            continue
        nid = n["NodeID"]
        free = available.get(nid, {})
        h = held.get(nid, Held())

        def offer(key: str, mine: float, total: Mapping[str, Any] = total,
                  free: Mapping[str, Any] = free) -> float:
            return min(float(total.get(key, 0.0)), float(free.get(key, 0.0)) + mine)

        gpus = int(offer("GPU", h.gpus) + 1e-9)
        pool = pool_of(n)
        if pool == "inference":
            gpus = min(gpus, int((lent or {}).get(nid, 0)))
        out.append(Node(node_id=nid, gpus=gpus, cpus=offer("CPU", h.cpus),
                        memory=offer("memory", h.memory) if "memory" in total else 1e18,
                        pool=pool,
                        recallable=pool == "inference", recall_risk=recall_risk))
    return sorted(out, key=lambda x: x.node_id)


def held_by_node(allocations: Iterable[Sequence[Sequence[Any]] | None],
                 cpus_per_gpu: float) -> dict[str, Held]:
    """What runs hold per node, summed over their allocations ([[node, GPUs], ...]): GPUs, and
    `cpus_per_gpu` CPUs per GPU. The scheduler's one sum over RUNNING and STOPPING jobs, for the
    snapshot, profile reservations and the loan step alike."""
    held: dict[str, Held] = {}
    for alloc in allocations:
        for nid, g in alloc or []:
            h = held.get(nid, Held())
            held[nid] = Held(gpus=h.gpus + float(g), cpus=h.cpus + float(g) * cpus_per_gpu)
    return held
