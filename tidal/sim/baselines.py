"""Baseline policies, with `decide`'s signature (`Snapshot -> Decision`) so the simulator runs them
through the same controller and placement (`tidal.core.policy.place`) as Tidal's own.

What each one sees is set by its options (`tidal.sim.views`): FIFO, Tiresias and tuned-once get
one option per job (the requested GPUs; the user's plan, or the plan tuned once), elastic gets
every GPU count with the user's plan, Rubick every (GPU count, best plan).

* `fifo`      first come first served, no preemption; the queue's head blocks the rest.
* `las`       Tiresias' discretized least-attained-service: priority by attained GPU-seconds
              (levels at `thresholds`), then arrival; preemptive; a job that does not fit is
              skipped.
* `rubick`    Rubick as its paper describes it (re-implemented from the text): guaranteed jobs
              get their guarantee first; a waiting job is admitted at its smallest option, taking
              GPUs from the running jobs whose throughput falls least per GPU (slope) when its own
              gain is larger; free GPUs then go, one option step at a time, to the job whose
              throughput rises most per GPU; jobs restarted `max_restarts` times keep at least
              what they run (never shrunk for an admission) and may still grow, the rule
              Tidal's policy applies to them. No damping, no aging.
"""

from __future__ import annotations

from tidal.core.policy import Decision, JobView, Snapshot, current_index, guarantee_index, place


def _capacity(snapshot: Snapshot) -> int:
    return sum(n.gpus for n in snapshot.nodes)


def fifo(snapshot: Snapshot) -> Decision:
    jobs = sorted(snapshot.jobs, key=lambda j: (j.arrival, j.job_id))
    choice: dict[str, int | None] = {}
    free = _capacity(snapshot)
    for j in jobs:
        i = current_index(j)
        if i is not None:
            choice[j.job_id] = i
            free -= j.options[i].gpus
    for j in jobs:
        if j.job_id in choice:
            continue
        if j.options[0].gpus > free:
            break  # head-of-line blocking: nobody overtakes the oldest waiting job
        choice[j.job_id] = 0
        free -= j.options[0].gpus
    return place(snapshot, choice, {j.job_id: "waiting in FIFO order" for j in jobs})


def las(snapshot: Snapshot, thresholds: tuple[float, ...] = (3.6e3, 3.6e4)) -> Decision:
    def level(j: JobView) -> int:
        return sum(1 for t in thresholds if j.attained_gpu_s >= t)

    jobs = sorted(snapshot.jobs, key=lambda j: (level(j), j.arrival, j.job_id))
    choice: dict[str, int | None] = {}
    free = _capacity(snapshot)
    for j in jobs:
        if j.options[0].gpus <= free:
            choice[j.job_id] = 0
            free -= j.options[0].gpus
    return place(snapshot, choice, {j.job_id: "lower attained-service priority" for j in jobs})


def _v(j: JobView, i: int | None) -> float:
    return 0.0 if i is None else j.options[i].samples_per_s / j.options[0].samples_per_s


def rubick(snapshot: Snapshot) -> Decision:
    cfg = snapshot.config
    jobs = sorted(snapshot.jobs, key=lambda j: (j.guarantee is None, j.arrival, j.job_id))
    choice: dict[str, int | None] = {j.job_id: current_index(j) for j in jobs}
    # jobs restarted `max_restarts` times are kept: not shrunk, but they grow (frozen whole, such
    # a job held 1 GPU of an idle cluster until it ended: syn-r2-sla0-mix-spread's makespan, seed
    # 0, was 80,805 s frozen and 44,166 s with growth, which had flattered Tidal's ratio 1.87×)
    kept = {j.job_id for j in jobs if choice[j.job_id] is not None and j.restarts >= cfg.max_restarts}
    free = _capacity(snapshot) - sum(j.options[i].gpus for j in jobs if (i := choice[j.job_id]) is not None)

    def floor(j: JobView) -> int:  # a guarantee no option reaches: the largest option
        gi = guarantee_index(j)
        return len(j.options) - 1 if gi is None else gi

    for j in jobs:  # admission, guaranteed jobs first, then arrival order
        if choice[j.job_id] is not None:
            continue
        f = floor(j)
        need = j.options[f].gpus - free
        gain = _v(j, f)
        taken: list[tuple[JobView, int]] = []
        loss = 0.0
        while need > 0:  # shrink the running job that loses least per GPU, one step at a time
            best: tuple[float, JobView, int] | None = None
            for k in jobs:
                i = choice[k.job_id]
                if k is j or i is None or k.job_id in kept or i <= floor(k):
                    continue
                freed = k.options[i].gpus - k.options[i - 1].gpus
                slope = (_v(k, i) - _v(k, i - 1)) / freed
                if best is None or slope < best[0]:
                    best = (slope, k, i)
            if best is None:
                break
            _, k, i = best
            loss += _v(k, i) - _v(k, i - 1)
            need -= k.options[i].gpus - k.options[i - 1].gpus
            taken.append((k, i))
            choice[k.job_id] = i - 1
        if need <= 0 and loss < gain:
            choice[j.job_id] = f
            free = -need
        else:  # not worth it (or impossible): undo
            for k, i in reversed(taken):
                choice[k.job_id] = i
    while True:  # growth: the steepest slope first
        best_up: tuple[float, JobView, int] | None = None
        for k in jobs:
            i = choice[k.job_id]
            if i is None or i + 1 >= len(k.options):
                continue
            for nxt in range(i + 1, len(k.options)):
                extra = k.options[nxt].gpus - k.options[i].gpus
                if extra > free:
                    break
                slope = (_v(k, nxt) - _v(k, i)) / extra
                if slope > 1e-9 and (best_up is None or slope > best_up[0]):
                    best_up = (slope, k, nxt)
        if best_up is None:
            break
        _, k, nxt = best_up
        i = choice[k.job_id]
        assert i is not None
        free -= k.options[nxt].gpus - k.options[i].gpus
        choice[k.job_id] = nxt
    return place(snapshot, choice, {j.job_id: "no GPUs left" for j in jobs})
