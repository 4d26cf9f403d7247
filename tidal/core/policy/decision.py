"""`decide(snapshot) -> Decision`: the co-optimization policy, a pure function.

No Ray, no clock, no randomness, no I/O: the live scheduler and the simulator call the same
function on the same frozen dataclasses (compare Ray Serve's `autoscaling_policy.py` and
AdaptDL's `PolluxPolicy.optimize`). A job offers its resource matrix (`Option`: for each GPU
count it may get, the best plan and its predicted samples/s); the policy maximises the sum of
the jobs' completion rates (`objective`) in Rubick's structure (§4 of the paper):

1. Floors: guaranteed jobs get the smallest option predicted to reach their guarantee, with
   admission control (`counts`).
2. The remaining GPUs, owned and lent, are shared by a multiple-choice knapsack (`counts`,
   `knapsack`).
3. Running jobs with no work left keep their allocation (frozen: the live scheduler sees a job's
   last step before its run ends); running jobs restarted `max_restarts` times keep at least
   their option and may only grow (kept: that is what stops thrashing, and a job alone at the
   end still scales up).
4. Placement on nodes (`placement`).
5. Growth into idle owned GPUs (`grow_into_idle`).

A job the knapsack (which counts GPUs) chose but placement cannot host (its CPUs or memory are
not there, or not on as few nodes as its GPUs need) waits, and the knapsack runs again without
it, so that it holds no GPUs nobody else may use; a running job whose new option cannot be
placed keeps what it runs instead (its own GPUs are placed first when it stays). Every round
settles at least one job, and the decision returned has none left stuck.

A round allocates many short-lived objects; callers that decide often may pause Python's cyclic
garbage collector around it (`tidal.core.gcpause`): the policy itself leaves the interpreter
alone.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping
from dataclasses import replace

from tidal.core.policy.counts import choose_counts
from tidal.core.policy.knapsack import Items, knapsack
from tidal.core.policy.objective import current_index, guarantee_index, guarded
from tidal.core.policy.placement import SPREAD_REASON, fewest_nodes, owned_prefix, place, running_jobs
from tidal.core.policy.types import Decision, JobView, Snapshot


def decide(snapshot: Snapshot) -> Decision:
    """The decision for `snapshot` (this module's docstring)."""
    cfg = snapshot.config
    jobs = sorted(snapshot.jobs, key=lambda j: (j.arrival, j.job_id))
    _check_options(jobs)
    jobs = [guarded(j, cfg.guarantee_margin) for j in jobs]
    snapshot = replace(snapshot, jobs=tuple(jobs))
    rounds = _Rounds(snapshot, jobs)
    d = rounds.run()
    if cfg.grow_into_idle:
        d = grow_into_idle(snapshot, d, rounds.reasons, rounds.running, frozenset(rounds.kept),
                           rounds.capacity)
    return d


def _check_options(jobs: list[JobView]) -> None:
    """Every job's options: non-empty, increasing GPU counts, positive finite samples/s (a
    ValueError naming the job)."""
    inf = math.inf
    for j in jobs:  # one plain loop: generators per job cost ms in a 5,000-job round
        prev, increasing, finite = -inf, bool(j.options), True
        for o in j.options:
            increasing = increasing and o.gpus > prev
            finite = finite and 0.0 < o.samples_per_s < inf  # NaN fails both
            prev = o.gpus
        if not increasing:
            raise ValueError(f"job {j.job_id}: options must be non-empty with increasing GPU counts")
        if not finite:
            raise ValueError(f"job {j.job_id}: option throughputs must be positive and finite, got "
                             f"{[o.samples_per_s for o in j.options]}")


class _Rounds:
    """Phases 1-4, repeated until no chosen job is left unplaced (this module's docstring)."""

    def __init__(self, snapshot: Snapshot, jobs: list[JobView]) -> None:
        cfg = self.cfg = snapshot.config
        self.snapshot, self.jobs = snapshot, jobs
        nodes = snapshot.nodes
        self.capacity = sum(n.gpus for n in nodes if not n.recallable)
        self.lent = lent = sum(n.gpus for n in nodes if n.recallable)
        self.risk = sum(n.gpus * n.recall_risk for n in nodes if n.recallable) / lent if lent else 0.0
        self.running = running = running_jobs(snapshot)
        # frozen: jobs with no work left (a restart would only delay them, and with W = 0 every
        # option looks infinitely good); kept: restarted `max_restarts` times, keep at least
        # what they run (phase 3)
        self.frozen = {j.job_id: current_index(j) for j in running if j.remaining_samples <= 0}
        self.kept = {j.job_id: i for j in running if j.restarts >= cfg.max_restarts
                     and j.job_id not in self.frozen and (i := current_index(j)) is not None}
        self.unplaceable: dict[str, str] = {}  # waits: chosen, but placement cannot host it
        self.stay: dict[str, int] = {}  # running jobs whose new option found no place: keep theirs
        self.running_by_id = {j.job_id: j for j in running}
        # each job's floor (`guarantee_index`: 0 without a guarantee, None where no option
        # reaches it), and the GPUs of the guaranteed jobs' floors
        self.floor_at = {j.job_id: guarantee_index(j, cfg.guarantee_margin) for j in jobs}
        self.floor_gpus = {j.job_id: j.options[gi].gpus for j in jobs
                           if j.guarantee is not None and (gi := self.floor_at[j.job_id]) is not None}
        self.prefix = owned_prefix(nodes)
        # waiting guaranteed floors by GPU count, with the fewest nodes each needs (non-decreasing
        # in the count); built the first time a floor is found stuck
        self.waiting_floors: list[tuple[int, int, str]] | None = None
        # owned GPUs each running job holds (without lent GPUs: all it holds)
        owned_ids = {n.node_id for n in nodes if not n.recallable}
        self.owned_held = {j.job_id: (sum(g for nid, g in j.current.gpus_by_node if nid in owned_ids) if lent
                                      else j.current.gpus) for j in running if j.current is not None}
        # lent GPUs no running job holds: a best-effort job on owned GPUs a guaranteed one needs
        # can move there (`place`), so admission counts them against what running jobs hold
        self.movable = lent - sum(j.current.gpus - self.owned_held[j.job_id] for j in running
                                  if j.current is not None)
        self.reasons: dict[str, str] = {}

    def run(self) -> Decision:
        while True:
            unplaceable, stay = self.unplaceable, self.stay
            new_choice, reasons = choose_counts(
                self.jobs, self.capacity, {**self.frozen, **stay, **dict.fromkeys(unplaceable)},
                self.floor_at, self.cfg, self.snapshot.now, lent=self.lent, risk=self.risk,
                kept={k: v for k, v in self.kept.items() if k not in unplaceable and k not in stay},
                owned_held=self.owned_held, movable=max(0, self.movable))
            self.reasons = reasons = {**reasons, **unplaceable}
            d = place(self.snapshot, new_choice, reasons, running=self.running, pack=True)
            stuck = [jid for jid, i in new_choice.items()
                     if i is not None and jid not in d.allocations and jid not in self.frozen]
            if not stuck:
                return d
            for jid in stuck:
                if (jid in self.running_by_id and jid not in stay
                        and (i := current_index(self.running_by_id[jid])) is not None):
                    stay[jid] = i
                else:  # a running job stuck again where it stays (its GPUs are gone): it waits
                    unplaceable[jid] = d.reasons.get(jid, "waiting: cannot be placed")
            self._drop_stuck_floors([jid for jid in stuck if jid in unplaceable], d)

    def _drop_stuck_floors(self, stuck: list[str], d: Decision) -> None:
        """A guaranteed floor of g GPUs that found no k = fewest_nodes(g) nodes holding it rules
        out, in this decision, every waiting guaranteed floor of at least g GPUs on the same k
        nodes (the guaranteed are placed first, so they meet the same free GPUs): dropped
        together, not one a round (phase 1 admits them one at a time while its GPU count
        allows: hundreds of rounds where the free GPUs are fragmented)."""
        prefix = self.prefix
        for jid in stuck:
            g = self.floor_gpus.get(jid)
            if d.reasons.get(jid, "").startswith(SPREAD_REASON) and g is not None:
                if self.waiting_floors is None:
                    self.waiting_floors = sorted((og, fewest_nodes(prefix, og), oid)
                                                 for oid, og in self.floor_gpus.items()
                                                 if oid not in self.running_by_id)
                k = fewest_nodes(prefix, g)
                at = bisect.bisect_left(self.waiting_floors, (g,))
                for _, ok, oid in itertools.islice(self.waiting_floors, at, None):
                    if ok != k:
                        break
                    self.unplaceable[oid] = d.reasons[jid]


def grow_into_idle(snapshot: Snapshot, d: Decision, reasons: Mapping[str, str], running: list[JobView],
                   kept: frozenset[str], capacity: int) -> Decision:
    """Phase 5: owned GPUs that the decision leaves idle (no waiting job can use them: the
    knapsack gives every GPU a waiting job fits) go to allocated jobs whose growth pays for its
    restart over their *real* remaining work, not the horizon-capped work of the objective:

        grow j from option i to k  iff  saving = W_j/s_j(i) − (R_j + W_j/s_j(k)) > 0

    W_j: remaining samples, R_j: its restart cost (0 when the decision restarts or starts it
    anyway). The growths are chosen by the knapsack over the idle GPUs, maximising the seconds
    saved in all. If a grown job cannot be placed, the decision stays as it was.

    Why: the horizon cap makes long jobs compare by throughput, but with no competitor it hides
    what growth saves (a job shrunk for others runs on alone on a few GPUs of an idle cluster).

    Who may not grow: jobs at half their restart allowance or more (growth undone when others
    arrive costs a restart each way, and thrashes a job into `max_restarts`), unless they have
    run `PolicyConfig.settle_s` on their allocation and a growth and its undoing both fit in the
    allowance (off by default); kept jobs (phase 3: never shrunk again) only while no job waits,
    since the GPUs they take stay with them until they end. Nothing grows while the decision
    uses lent GPUs: the owned GPUs it leaves idle are then fragments beside jobs on lent nodes,
    and the capacity changes as inference lends and recalls, so the next round would undo the
    growth at a restart each way."""
    cfg = snapshot.config
    if d.recall_loss:  # a job holds lent GPUs (`place` reports each one's loss if recalled)
        return d
    owned = {n.node_id for n in snapshot.nodes if not n.recallable}
    idle = capacity - sum(g for a in d.allocations.values() for nid, g in a.gpus_by_node if nid in owned)
    if idle <= 0:
        return d
    by_id = {j.job_id: j for j in snapshot.jobs}
    now_at = {jid: next(i for i, o in enumerate(by_id[jid].options) if o.gpus == a.gpus)
              for jid, a in d.allocations.items()}
    # no job waits: every job of the snapshot is given GPUs (kept jobs may grow only then)
    nobody_waits = len(d.allocations) == len(snapshot.jobs)
    items: Items = []
    for jid, i in now_at.items():
        j = by_id[jid]
        settled = j.restarts + 2 <= cfg.max_restarts and j.current is not None and j.running_s >= cfg.settle_s
        worn = j.restarts >= cfg.max_restarts // 2 and not settled
        # (finishing jobs, `decide`'s frozen ones, have no remaining samples)
        if ((jid in kept and not nobody_waits) or (worn and jid not in kept)
                or not 0 < j.remaining_samples < math.inf):
            continue
        cur = j.options[i]
        restart = 0.0 if j.current is None or jid in d.changed else j.restart_cost_s
        t_cur = j.remaining_samples / cur.samples_per_s
        ups = [(o.gpus - cur.gpus, saving, k) for k, o in enumerate(j.options[i + 1:], start=i + 1)
               if (saving := t_cur - restart - j.remaining_samples / o.samples_per_s) > 0]
        if ups:
            items.append((j, ups))
    # which growths, within the idle GPUs, save the most seconds in all: the same
    # multiple-choice knapsack as phase 2, over savings
    grown = knapsack(items, idle)
    if not grown:
        return d
    new: dict[str, int | None] = {**now_at, **grown}
    out = place(snapshot, new, reasons, running=running, pack=True)
    return out if all(jid in out.allocations for jid in d.allocations) else d
