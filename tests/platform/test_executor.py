"""Which run failures are the cluster's (requeue from the newest checkpoint) and which the job's
(FAILED): no cluster needed, the errors are built as Ray Train raises them."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorDiedError

from tidal.jobs.worker import NonFiniteLoss
from tidal.platform.executor import infrastructure_failure


class TrainingFailedError(RuntimeError):
    """Stands for Ray Train's wrapper: the worker's error as its cause."""

    def __init__(self, msg: str, cause: BaseException) -> None:
        super().__init__(msg)
        self.cause = cause


@pytest.mark.parametrize("error", [
    ActorDiedError(),
    TrainingFailedError("worker group failed", ActorDiedError()),
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer"),
    TrainingFailedError("Training failed", RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970")),
])
def test_the_clusters_faults_are_infrastructure(error: BaseException) -> None:
    assert infrastructure_failure(error)


@pytest.mark.parametrize("error", [
    RuntimeError("boom: the training function failed"),
    TrainingFailedError("Training failed", ValueError("shapes (3, 4) and (5,) do not match")),
    TrainingFailedError("Training failed", NonFiniteLoss("non-finite loss at step 43: nan")),
    # a non-finite loss wins even when a collective broke as the ranks raised it
    TrainingFailedError("Connection closed by peer", NonFiniteLoss("non-finite loss at step 7: inf")),
])
def test_the_jobs_own_errors_are_not(error: BaseException) -> None:
    assert not infrastructure_failure(error)
