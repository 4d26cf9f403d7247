"""How a run ended, as the executor hands it to the scheduler: its result, or its error and
whether that error is the cluster's fault (the job resumes) or the job's own (it fails)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidal.jobs.runner import RunResult

# What an infrastructure failure looks like from a run's error: a dead worker, node or actor, or
# a collective torn down under a surviving worker (gloo/NCCL). Anything else — the job's loss or
# model raising, a non-finite loss (tidal.jobs.worker.NonFiniteLoss) — is the job's own error.
_INFRA_TYPES = ("ActorDiedError", "RayActorError", "WorkerCrashedError", "NodeDiedError",
                "ActorUnavailableError", "OwnerDiedError", "ObjectLostError", "RaySystemError",
                "RunHung", "GetTimeoutError",
                "RunBusy")  # the run host still holds the job's previous run: launched again later
# The storage failing under a checkpoint is the cluster's too: the job resumes from its newest
# complete checkpoint (measured: a full disk FAILED a job at its third checkpoint, the two before
# it complete; a job cannot be resumed once FAILED).
_INFRA_TEXT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL error",
               "ProcessGroupNCCL", "ProcessGroupGloo", "The actor died", "worker died",
               "node died", "SYSTEM_ERROR", "Socket Timeout",
               "No space left on device", "Disk quota exceeded", "Read-only file system",
               "Stale file handle")


def infrastructure_failure(error: BaseException) -> bool:
    """True if a run failed for the cluster's reason, not the job's (see the markers above). The
    job's own error wins when both appear: a NonFiniteLoss is never retried."""
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in chain and len(chain) < 10:
        chain.append(e)
        e = getattr(e, "cause", None) or e.__cause__ or e.__context__
    text = " ".join(f"{type(x).__name__}: {x}" for x in chain)
    if "NonFiniteLoss" in text or "non-finite loss" in text:
        return False
    return any(t in text for t in _INFRA_TYPES) or any(t in text for t in _INFRA_TEXT)


@dataclass(frozen=True, kw_only=True)
class Ended:
    """A run that ended: its result, or the error it ended with and what it reported before."""

    job_id: str
    result: RunResult | None
    error: Exception | None
    history: list[dict[str, Any]] = field(default_factory=list)  # with `error`: the steps it ran
    # with `error`: the cluster's fault (`infrastructure_failure`), judged where the exception
    # was raised, on its whole cause chain (which does not survive pickling)
    infrastructure: bool = False
