"""Shared fixtures. Unit tests need no cluster; `ray_cluster` starts one real local Ray cluster
(logical GPUs on a CPU machine) for the integration tests of the whole session."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
# Ray Train's controller takes one report per worker per poll (default every 2 s), so a run's
# checkpoints cost at least that much each; the tests' tiny model steps in ~8 ms and
# checkpoints every 10 steps, 12 times a second. A shorter poll (inherited by the clusters the
# tests start) keeps the runs' wall time about their steps, not the poll.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two Ray nodes on this machine, 2 logical CPUs and 2 logical GPUs each, both in the
    training pool (node label `tidal.io/pool`). `inference_node` adds a third for the serving tests.

    Yields the `ray.cluster_utils.Cluster`; its `node_ids` attribute lists the node ids, head
    first. (2 physical cores here: the logical CPUs only keep actors schedulable.)
    """
    import ray
    from ray.cluster_utils import Cluster

    os.environ["TIDAL_STORAGE"] = str(tmp_path_factory.mktemp("tidal-runs"))
    # profiles are cached per workload (`tidal.planner.profiler.workload_key`): a session starts
    # with none, so a test that needs a job profiled gives it a workload no test before it had
    os.environ["TIDAL_PROFILE_CACHE"] = str(tmp_path_factory.mktemp("tidal-profiles"))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2,
                                                            "labels": {"tidal.io/pool": "training"}})
    cluster.add_node(num_cpus=2, num_gpus=2, labels={"tidal.io/pool": "training"})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    head = ray.get_runtime_context().get_node_id()
    others = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head]
    cluster.node_ids = [head, *others]  # type: ignore[attr-defined]
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(autouse=True)
def _runs_end_with_their_test() -> Iterator[None]:
    """A test's training runs end with it. They are driven by the cluster's run host, a detached
    actor that outlives a scheduler (`tidal.platform.runhost`), so killing a test's scheduler no
    longer ends them: the host is killed after each test on the session's cluster, and the next
    test starts once Ray has removed the placement groups its runs held (up to 30 s: Ray frees
    them after their owners die, and a test that starts meanwhile sees GPUs taken)."""
    yield
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            from tidal.platform.runhost import stop_host

            if stop_host():
                _wait_for_placement_groups_removed(30.0)


def _wait_for_placement_groups_removed(timeout_s: float) -> None:
    import ray

    deadline = time.time() + timeout_s
    while time.time() < deadline and any(
            pg["state"] != "REMOVED" for pg in ray.util.placement_group_table().values()):
        time.sleep(0.5)


@pytest.fixture(scope="module")
def inference_node(ray_cluster: Any) -> Iterator[str]:
    """A node of the inference pool (label `tidal.io/pool=inference`, 4 logical GPUs, 2 CPUs) added
    to the session's cluster for one module of serving tests and removed after it; its id."""
    import ray

    before = {n["NodeID"] for n in ray.nodes()}
    node = ray_cluster.add_node(num_cpus=2, num_gpus=4, labels={"tidal.io/pool": "inference"})
    ray_cluster.wait_for_nodes()
    (nid,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in before]
    yield str(nid)
    ray_cluster.remove_node(node)


def tiny_gpt_spec(**overrides: Any) -> Any:
    """The tests' size of the reference job: 2 layers, width 64, 32 characters, batch 8."""
    from tidal.jobs.reference import shakespeare_gpt

    fields: dict[str, Any] = dict(
        name="tiny-gpt", seq_len=32, d_model=64, n_layer=2, n_head=4, global_batch=8,
        total_steps=30, min_gpus=1, max_gpus=2, lr=3e-3, weight_decay=0.01,
        checkpoint_every=100,
    )
    fields.update(overrides)
    return shakespeare_gpt(**fields)
