"""Which run failures are the cluster's (requeue from the newest checkpoint) and which the job's
(FAILED): no cluster needed, the errors are built as Ray Train raises them. And what the
executor reads from and removes in the runs' storage, on a directory of files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ray.exceptions import ActorDiedError

from tidal.jobs.checkpoint import META_FILE, METRICS_FILE, STATE_FILE
from tidal.jobs.runner import RunHung
from tidal.jobs.worker import NonFiniteLoss
from tidal.platform.executor import checkpoint_owner, prune_runs, run_checkpoints
from tidal.platform.outcome import infrastructure_failure


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
    # the storage failing under a checkpoint (as pyarrow's copy into storage words it)
    TrainingFailedError("Training failed", OSError(
        "[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device")),
    OSError(122, "Disk quota exceeded"),
    RunHung("no step for 901 s (SchedulerConfig.stall_s 900 s)"),  # aborted by the scheduler
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


def _checkpoint(run: Path, step: int, rows: range, *, whole: bool = True) -> Path:
    d = run / f"step_{step:08d}"
    d.mkdir(parents=True)
    (d / STATE_FILE).write_bytes(b"x" * 10)
    (d / META_FILE).write_text(json.dumps({"step": step, "state_bytes": 10 if whole else 99}))
    (d / METRICS_FILE).write_text(json.dumps([{"step": k, "loss": 1.0 / k} for k in rows]))
    return d


def test_a_lost_runs_curve_is_read_from_old_and_new_checkpoints(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint holds its run's rows so far (older ones: those since the previous one); a
    kept older checkpoint repeats steps, and a half-written newest one is skipped."""
    monkeypatch.setenv("TIDAL_STORAGE", str(tmp_path))
    run = tmp_path / "j-r0"
    _checkpoint(run, 10, range(1, 11))  # the old format: its own 10 steps
    newest = _checkpoint(run, 20, range(1, 21))  # the run's 20 so far
    _checkpoint(run, 30, range(1, 31), whole=False)  # cut short by a kill
    ckpt, step, metrics = run_checkpoints("j-r0")
    assert (ckpt, step) == (str(newest), 20)
    assert [m["step"] for m in metrics] == list(range(1, 21))
    assert run_checkpoints("j-r9") == (None, 0, [])


def test_pruning_removes_only_the_jobs_earlier_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_STORAGE", str(tmp_path))
    job = "gpt-1a2b3c"
    held = _checkpoint(tmp_path / f"{job}-r1", 40, range(1, 41))  # the job resumes from it
    for name in (f"{job}-r0", f"{job}-r2", f"{job}-r3", f"{job}-r4",  # r3: latest run; r4: not ours to judge
                 "gpt-1a2b3c-r1-ffffff-r0",  # another job's run, its name starting like ours
                 "profile-gpt-dp1-z0-mb8x1-17963", f"{job}-rx"):
        (tmp_path / name).mkdir()
    (tmp_path / f"{job}-r5").write_text("a file, not a run")
    os.symlink(tmp_path / f"{job}-r0", tmp_path / f"{job}-r6")
    assert prune_runs(job, None, None) == []  # never launched: nothing is earlier
    assert prune_runs(job, f"{job}-r3", str(held)) == [f"{job}-r0", f"{job}-r2"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([f"{job}-r1", f"{job}-r3", f"{job}-r4", f"{job}-r5", f"{job}-r6",
                           "gpt-1a2b3c-r1-ffffff-r0", "profile-gpt-dp1-z0-mb8x1-17963", f"{job}-rx"])
    assert held.is_dir()
    # the job moved on: a checkpoint in its latest run frees the one it resumed from
    assert prune_runs(job, f"{job}-r3", str(tmp_path / f"{job}-r3" / "step_00000080")) == [f"{job}-r1"]
    # a FAILED job whose latest run has checkpoints but whose record has none keeps that run
    assert prune_runs(job, f"{job}-r3", None) == [] and (tmp_path / f"{job}-r3").is_dir()


def test_a_checkpoints_owner_is_the_job_whose_run_wrote_it(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_STORAGE", str(tmp_path / "runs"))
    ckpt = _checkpoint(tmp_path / "runs" / "gpt-r2-1a2b3c-r11", 40, range(1, 41))
    assert checkpoint_owner(str(ckpt)) == "gpt-r2-1a2b3c"  # the last -r<k> numbers the run
    assert checkpoint_owner(str(tmp_path / "runs" / "profile-gpt-dp1" / "step_1")) is None
    assert checkpoint_owner(str(tmp_path / "runs")) is None
    assert checkpoint_owner(str(_checkpoint(tmp_path / "elsewhere" / "gpt-r0", 1, range(1, 2)))) is None
