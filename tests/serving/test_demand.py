"""Serve's demand read from a `serve.status()` result (`tidal.serving.demand`), no cluster: the
status objects are Ray Serve's own schema classes, built as `serve.status()` returns them."""

from __future__ import annotations

from ray.serve._private.common import DeploymentStatus, DeploymentStatusTrigger, ReplicaState
from ray.serve.schema import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentStatusOverview,
    ServeStatus,
)

from tidal.serving.demand import WANTED, replicas_running, replicas_wanted


def _deployment(states: dict[ReplicaState, int]) -> DeploymentStatusOverview:
    return DeploymentStatusOverview(status=DeploymentStatus.UPSCALING,
                                    status_trigger=DeploymentStatusTrigger.AUTOSCALING,
                                    replica_states=states, message="")


def _status(apps: dict[str, dict[str, dict[ReplicaState, int]]]) -> ServeStatus:
    return ServeStatus(applications={
        name: ApplicationStatusOverview(status=ApplicationStatus.RUNNING, message="",
                                        last_deployed_time_s=0.0,
                                        deployments={d: _deployment(s) for d, s in deps.items()})
        for name, deps in apps.items()})


def test_every_replica_state_but_stopping_counts_as_wanted() -> None:
    # a Ray upgrade that adds a replica state fails here instead of silently lending its GPUs
    assert set(WANTED) == {s.value for s in ReplicaState} - {"STOPPING", "STOPPED"}


def test_wanted_and_running_sum_over_applications_and_deployments() -> None:
    status = _status({
        "gpt": {"Model": {ReplicaState.RUNNING: 2, ReplicaState.STARTING: 3, ReplicaState.STOPPING: 4},
                "Ingress": {ReplicaState.RUNNING: 1}},
        "other": {"Model": {ReplicaState.RECOVERING: 1, ReplicaState.STOPPED: 7,
                            ReplicaState.UPDATING: 1, ReplicaState.PENDING_MIGRATION: 1}},
    })
    # STARTING counts: a replica waiting for a GPU training holds is demand not yet met
    assert replicas_wanted(status) == 2 + 3 + 1 + 1 + 1 + 1
    assert replicas_running(status) == 2 + 1


def test_no_applications_is_no_demand() -> None:
    assert replicas_wanted(ServeStatus()) == 0
    assert replicas_running(ServeStatus()) == 0
    assert replicas_wanted(_status({"gpt": {}})) == 0
