"""The snapshot builder on recorded Ray states: what Tidal may use is free + its own, nothing else."""

from __future__ import annotations

from typing import Any

from tidal.platform.capacity import Held, build_nodes


def _node(nid: str, gpus: float, cpus: float = 8.0, alive: bool = True,
          pool: str | None = None) -> dict[str, Any]:
    labels = {"ray.io/node-id": nid} | ({"tidal.io/pool": pool} if pool else {})
    return {"NodeID": nid, "Alive": alive, "Labels": labels,
            "Resources": {"GPU": gpus, "CPU": cpus, "memory": 64e9}}


def test_something_else_holding_a_gpu_offers_one_fewer() -> None:
    nodes = [_node("a", 4)]
    (n,) = build_nodes(nodes, {"a": {"GPU": 3.0, "CPU": 7.0, "memory": 60e9}}, {})
    assert (n.gpus, n.cpus, n.memory) == (3, 7.0, 60e9)


def test_tidal_runs_count_as_usable() -> None:
    nodes = [_node("a", 4)]
    # Tidal holds 2 GPUs and 2 CPUs, a Serve replica 1 GPU: 1 free
    (n,) = build_nodes(nodes, {"a": {"GPU": 1.0, "CPU": 5.0, "memory": 64e9}},
                       {"a": Held(gpus=2, cpus=2)})
    assert n.gpus == 3 and n.cpus == 7.0
    # never more than the node has, whatever the holdings say
    (n,) = build_nodes(nodes, {"a": {"GPU": 4.0, "CPU": 8.0}}, {"a": Held(gpus=2, cpus=2)})
    assert n.gpus == 4 and n.cpus == 8.0


def test_fractional_holders_round_down() -> None:
    (n,) = build_nodes([_node("a", 2)], {"a": {"GPU": 1.5, "CPU": 8.0}}, {})
    assert n.gpus == 1


def test_dead_and_gpu_less_nodes_are_left_out() -> None:
    nodes = [_node("a", 2, alive=False), _node("b", 0), _node("c", 2)]
    out = build_nodes(nodes, {"c": {"GPU": 2.0, "CPU": 8.0}}, {})
    assert [n.node_id for n in out] == ["c"]


def test_inference_nodes_offer_only_what_is_lent() -> None:
    nodes = [_node("t", 4, pool="training"), _node("i", 8, pool="inference")]
    avail = {"t": {"GPU": 4.0, "CPU": 8.0}, "i": {"GPU": 5.0, "CPU": 8.0}}  # 3 Serve replicas on i
    t, i = sorted(build_nodes(nodes, avail, {}), key=lambda n: n.pool, reverse=True)
    assert (t.pool, t.recallable, t.gpus) == ("training", False, 4)
    assert (i.pool, i.recallable, i.gpus) == ("inference", True, 0)  # no loan, nothing offered
    (_, i), = [(n.node_id, n) for n in build_nodes(nodes, avail, {}, lent={"i": 4}) if n.node_id == "i"]
    assert i.gpus == 4
    (_, i), = [(n.node_id, n) for n in build_nodes(nodes, avail, {}, lent={"i": 8}) if n.node_id == "i"]
    assert i.gpus == 5  # a loan never reaches the replicas' GPUs


def test_launchable_gpus_counts_training_node_types_below_their_max() -> None:
    """Per training worker type with GPUs: max_workers minus its alive nodes (Ray's node-group
    label); the head, inference types, GPU-less types and dead nodes are not counted."""
    from tidal.platform.capacity import NODE_GROUP_LABEL, launchable_gpus

    config = {"head_node_type": "head", "available_node_types": {
        "head": {"resources": {"CPU": 4, "GPU": 2}, "max_workers": 0},
        "train": {"resources": {"GPU": 8}, "max_workers": 3, "labels": {"tidal.io/pool": "training"}},
        "plain": {"resources": {"GPU": 1, "CPU": 2}, "max_workers": 1},  # unlabelled: training
        "serve": {"resources": {"GPU": 4}, "max_workers": 4, "labels": {"tidal.io/pool": "inference"}},
        "cpu": {"resources": {"CPU": 8}, "max_workers": 5},
    }}
    assert sorted(launchable_gpus(config, [])) == [1, 8, 8, 8]
    alive = [{"Alive": True, "Labels": {NODE_GROUP_LABEL: "train"}},
             {"Alive": False, "Labels": {NODE_GROUP_LABEL: "train"}},
             {"Alive": True, "Labels": {NODE_GROUP_LABEL: "plain"}},
             {"Alive": True, "Labels": {NODE_GROUP_LABEL: "plain"}}]  # over its max: none left, not fewer
    assert sorted(launchable_gpus(config, alive)) == [8, 8]
    assert launchable_gpus({}, alive) == []
