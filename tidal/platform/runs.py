"""The run tracker: what the scheduler knows of each job's live run, and what happens when it ends.

One `Run` record per live run (when it was launched, last observed, asked to stop, judged
hung), from its launch until its end is collected. Each tick `collect` reads the live runs'
progress into the store (and the online correction of their predicted throughput), aborts hung
runs (`watch`), and moves the job of every run that ended to its next state:

    finished                         → SUCCEEDED
    stopped as asked                 → QUEUED from its checkpoint (a reconfiguration or reclaim)
                                       or CANCELLED (a cancel was asked for)
    the cluster's fault              → QUEUED from the newest checkpoint its run left, counted
                                       in `restarts`, up to `max_infra_restarts`
    its own error                    → FAILED, with the error and its newest checkpoint

Each end is written through the `Recorder`, so a state file that refuses it loses nothing. The
restart cost the policy charges is measured here (`tidal.core.restarts`): a run's launch to its
first step, and a stop asked for to the run's end.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from tidal.core.correction import Correction, observe
from tidal.core.restarts import RestartCost
from tidal.jobs.checkpoint import CheckpointError, read_meta
from tidal.jobs.runner import RunResult
from tidal.jobs.spec import JobSpec
from tidal.jobs.storage import checkpoint_done
from tidal.platform.config import SchedulerConfig
from tidal.platform.curves import Curves
from tidal.platform.errors import error_text
from tidal.platform.executor import Executor, prune_runs, run_checkpoints
from tidal.platform.outcome import Ended
from tidal.platform.recording import Recorder
from tidal.platform.store import JobRecord, JobState, Store, StoreWriteError

log = logging.getLogger("tidal.scheduler")
RESTART_SAMPLES = "restart_cost"  # the store's key for `RestartCost.samples()`
LOG_LIMIT = 10_000  # entries kept of the placement log


@dataclass
class Run:
    """One live run, as the scheduler sees it (times from `time.time()`)."""

    launched_at: float | None = None  # by this actor (None: not known)
    observed_at: float | None = None  # its throughput last read (None: no step yet)
    stop_asked_at: float | None = None  # asked to stop at its next step boundary
    hung: bool = False  # aborted by `watch`; ends with RunHung


class RunTracker:
    """The live runs' records and the transitions of the jobs whose runs end."""

    def __init__(self, store: Store, executor: Executor, cfg: SchedulerConfig, curves: Curves,
                 recorder: Recorder, note: Callable[[str], None],
                 spec_of: Callable[[JobRecord], JobSpec]) -> None:
        self.store, self.executor, self.cfg, self.curves = store, executor, cfg, curves
        self.recorder, self.note, self.spec_of = recorder, note, spec_of
        self.records: dict[str, Run] = {}
        self.spent: dict[str, tuple[str, int, bool]] = {}  # `compute_steps`' memory
        # for every run that ended (but runs aborted before their first step): the nodes the
        # decision named and where its workers ran
        self.placement_checks: deque[dict[str, Any]] = deque(maxlen=LOG_LIMIT)
        # the restart cost measured from this actor's runs and its predecessors' (kept in the store)
        self.restart = RestartCost().restored(store.measured(RESTART_SAMPLES))
        # each job's (latest run, checkpoint) its storage was last pruned at (`prune`); the
        # pruning runs off the loop: a checkpoint of a large model on a network filesystem is GBs
        self.pruned: dict[str, tuple[str | None, str | None]] = {}
        self.pruner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidal-prune")

    def launched(self, job_id: str, at: float) -> None:
        """A run of `job_id` was launched at `at`: a new record."""
        self.records[job_id] = Run(launched_at=at)

    def stop_asked(self, job_id: str, at: float) -> None:
        """The job's run was asked to stop (the first time counts: the stop's measured cost)."""
        run = self.records.setdefault(job_id, Run())
        if run.stop_asked_at is None:
            run.stop_asked_at = at

    def stopping(self, job_id: str) -> bool:
        run = self.records.get(job_id)
        return run is not None and run.stop_asked_at is not None

    def running_s(self, job_id: str, now: float) -> float:
        """Seconds the job's run has run since its launch by this actor (0 if not known)."""
        run = self.records.get(job_id)
        at = run.launched_at if run is not None and run.launched_at is not None else now
        return max(0.0, now - at)

    def observe_restart(self, **sample: float) -> None:
        """One more measured start or stop (`RestartCost.observe`), kept in the store."""
        self.restart = self.restart.observe(**sample)
        try:
            self.store.set_measured(RESTART_SAMPLES, self.restart.samples())
        except StoreWriteError as e:  # the next sample stores them all
            log.warning("restart cost not stored: %s", e)

    def restart_cost_s(self) -> float:
        return self.cfg.restart_cost_s if self.cfg.restart_cost_s is not None else self.restart.seconds

    def collect(self) -> None:
        """Step 1: progress of the live runs into the store; the runs that ended into states."""
        now = time.time()
        recs = {r.job_id: r for r in self.store.all()}
        for jid in list(self.executor.jobs):
            p = self.executor.progress(jid)
            if not p:
                continue
            upd: dict[str, Any] = {"step": int(p["step"]), "measured_sps": float(p["samples_per_s"])}
            compute_steps(recs[jid], p, self.spent)  # remembered for the snapshot: the run is not asked again
            run = self.records.setdefault(jid, Run())
            last, run.observed_at = run.observed_at, now
            if last is None and run.launched_at is not None:  # the run's first step
                self.observe_restart(start_s=now - run.launched_at)
            if self.cfg.correction is not None and last is not None:  # a run's first report: start-up
                rec = recs[jid]
                c = observe(correction(rec), gpus=sum(int(g) for _, g in rec.allocation or []),
                            predicted=rec.predicted_sps, measured=upd["measured_sps"], dt=now - last,
                            cfg=self.cfg.correction)
                upd["sps_ratios"] = [[n, r] for n, r in c.ratios]
            try:
                self.store.update(jid, **upd)
            except StoreWriteError as e:  # progress only: the run reports again at the next tick
                log.warning("progress of %s not stored: %s", jid, e)
        self.watch()
        recs = {r.job_id: r for r in self.store.all()}
        for ended in self.executor.collect({jid: r.allocation for jid, r in recs.items()}):
            end = partial(self.record_end, ended, time.time())
            self.recorder.write(f"the end of {ended.job_id}'s run", end)

    def watch(self) -> None:
        """Step 1: a run with no step for `stall_s` (rank 0 calls in once per step it executes;
        before its first, counted from its launch) is hung, and is aborted: `collect` then hands
        it back ended with `RunHung`, and the job resumes from its newest checkpoint. Without it,
        one stopped worker leaves its job RUNNING for good, a cancel leaves it STOPPING for good,
        and as a STOPPING job holds every decision back, the whole cluster waits."""
        for jid in list(self.executor.jobs):
            quiet = self.executor.quiet_s(jid)  # None: not known this tick
            run = self.records.setdefault(jid, Run())
            if quiet is not None and quiet > self.cfg.stall_s and not run.hung:
                run.hung = True
                why = f"no step for {quiet:.0f} s (SchedulerConfig.stall_s {self.cfg.stall_s:g} s)"
                self.executor.abort_hung(jid, why)
                self.note(f"{jid}: its run is hung, {why}: aborted")

    def record_end(self, ended: Ended, at: float) -> None:
        """The job of a run that ended (`at`, when it was collected) goes to its next state.
        Retried whole while the state file refuses it (`Recorder.write`), so it writes the store before
        it changes anything else."""
        jid, rec = ended.job_id, self.store.get(ended.job_id)
        if ended.result is None:
            assert ended.error is not None
            self.run_failed(rec, ended.error, ended.history, infrastructure=ended.infrastructure)
        else:
            self.record_result(rec, ended.result)
        run = self.records.pop(jid, None)
        asked = run.stop_asked_at if run is not None else None
        if asked is not None and ended.result is not None and not ended.result.finished:
            self.observe_restart(stop_s=at - asked)  # stopped as asked
        r = ended.result
        if r is not None and r.aborted:  # stopped before its first step: no worker group to check
            self.note(f"{jid}: run {r.run_id} stopped before its first step (aborted)")
        elif r is not None:
            named = sorted(n for n, g in rec.allocation or [] for _ in range(int(g)))
            ran = sorted(r.worker_nodes.values())
            self.placement_checks.append({"job_id": jid, "run_id": r.run_id, "decided": named, "ran": ran})
            if named != ran:
                self.note(f"{jid}: workers ran on {ran}, the decision named {named}")

    def record_result(self, rec: JobRecord, r: RunResult) -> None:
        """A run that returned: its job SUCCEEDED, CANCELLED (asked for), or QUEUED from the
        checkpoint it stopped with."""
        jid = rec.job_id
        self.curves.save(jid, r.history)
        fields: dict[str, Any] = {"checkpoint": r.checkpoint, "step": r.final_step, "allocation": None}
        if r.finished:
            self.store.transition(jid, JobState.SUCCEEDED, f"finished at step {r.final_step}",
                                  finished=time.time(), **fields)
            self.note(f"{jid} SUCCEEDED at step {r.final_step}")
        elif rec.cancel_requested:
            self.store.transition(jid, JobState.CANCELLED, f"cancelled at step {r.final_step}",
                                  finished=time.time(), **fields)
            self.note(f"{jid} CANCELLED at step {r.final_step}")
        else:
            self.store.transition(jid, JobState.QUEUED,
                                  f"stopped at step {r.final_step} with a checkpoint",
                                  restarts=rec.restarts + 1, **fields)
            self.note(f"{jid} stopped at step {r.final_step} for reconfiguration")

    def run_failed(self, rec: JobRecord, e: Exception, history: list[dict[str, Any]], *,
                   infrastructure: bool) -> None:
        """A run ended with error `e`. The cluster's fault (`infrastructure`: a dead worker or
        node, a broken collective, `outcome.infrastructure_failure`) sends the job back to QUEUED from the
        newest checkpoint in its run's storage, counted in `restarts`, up to
        `max_infra_restarts` (`requeue`: SUCCEEDED if that checkpoint is the whole job); the
        job's own error (its loss or model raising, a non-finite
        loss) fails it alone. A job whose cancel was asked for is CANCELLED either way.

        `history` is what the run reported up to its error. A job that ends here keeps it as its
        curve (`history()`: the loss up to the step that raised), and its record the newest
        complete checkpoint its run left, with that step (what `tidal resume` starts from); a
        requeued one keeps only the steps up to its checkpoint, since the next run computes the
        later ones again."""
        jid = rec.job_id
        error, first = error_text(e)
        newest, at, metrics = run_checkpoints(rec.run_id)  # what the run left, if anything
        ended: dict[str, Any] = {"checkpoint": newest, "step": at} if newest is not None else {}
        if rec.cancel_requested:
            self.curves.save(jid, history)
            self.store.transition(jid, JobState.CANCELLED, f"cancelled; its run ended with {first}",
                                  allocation=None, finished=time.time(), **ended)
            return
        if infrastructure:
            ckpt, step = newest, at
            self.curves.save(jid, metrics)
            if ckpt is None:  # nothing new: back to the checkpoint it started from
                ckpt = rec.checkpoint
                step = int(read_meta(ckpt)["step"]) if ckpt else 0
            if self.requeue(rec, ckpt, step, f"run failed for an infrastructure reason ({first})",
                             requeue=rec.restarts < self.cfg.max_infra_restarts):
                return
        self.curves.save(jid, history)
        self.store.transition(jid, JobState.FAILED, first, error=error, allocation=None, finished=time.time(),
                              **ended)
        self.note(f"{jid} FAILED: {first}")

    def requeue(self, r: JobRecord, ckpt: str | None, step: int, why: str, *, requeue: bool = True) -> bool:
        """A running or stopping job whose run was lost (`why`) goes back to QUEUED from `ckpt`,
        counted in `restarts` (if `requeue`: else nothing happens and this returns False) -- or
        ends SUCCEEDED when `ckpt` already holds the whole job (a run killed after its last
        checkpoint, before it reported: measured, relaunching it from there raised at every tick
        and the job sat QUEUED for good)."""
        jid = r.job_id
        if checkpoint_done(self.spec_of(r), ckpt):
            self.store.transition(jid, JobState.SUCCEEDED, f"{why}; its checkpoint at step {step} is the "
                                  f"whole job", allocation=None, checkpoint=ckpt, step=step,
                                  restarts=r.restarts + 1, finished=time.time())
            self.note(f"{jid} SUCCEEDED at step {step} ({why} after its last checkpoint)")
            return True
        if not requeue:
            return False
        self.store.transition(jid, JobState.QUEUED, f"{why}; resumes from step {step}", allocation=None,
                              checkpoint=ckpt, step=step, restarts=r.restarts + 1)
        self.note(f"{jid} {why}; requeued from step {step}")
        return True

    def prune(self, recs: list[JobRecord]) -> None:
        """Step 1's end: a job whose latest run or checkpoint changed has its earlier runs
        removed from storage (`executor.prune_runs`), in the background. With each run keeping
        its newest `JobSpec.keep_checkpoints`, a job holds at most its latest run's and the
        one its checkpoint is in."""
        for r in recs:
            key = (r.run_id, r.checkpoint)
            if self.pruned.get(r.job_id) != key:
                self.pruned[r.job_id] = key
                self.pruner.submit(self.prune_job, r.job_id, r.run_id, r.checkpoint)

    def prune_job(self, job_id: str, run_id: str | None, checkpoint: str | None) -> None:
        try:
            removed = prune_runs(job_id, run_id, checkpoint)
        except Exception as e:  # storage trouble: the runs stay; a later change tries again
            log.warning("pruning %s's earlier runs failed: %s", job_id, e)
            return
        if removed:
            self.note(f"{job_id}: removed its earlier runs from storage ({', '.join(removed)})")

    def recover(self) -> None:
        """A scheduler's start: the runs its predecessor left. The run host drives runs apart from
        the scheduler (`tidal.platform.runhost`), so a run its state file says is RUNNING or
        STOPPING is usually still there: it is adopted as it is (a stop asked for stays asked),
        and the policy, whose inputs are the store's, decides about it as the predecessor would
        have. A run that is gone (the host died with it, or Ray restarted) sends its job back to
        QUEUED from the newest checkpoint it left (CANCELLED if a cancel was asked for;
        SUCCEEDED if that checkpoint is the whole job). A run the host drives that no record
        names (its launch never recorded) is stopped and dropped."""
        live = self.executor.adopt()
        for r in self.store.all():
            if r.state in (JobState.RUNNING, JobState.STOPPING):
                found = live.pop(r.job_id, None)
                if found is not None and found[0] == r.run_id:
                    self.adopt(r, launched_at=found[1], stop_asked_at=found[2])
                    continue
                if found is not None:  # another run of the job: not the one the record names
                    live[r.job_id] = found
                self.lost(r)
            elif r.state is JobState.PROFILING:
                self.note(f"{r.job_id} admission starts again after a scheduler restart")
        for jid, (run_id, _, _) in live.items():
            self.executor.discard(jid)
            self.note(f"{jid}: run {run_id} is not in the state file; stopped")

    def adopt(self, r: JobRecord, *, launched_at: float, stop_asked_at: float | None) -> None:
        """The job's live run is this scheduler's: tracked, with its launch time (the policy's
        view of how long it has run) and its stop, asked for again if the record says STOPPING."""
        self.executor.track(r.job_id)
        self.records[r.job_id] = Run(launched_at=launched_at, stop_asked_at=stop_asked_at)
        if r.state is JobState.STOPPING:
            self.executor.stop(r.job_id)
            self.stop_asked(r.job_id, time.time())
        self.note(f"scheduler restarted: adopted {r.job_id}'s run {r.run_id} ({r.state.value}, "
                  f"step {r.step})")

    def lost(self, r: JobRecord) -> None:
        """The job's run is gone: requeued from the newest checkpoint its run left."""
        ckpt, step, metrics = run_checkpoints(r.run_id)
        self.curves.save(r.job_id, metrics)
        if r.cancel_requested:
            self.store.transition(r.job_id, JobState.CANCELLED, "cancelled; the scheduler restarted "
                                  "while it stopped", allocation=None, finished=time.time(),
                                  checkpoint=ckpt or r.checkpoint, step=max(step, r.step))
            return
        self.requeue(r, ckpt or r.checkpoint, max(step, r.step), f"scheduler restarted: run {r.run_id} lost")


def compute_steps(r: JobRecord, progress: dict[str, Any] | None,
                  seen: dict[str, tuple[str, int, bool]]) -> int:
    """The steps job `r`'s budget has spent (`JobSpec.total_steps` counts these): its data
    position `step`, plus, for an AutoLRS job, its losing probes' steps (`tidal.jobs.autolrs`).
    From its live run's `progress`, else from its last checkpoint's meta, else the data
    position. `seen` (job → (checkpoint, steps, from a live run)) reads each checkpoint once and
    keeps a running job's last figure for the moment between its run's end and the store
    catching up (else the status would fall back to the data position for a tick)."""
    key = r.checkpoint or ""
    if progress and "compute_steps" in progress:
        spent = max(int(progress["compute_steps"]), int(progress["step"]), r.step)
        seen[r.job_id] = (key, spent, True)
        return spent
    known = seen.get(r.job_id)
    live = r.state in (JobState.RUNNING, JobState.STOPPING)
    if known is None or known[0] != key or (known[2] and not live):
        spent = r.step
        if r.checkpoint is not None:
            try:
                spent = int(read_meta(r.checkpoint).get("compute_steps", r.step))
            except (OSError, ValueError, CheckpointError):  # gone or unreadable: the position
                spent = r.step
        known = seen[r.job_id] = (key, spent, False)
    return max(r.step, known[1])


def correction(r: JobRecord) -> Correction:
    """The job's online correction as the store keeps it (`JobRecord.sps_ratios`)."""
    return Correction(ratios=tuple((int(n), float(x)) for n, x in r.sps_ratios))
