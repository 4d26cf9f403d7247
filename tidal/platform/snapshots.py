"""What the policy sees of the live cluster: the nodes Tidal may use, and each job as a `JobView`.

Pure builders over what Ray and the store report (the scheduler reads those; nothing here calls
Ray): `cluster` and `cluster_nodes` are every node at its full size (what a job may ever get:
admission and planning); `offered_nodes` is what each node offers Tidal now
(`tidal.platform.capacity.build_nodes`); `job_view` is a job's record as the policy reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tidal.core.correction import corrected
from tidal.core.policy import Allocation, JobView, Node, Option, predicted
from tidal.jobs.spec import JobSpec, Plan
from tidal.planner.jobplan import Cluster
from tidal.platform.capacity import Held, build_nodes, held_by_node, launchable_gpus
from tidal.platform.config import SchedulerConfig
from tidal.platform.reservations import Reservation
from tidal.platform.runs import compute_steps, correction
from tidal.platform.store import JobRecord, JobState


def cluster_nodes(ray_nodes: Iterable[Mapping[str, Any]]) -> list[Node]:
    """Every alive node with GPUs at its full size, by node id."""
    out = []
    for n in ray_nodes:
        res = n.get("Resources", {})
        if n.get("Alive") and res.get("GPU", 0) >= 1:
            out.append(Node(node_id=n["NodeID"], gpus=int(res["GPU"]), cpus=float(res.get("CPU", 0)),
                            memory=float(res.get("memory", 1e18))))
    return sorted(out, key=lambda n: n.node_id)


def cluster(cfg: SchedulerConfig, ray_nodes: list[dict[str, Any]]) -> Cluster:
    """Every alive GPU node at its full size, plus the training nodes Ray's autoscaler may still
    launch (`SchedulerConfig.autoscaling_config`): what admission sizes a job against."""
    more = (launchable_gpus(cfg.autoscaling_config, ray_nodes)
            if cfg.autoscale and cfg.autoscaling_config else [])
    return Cluster(node_gpus=tuple(n.gpus for n in cluster_nodes(ray_nodes)) + tuple(more),
                   gpu_mem_gib=cfg.gpu_mem_gib)


def offered_nodes(ray_nodes: list[dict[str, Any]], available: Mapping[str, Mapping[str, float]],
                  held: Iterable[Sequence[Sequence[Any]] | None], reservations: Iterable[Reservation],
                  loan: Mapping[str, Any], cpus_per_worker: float) -> list[Node]:
    """What each node offers Tidal now: free capacity plus what Tidal holds — `held`, its runs'
    allocations (and for `release_grace_s` those of runs that just ended: Ray frees a finished
    run's placement group a little later), and its profiles' `reservations` — inference nodes
    only what the last loan step lent (`loan`: `Lending.state`). The caller takes the
    reservations off again (`reservations.without`): the policy never offers them."""
    by_node = held_by_node(held, cpus_per_worker)
    for res in reservations:
        for nid in set(res.workers):
            g, c = res.on(nid)
            h = by_node.get(nid, Held())
            by_node[nid] = Held(gpus=h.gpus + g, cpus=h.cpus + c)
    return build_nodes(ray_nodes, available, by_node, loan.get("lent", {}),
                       recall_risk=float(loan.get("risk", 1.0)))


def requested(r: JobRecord, spec: JobSpec) -> Option | None:
    """A guaranteed job's own request as an option: its plan on its requested GPUs, at the
    guarantee (the model's samples/s for exactly that)."""
    if r.guarantee is None or spec.plan is None or spec.requested_gpus is None:
        return None
    return Option(gpus=spec.requested_gpus, plan=spec.plan, samples_per_s=r.guarantee,
                  cpus_per_gpu=r.options[0].cpus_per_gpu if r.options else 0.0)


def predicted_sps(r: JobRecord, spec: JobSpec, a: Allocation) -> float:
    """The model's samples/s for what `a` runs, uncorrected (the correction's denominator): its
    option, or the job's own request (the policy may run a guaranteed job on it)."""
    return predicted(r.options, requested(r, spec), a)


def believed_sps(r: JobRecord, gpus: int) -> float:
    """What the policy expects job `r` to run at on `gpus` GPUs now: its model's samples/s at
    launch (`JobRecord.predicted_sps`, uncorrected) times its correction r(gpus), the measured ÷
    model ratio smoothed over its runs (`tidal.core.correction`). `tidal status` shows this
    beside the measured figure, so that the two agree with the ratios printed under them."""
    return r.predicted_sps * (correction(r).ratio(gpus) if gpus > 0 else 1.0)


def job_view(r: JobRecord, spec: JobSpec, restart_s: float, running_s: float,
             spent: dict[str, tuple[str, int, bool]]) -> JobView:
    """Job `r` as the policy reads it, its predictions corrected by its measured samples/s.
    `running_s`: how long its run has run on its allocation; `spent`: `compute_steps`' memory."""
    current = None
    if r.state is JobState.RUNNING and r.allocation and r.plan:
        current = Allocation(gpus_by_node=tuple((n, int(g)) for n, g in r.allocation),
                             plan=Plan.from_dict(r.plan))
    else:
        running_s = 0.0
    # the work left, in the budget's steps (an AutoLRS job's probes spend it too; a running job's
    # figure is the one `RunTracker.collect` read from its run this tick)
    left = float(max(0, spec.total_steps - compute_steps(r, None, spent)) * spec.global_batch)
    view = JobView(job_id=r.job_id, arrival=r.submitted, options=r.options, guarantee=r.guarantee,
                   requested=requested(r, spec), current=current, restarts=r.restarts,
                   restart_cost_s=restart_s, running_s=running_s, remaining_samples=left,
                   admitted=r.run_id is not None)  # launched at least once
    return corrected(view, correction(r))
