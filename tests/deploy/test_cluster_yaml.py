"""cluster.yaml (the Ray cluster launcher's config for AWS) passes Ray's own validation, and says
what Tidal needs: two labelled GPU pools, Tidal installed as the Makefile does, and Tidal's
control plane started after Ray on the head."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[2]


def _load() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    return config


def test_cluster_yaml_passes_rays_validation() -> None:
    validate_config(prepare_config(_load()))  # what `ray up` runs before anything else


def test_cluster_yaml_has_the_pools_the_setup_and_the_control_plane() -> None:
    cfg = _load()
    types = cfg["available_node_types"]
    pools = {name: t.get("labels", {}).get("tidal.io/pool") for name, t in types.items()}
    assert pools["inference_gpu"] == "inference" and pools["training_gpu"] == "training"
    for name in ("inference_gpu", "training_gpu"):
        assert 0 <= types[name]["min_workers"] <= types[name]["max_workers"]
    assert any("make setup" in c for c in cfg["setup_commands"])
    start = cfg["head_start_ray_commands"]
    ray_at = next(i for i, c in enumerate(start) if "ray start --head" in c)
    tidal_at = next(i for i, c in enumerate(start) if "tidal start" in c)
    assert ray_at < tidal_at


def test_a_broken_config_fails_the_same_validation() -> None:
    cfg = copy.deepcopy(_load())
    cfg["available_node_types"]["training_gpu"]["min_workers"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(cfg))


def test_local_autoscaling_config_mirrors_the_pools_and_passes_validation() -> None:
    """cluster-local.yaml (the fake multi-node provider's config, tests/deploy/test_autoscaling.py)
    passes the same validation and has cluster.yaml's two labelled pools, with logical GPUs."""
    local: dict[str, Any] = yaml.safe_load((ROOT / "cluster-local.yaml").read_text())
    validate_config(prepare_config(copy.deepcopy(local)))
    assert local["provider"]["module"].endswith("fake_multi_node.node_provider.FakeMultiNodeProvider")
    types = local["available_node_types"]
    for name, pool in (("inference_gpu", "inference"), ("training_gpu", "training")):
        assert types[name]["labels"]["tidal.io/pool"] == pool
        assert types[name]["resources"]["GPU"] >= 1
