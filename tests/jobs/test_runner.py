"""The runner on a real local Ray cluster: Ray Train V2 workers building real DeepSpeed engines
(gloo on CPU, each worker holding a logical GPU)."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import pytest

from tests.conftest import tiny_gpt_spec
from tidal.jobs import Plan, PlanError, SpecError
from tidal.jobs.checkpoint import read_meta
from tidal.jobs.runner import Resources, launch, run

pytestmark = pytest.mark.integration


def _res(plan: Plan) -> Resources:
    return Resources(num_workers=plan.dp, gpus_per_worker=1)


def test_reconfigured_run_reproduces_uninterrupted_loss_curve(ray_cluster: Any) -> None:
    """30 steps on 2 workers in one go, and again through every ZeRO stage on 2 workers and
    world sizes 2 → 1 → 2: (dp=2, ZeRO-0) → (dp=2, ZeRO-1) → (dp=1, ZeRO-3) → (dp=2, ZeRO-3) →
    (dp=2, ZeRO-2 + CPU optimizer offload, DeepSpeed's CPU Adam), reconfigured every 6 steps.
    Each segment trains (its loss falls with the curve's)."""
    spec = tiny_gpt_spec(total_steps=30)
    whole = run(spec, Plan(dp=2, zero_stage=1, micro_batch=2, grad_accum=2),
                _res(Plan(dp=2)))
    assert whole.finished and whole.final_step == 30 and len(whole.losses) == 30

    segments = [
        (Plan(dp=2, zero_stage=0, micro_batch=4), 6),
        (Plan(dp=2, zero_stage=1, micro_batch=2, grad_accum=2), 12),
        (Plan(dp=1, zero_stage=3, micro_batch=4, grad_accum=2), 18),
        (Plan(dp=2, zero_stage=3, micro_batch=2, grad_accum=2), 24),
        (Plan(dp=2, zero_stage=2, offload_optimizer=True, micro_batch=4, grad_accum=1), None),
    ]
    losses: list[float] = []
    ckpt = None
    for plan, stop in segments:
        r = run(spec, plan, _res(plan), ckpt, stop_at_step=stop)
        assert r.start_step == (0 if ckpt is None else read_meta(ckpt)["step"])
        assert all(m["plan"] == plan.short() for m in r.history)
        losses += r.losses
        ckpt = r.checkpoint
        assert ckpt is not None and read_meta(ckpt)["step"] == r.final_step
        assert read_meta(ckpt)["plan"] == plan.to_dict()
        # the shape it was trained at, for what serves it (ZeRO-3 partitions the module's weights,
        # not its config)
        assert read_meta(ckpt)["model"] == dataclasses.asdict(spec.model().cfg)
    assert r.finished and len(losses) == 30
    rel = [abs(a - b) / abs(a) for a, b in zip(whole.losses, losses, strict=True)]
    print(f"max relative loss difference over 30 steps: {max(rel):.2e}")
    assert max(rel) <= 1e-3, f"max relative difference {max(rel):.2e} at step {rel.index(max(rel))}"
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5  # and it learned something


def test_stop_at_next_step_boundary_with_checkpoint(ray_cluster: Any) -> None:
    spec = tiny_gpt_spec(total_steps=10_000, checkpoint_every=10_000)
    plan = Plan(dp=2, zero_stage=2, micro_batch=4)
    handle = launch(spec, plan, _res(plan))
    deadline = time.time() + 180
    while (handle.progress() or {}).get("step", 0) < 3:
        assert time.time() < deadline and not handle.done(), "run made no progress"
        time.sleep(0.5)
    handle.stop()
    r = handle.result(timeout=180)
    assert not r.finished and 3 <= r.final_step < 10_000
    assert r.checkpoint is not None and read_meta(r.checkpoint)["step"] == r.final_step
    assert r.stop_requested_at is not None


def test_stop_before_the_first_step_aborts_and_keeps_the_launch_checkpoint(ray_cluster: Any) -> None:
    """A stop that finds no step trained does not wait for the workers and engines to come up:
    the run is aborted, ends with the checkpoint it was launched from, and its GPUs are free for
    the next run, which resumes from that checkpoint."""
    spec = tiny_gpt_spec(total_steps=10_000, checkpoint_every=10_000)
    plan = Plan(dp=2, zero_stage=1, micro_batch=4)
    first = run(spec, plan, _res(plan), stop_at_step=2)
    assert first.checkpoint is not None and first.final_step == 2 and not first.aborted

    handle = launch(spec, plan, _res(plan), first.checkpoint)
    handle.stop()  # before the controller has even started: aborted as soon as it registers
    r = handle.result(timeout=180)
    assert r.aborted and not r.finished
    assert r.start_step == r.final_step == 2 and r.checkpoint == first.checkpoint and r.history == []
    assert r.stop_requested_at is not None

    nxt = run(spec, plan, _res(plan), r.checkpoint, stop_at_step=4)  # the same 2 GPUs, free again
    assert not nxt.aborted and nxt.start_step == 2 and nxt.final_step == 4
    assert [m["step"] for m in nxt.history] == [3, 4]


def test_launch_validates_before_starting(ray_cluster: Any) -> None:
    spec = tiny_gpt_spec()
    with pytest.raises(PlanError, match="needs 2 workers"):
        launch(spec, Plan(dp=2, micro_batch=4), Resources(num_workers=1))
    with pytest.raises(PlanError, match="global batch"):
        launch(spec, Plan(dp=2, micro_batch=1), Resources(num_workers=2))
    with pytest.raises(SpecError, match=r"Resources\.node_ids"):
        Resources(num_workers=2, node_ids=("a",))


def test_workers_run_on_the_nodes_asked_for(ray_cluster: Any) -> None:
    head, other = ray_cluster.node_ids
    spec = tiny_gpt_spec(total_steps=2)
    plan = Plan(dp=2, zero_stage=1, micro_batch=4)
    both_other = run(spec, plan, Resources(num_workers=2, gpus_per_worker=1, node_ids=(other, other)))
    assert both_other.worker_nodes == {0: other, 1: other}
    split = run(spec, plan, Resources(num_workers=2, gpus_per_worker=1, node_ids=(head, other)))
    assert split.worker_nodes == {0: head, 1: other}


def test_autolrs_job_resumes_its_stage_on_another_worker_count(ray_cluster: Any) -> None:
    """An AutoLRS job on 2 workers stopped after its first stage's search (both ranks chose the
    winner; rank 0 alone wrote the stage's study), resumed on 1 worker under ZeRO-3: the same
    stages, winners and losses as the job run in one go (here, in-process)."""
    import optuna

    from tests.jobs.test_autolrs import _run
    from tidal.jobs.autolrs import AutoLRS
    from tidal.jobs.checkpoint import TrainState
    from tidal.jobs.engine import init_world_of_one
    from tidal.jobs.storage import storage_root

    tuner = AutoLRS(lr_min=1e-4, lr_max=3e-2, trials=3, startup_trials=2, min_trials=3,  # 3 a stage
                    first_stage=12, min_probe=3, probe_fraction=0.1, warmup_steps=0, anneal=0,
                    search_down=True)
    spec = tiny_gpt_spec(name="autolrs-ray", lr=tuner, total_steps=60, checkpoint_every=1000)
    init_world_of_one("gloo")
    whole = _run(spec, Plan(dp=1, zero_stage=1, micro_batch=8), None, None)
    assert whole.saved is not None
    history = whole.saved.extra["autolrs"]["history"]

    two = Plan(dp=2, zero_stage=1, micro_batch=4)
    first = run(spec, two, _res(two), stop_at_step=14, job_key="autolrs-ray-test")
    assert not first.finished and first.checkpoint is not None
    meta = read_meta(first.checkpoint)
    # 3 probes of 3 steps, then the winner's probe steps are the stage's first 3: 5 steps on
    assert meta["compute_steps"] == 14 and meta["step"] == 8
    assert len(TrainState.load(first.checkpoint).extra["autolrs"]["history"]) == 1
    one = Plan(dp=1, zero_stage=3, micro_batch=4, grad_accum=2)
    second = run(spec, one, _res(one), first.checkpoint, job_key="autolrs-ray-test")
    assert second.finished
    resumed = TrainState.load(second.checkpoint).extra["autolrs"]["history"]
    assert [(h["stage"], h["start"], h["lr"]) for h in resumed] == [
        (h["stage"], h["start"], h["lr"]) for h in history]
    ref = {r["step"]: r["loss"] for r in whole.rows}
    got = {int(r["step"]): r["loss"] for r in first.history + second.history}
    common = sorted(set(got) & set(ref))
    assert len(common) >= len(ref) - 1 >= 45
    assert [got[k] for k in common] == pytest.approx([ref[k] for k in common], rel=1e-3)
    assert all(r["compute_steps"] >= r["step"] for r in second.history)
    # every finished stage's search is an Optuna study in the job's SQLite file
    db = storage_root() / "autolrs" / "autolrs-ray-test.sqlite"
    studies = optuna.get_all_study_summaries(f"sqlite:///{db}")
    assert len(studies) == len(history) and all(s.n_trials == 3 for s in studies)


class NanAfter:
    """A loss that turns NaN after `n` calls in a process (the profiles of a job would pass)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, model: Any, batch: Any) -> Any:
        from tidal.jobs.models import lm_loss

        self.calls += 1
        loss = lm_loss(model, batch)
        return loss * float("nan") if self.calls > self.n else loss


@pytest.mark.integration
def test_nan_loss_fails_the_run_naming_the_step(ray_cluster: Any) -> None:
    spec = tiny_gpt_spec(name="nan-loss", total_steps=60, checkpoint_every=10, loss=NanAfter(40))
    with pytest.raises(Exception, match=r"non-finite loss at step 41"):
        run(spec, Plan(dp=1, micro_batch=8), Resources(num_workers=1, gpus_per_worker=1))


def test_storage_that_cannot_hold_checkpoints_is_one_line(tmp_path: Any, monkeypatch: Any) -> None:
    """No cluster: `check_storage` names the storage and why (a file where the directory should
    be, a parent that is a file), and creates a missing directory."""
    from tidal.jobs.storage import StorageError, check_storage

    monkeypatch.setenv("TIDAL_STORAGE", str(tmp_path / "new" / "runs"))
    assert check_storage() == tmp_path / "new" / "runs" and (tmp_path / "new" / "runs").is_dir()
    (tmp_path / "file").write_text("not a directory")
    for bad in (tmp_path / "file", tmp_path / "file" / "runs"):
        monkeypatch.setenv("TIDAL_STORAGE", str(bad))
        with pytest.raises(StorageError, match=rf"^\$TIDAL_STORAGE {bad} cannot hold checkpoints "
                                               r"\((not a directory|.+)\): it must be a writable directory"):
            check_storage()


def test_a_resume_point_is_a_complete_checkpoint_with_steps_left(tmp_path: Any) -> None:
    """No cluster: `resume_point` is where a job with `JobSpec.resume_from` starts, or one line
    naming the field and what is wrong with the directory."""
    import torch

    from tidal.jobs.checkpoint import STATE_FILE, TrainState
    from tidal.jobs.storage import resume_point

    spec = tiny_gpt_spec(total_steps=60)
    assert resume_point(spec) is None
    ckpt = tmp_path / "j-r0" / "step_00000040"
    TrainState(step=40, seed=0, adam_step=40, params={"w": torch.ones(3)},
               meta={"compute_steps": 44}).save(ckpt)
    assert resume_point(dataclasses.replace(spec, resume_from=ckpt)) == (str(ckpt), 40)  # a Path is fine
    relative = dataclasses.replace(spec, resume_from=os.path.relpath(ckpt))
    assert resume_point(relative) == (str(ckpt), 40)  # made absolute where it is read
    for steps, ok in ((44, False), (45, True)):  # an AutoLRS job's probe steps count too
        done = dataclasses.replace(spec, total_steps=steps, resume_from=str(ckpt))
        if ok:
            assert resume_point(done) == (str(ckpt), 40)
        else:
            with pytest.raises(SpecError, match=r"is at step 44: total_steps \(44\) leaves nothing to train"):
                resume_point(done)
    bad = {tmp_path / "missing": "is not a directory",
           tmp_path: "is not a complete Tidal checkpoint: .* does not exist"}
    with open(ckpt / STATE_FILE, "ab") as f:  # a state file longer than its meta says
        f.write(b"x")
    bad[ckpt] = "is not a complete Tidal checkpoint: .* half-written"
    for path, says in bad.items():
        with pytest.raises(SpecError, match=rf"^JobSpec.resume_from: {path} {says}"):
            resume_point(dataclasses.replace(spec, resume_from=str(path)))
