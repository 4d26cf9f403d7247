"""The scheduler's Ray metrics (`ray.util.metrics`), exported as `ray_tidal_*` on every node's
metrics endpoint, so the Ray dashboard, Prometheus and Grafana show them."""

from __future__ import annotations

from typing import Any

from tidal.core.state import JobState


class Metrics:
    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge

        self.jobs = Gauge("tidal_jobs", "Tidal jobs per state", tag_keys=("state",))
        self.gpus = Gauge("tidal_job_gpus", "GPUs held by a Tidal job", tag_keys=("job",))
        self.sps = Gauge("tidal_job_samples_per_s", "Throughput of a Tidal job, predicted and measured",
                         tag_keys=("job", "kind"))
        self.changes = Counter("tidal_plan_changes", "Reconfigurations of running jobs", tag_keys=("job",))
        self.pool_gpus = Gauge("tidal_pool_gpus",
                               "GPUs per pool: total, lendable (inference), lent to training",
                               tag_keys=("pool", "kind"))
        self.reclaims = Counter("tidal_reclaims", "Jobs stopped to give lent GPUs back to Serve",
                                tag_keys=("job",))
        self.admission_s = Gauge("tidal_admission_seconds", "Seconds from submit to QUEUED or REJECTED",
                                 tag_keys=("job",))
        self.recall_lead_s = Gauge("tidal_recall_lead_seconds",
                                   "Seconds from a reclaim's decision to Serve's wanted replicas "
                                   "RUNNING (the last recall)")
        self.restart_s = Gauge("tidal_restart_cost_seconds",
                               "What the policy charges a restart: measured from the runs, or pinned")

    def update(self, recs: list[Any]) -> None:
        """Per-state counts and per-job GPUs and throughput from the store's records."""
        for state in JobState:
            self.jobs.set(sum(1 for r in recs if r.state is state), tags={"state": state.value})
        for r in recs:
            self.gpus.set(sum(int(g) for _, g in r.allocation or []), tags={"job": r.job_id})
            self.sps.set(r.predicted_sps, tags={"job": r.job_id, "kind": "predicted"})
            self.sps.set(r.measured_sps, tags={"job": r.job_id, "kind": "measured"})
