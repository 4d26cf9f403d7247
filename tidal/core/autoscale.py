"""What to ask Ray's node autoscaler for: a pure function of the policy's snapshot and decision.

Ray's `ray.autoscaler.sdk.request_resources(bundles=...)` asks the autoscaler for a cluster
that can hold the given bundles *at once*, on top of nothing (the request replaces the last
one, and it is packed against node totals, not against what is free). So the request is the
whole training demand when jobs wait:

    request = one bundle {GPU: 1, CPU: c} per GPU that the decision allocates (what runs stays)
            + one per GPU of the smallest option of every job that waits (its floor for a
              guaranteed job), c = the option's CPUs per GPU

and nothing (`()`, which withdraws the request) when no job waits and every allocated job's
run has registered itself (below). Idle nodes then scale down by the autoscaler's own idle
timeout. Bundles on lent (inference) GPUs are not asked for: the inference pool is Serve's to
size.

The request has two writers in Ray 2.60: Ray Train V2 registers every run's workers with
Ray's `AutoscalingCoordinator` actor, which merges all its requesters' bundles and resends them
through `request_resources` every 20 s, replacing whatever anyone else asked for. So Tidal
registers there too (`tidal.platform.scheduler`), and leaves out the jobs whose runs Ray Train
already registers (`registered`): their running workers would be asked for twice.

A job just launched is not registered yet: its Train controller registers as it starts, and
its placement group comes after that, seconds later (tens on a loaded machine). Until then
the request keeps holding its GPUs: withdrawn as the last waiting job launches, it leaves the
freshly launched nodes unclaimed, idle past the autoscaler's timeout, and the autoscaler
retires one under the starting run.
"""

from __future__ import annotations

from tidal.core.policy import Decision, Snapshot, guarantee_index, guarded

Bundle = dict[str, float]


def node_request(snapshot: Snapshot, decision: Decision,
                 registered: frozenset[str] = frozenset()) -> tuple[Bundle, ...]:
    """The bundles to request (module docstring); `()` when nothing waits and every allocated
    job is in `registered` (their Ray Train runs ask for their workers themselves, so they add
    nothing for what they hold)."""
    waiting = [j for j in snapshot.jobs if j.job_id not in decision.allocations]
    if not waiting and registered.issuperset(decision.allocations):
        return ()
    lent = {n.node_id for n in snapshot.nodes if n.recallable}
    margin = snapshot.config.guarantee_margin
    by_id = {j.job_id: guarded(j, margin) for j in snapshot.jobs}  # the options `decide` chose from
    out: list[Bundle] = []
    for jid, a in sorted(decision.allocations.items()):
        if jid in registered:
            continue
        opt = next(o for o in by_id[jid].options if o.gpus == a.gpus)
        owned = sum(g for nid, g in a.gpus_by_node if nid not in lent)
        out += [_bundle(opt.cpus_per_gpu)] * owned
    for j in sorted((by_id[j.job_id] for j in waiting), key=lambda j: (j.arrival, j.job_id)):
        i = guarantee_index(j, margin)
        opt = j.options[i if i is not None else 0]
        out += [_bundle(opt.cpus_per_gpu)] * opt.gpus
    return tuple(out)


def _bundle(cpus: float) -> Bundle:
    return {"GPU": 1.0, "CPU": float(cpus)} if cpus > 0 else {"GPU": 1.0}
