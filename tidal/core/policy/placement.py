"""Phase 4 of a decision: which GPUs on which nodes each job with an option gets.

Unchanged running jobs keep their GPUs (no restart). The others are placed largest first,
guaranteed jobs before best-effort ones: on one node when one has room (best fit: owned before
lent, then the fewest free GPUs), otherwise over the fewest nodes. Every job takes owned GPUs
before lent ones; guaranteed jobs never take lent GPUs (a guarantee must not depend on capacity
inference can recall). CPUs and host memory per GPU are checked on every node; capacity is never
exceeded.

No job's owned GPUs are placed over more nodes than they need packed (`pack`; lent GPUs,
borrowed where inference leaves them, may add nodes): every option's throughput is predicted
packed, and the same GPUs spread over more nodes run slower (traffic between nodes,
tensor-parallel groups split across them). Where the free GPUs are that fragmented, or CPUs or
memory run out, the job tries fewer GPUs (down to its floor), then waits.

A guaranteed job that finds no room on owned GPUs moves best-effort jobs that keep their
allocation there, newest first, to lent GPUs no job holds (`_Placement.displace`): each moved
job keeps its option and restarts, none stops, all or nothing. Without it, loans let best-effort
jobs start on owned GPUs and then keep the guaranteed ones off them.

For every job holding lent GPUs the decision says what it would lose if they were recalled
(`Decision.recall_loss`), so that capacity lent by inference is taken back knowingly.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidal.core.policy.objective import current_index, guarantee_index
from tidal.core.policy.types import Allocation, Decision, JobView, Node, Option, Snapshot

SPREAD_REASON = "waiting: its GPUs fit only spread over more nodes than they need"
CAPACITY_REASON = "waiting: no node has the CPUs/memory for its GPUs"


@dataclass
class _Free:
    node: Node
    gpus: int
    cpus: float
    memory: float


def _fits(f: _Free, o: Option, g: int) -> bool:
    return f.gpus >= g and f.cpus >= o.cpus_per_gpu * g - 1e-9 and f.memory >= o.memory_per_gpu * g - 1e-9


def _take(f: _Free, o: Option, g: int) -> None:
    f.gpus -= g
    f.cpus -= o.cpus_per_gpu * g
    f.memory -= o.memory_per_gpu * g


def owned_prefix(nodes: Sequence[Node]) -> list[int]:
    """GPUs on the k largest owned nodes, k = 1, 2, ... (`fewest_nodes`)."""
    return list(itertools.accumulate(sorted((n.gpus for n in nodes if not n.recallable), reverse=True)))


def fewest_nodes(prefix: list[int], g: int) -> int:
    """The fewest owned nodes whose whole capacity holds g GPUs: how a request of g GPUs is
    packed (more than there are if none do); `prefix` from `owned_prefix`."""
    return bisect.bisect_left(prefix, g) + 1


class _Pool:
    """Free capacity per node, indexed by (recallable, free GPUs): placing a job looks at a few
    buckets in node order, not at every node (O(GPUs per node) per placement, not O(nodes)).

    `place` is the placement rule: one node if any fits — owned before lent, then the fewest
    free GPUs (best fit), then snapshot order — else the fewest nodes, owned before lent and the
    most free GPUs first; guaranteed jobs never take lent GPUs."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self.free = {n.node_id: _Free(n, n.gpus, n.cpus, n.memory) for n in nodes}
        self.nodes = list(self.free.values())
        self.index = {n.node_id: i for i, n in enumerate(nodes)}
        self.top = max((n.gpus for n in nodes), default=0)
        self.buckets: dict[tuple[bool, int], list[int]] = {}
        self.packed = owned_prefix(nodes)
        for i in range(len(self.nodes)):
            self._add(i)

    def _key(self, i: int) -> tuple[bool, int]:
        f = self.nodes[i]
        return f.node.recallable, f.gpus

    def _add(self, i: int) -> None:
        bisect.insort(self.buckets.setdefault(self._key(i), []), i)

    def take(self, f: _Free, o: Option, g: int) -> None:
        i = self.index[f.node.node_id]
        bucket = self.buckets[self._key(i)]
        bucket.pop(bisect.bisect_left(bucket, i))
        _take(f, o, g)
        self._add(i)

    def give(self, f: _Free, o: Option, g: int) -> None:
        """Return g GPUs (and their CPUs and memory) that `take` took for option `o`."""
        i = self.index[f.node.node_id]
        bucket = self.buckets[self._key(i)]
        bucket.pop(bisect.bisect_left(bucket, i))
        _take(f, o, -g)
        self._add(i)

    def fewest_nodes(self, g: int) -> int:
        return fewest_nodes(self.packed, g)

    def lent_free(self) -> int:
        """Lent GPUs still free (from the buckets: no walk over the nodes)."""
        return sum(k * len(ix) for (rec, k), ix in self.buckets.items() if rec)

    def spread(self, placed: tuple[tuple[str, int], ...]) -> bool:
        """Whether a placement's owned GPUs lie on more owned nodes than they need packed (lent
        GPUs, borrowed where inference leaves them, may add nodes)."""
        own = [g for nid, g in placed if not self.free[nid].node.recallable]
        return len(own) > self.fewest_nodes(sum(own))

    def place(self, job: JobView, o: Option) -> tuple[tuple[str, int], ...] | None:
        """GPUs for option `o` (the class docstring's rule), taken from the pool; None if none."""
        pools = (False,) if job.guarantee is not None else (False, True)
        for rec in pools:  # one node
            for k in range(o.gpus, self.top + 1):
                for i in self.buckets.get((rec, k), ()):
                    f = self.nodes[i]
                    if _fits(f, o, o.gpus):
                        self.take(f, o, o.gpus)
                        return ((f.node.node_id, o.gpus),)
        plan: list[tuple[_Free, int]] = []
        need = o.gpus
        for rec in pools:  # the fewest nodes
            for k in range(self.top, 0, -1):
                for i in self.buckets.get((rec, k), ()):
                    f = self.nodes[i]
                    g = min(need, f.gpus)
                    while g > 0 and not _fits(f, o, g):
                        g -= 1
                    if g > 0:
                        plan.append((f, g))
                        need -= g
                    if need == 0:
                        break
                if need == 0:
                    break
            if need == 0:
                break
        if need:
            return None
        for f, g in plan:
            self.take(f, o, g)
        return tuple(sorted((f.node.node_id, g) for f, g in plan))



def running_jobs(snapshot: Snapshot) -> list[JobView]:
    """Jobs that hold an allocation the snapshot can still honour (all their nodes present)."""
    nodes = {n.node_id for n in snapshot.nodes}
    return [j for j in snapshot.jobs if j.current is not None and current_index(j) is not None
            and all(nid in nodes for nid, _ in j.current.gpus_by_node)]


def place(snapshot: Snapshot, choice: Mapping[str, int | None],
          reasons: Mapping[str, str] | None = None,
          running: list[JobView] | None = None, pack: bool = False) -> Decision:
    """Phase 4, for any choice of option per job (`decide`'s, or a baseline's in `tidal.sim`):
    this module's rule. Jobs absent from `choice` wait; `running`: the jobs whose allocation the
    snapshot can honour (`running_jobs`, if not given); `pack`: refuse spread placements."""
    p = _Placement(snapshot, choice, running, pack)
    reasons = dict(reasons or {})
    pending: list[JobView] = []
    for j in p.jobs:
        i = p.choice[j.job_id]
        if i is None:
            continue
        if p.keep_current(j, i):
            assert j.current is not None
            p.allocations[j.job_id] = j.current
        else:
            pending.append(j)
    pending.sort(key=lambda j: (j.guarantee is None, -j.options[p.choice[j.job_id] or 0].gpus, j.arrival))
    for j in pending:
        if (why := p.place_job(j)) is not None:
            reasons[j.job_id] = why
    for j in p.jobs:
        if j.current is not None and j.job_id not in p.allocations:
            p.changed.append(j.job_id)  # preempted
    recall_loss = p.recall_loss()
    for jid in p.allocations:
        reasons.pop(jid, None)
    return Decision(allocations=p.allocations, reasons=reasons, recall_loss=recall_loss,
                    changed=tuple(sorted(set(p.changed))))


class _Placement:
    """One `place` call's working state: the free capacity (`_Pool`), the allocations made so
    far and the running jobs they change."""

    def __init__(self, snapshot: Snapshot, choice: Mapping[str, int | None],
                 running: list[JobView] | None, pack: bool) -> None:
        self.snapshot = snapshot
        self.jobs = sorted(snapshot.jobs, key=lambda j: (j.arrival, j.job_id))
        self.nodes = {n.node_id: n for n in snapshot.nodes}
        self.by_id = {j.job_id: j for j in self.jobs}
        self.running_ids = {j.job_id for j in (running_jobs(snapshot) if running is None else running)}
        self.choice = {j.job_id: choice.get(j.job_id) for j in self.jobs}
        self.pack = pack
        self.pool = _Pool(snapshot.nodes)
        self.free = self.pool.free
        self.allocations: dict[str, Allocation] = {}
        self.changed: list[str] = []

    def keep_current(self, j: JobView, idx: int) -> bool:
        """If option `idx` is what the running job runs and its GPUs are still free, it keeps
        them (taken from the pool): no restart."""
        o, cur = j.options[idx], j.current
        if (cur is None or j.job_id not in self.running_ids or idx != current_index(j) or cur.plan != o.plan
                or not all(_fits(self.free[nid], o, g) for nid, g in cur.gpus_by_node)):
            return False
        for nid, g in cur.gpus_by_node:
            self.pool.take(self.free[nid], o, g)
        return True

    def place_job(self, j: JobView) -> str | None:
        """Place a job that does not keep what it runs: its chosen option, else fewer GPUs down
        to its floor, else (guaranteed) by moving best-effort jobs (`displace`). None once
        placed, else why it waits."""
        idx = self.choice[j.job_id]
        assert idx is not None
        placed = None
        spread = False
        while idx is not None and placed is None:
            if self.keep_current(j, idx):  # the fallback came back to what the job runs
                assert j.current is not None
                placed = j.current.gpus_by_node
                break
            placed, refused = self.packed(j, j.options[idx])
            spread = spread or refused
            if placed is None:  # CPUs or memory too scarce for this many GPUs: try fewer
                floor = guarantee_index(j, self.snapshot.config.guarantee_margin) or 0
                idx = idx - 1 if idx > floor else None
        if (placed is None or idx is None) and j.guarantee is not None and self.pool.lent_free():
            idx = self.choice[j.job_id]
            assert idx is not None
            placed = self.displace(j, idx)
        if placed is None or idx is None:
            return SPREAD_REASON if spread else CAPACITY_REASON
        alloc = Allocation(gpus_by_node=placed, plan=j.options[idx].plan)
        self.allocations[j.job_id] = alloc
        if j.current is not None and alloc != j.current:
            self.changed.append(j.job_id)
        return None

    def packed(self, j: JobView, o: Option) -> tuple[tuple[tuple[str, int], ...] | None, bool]:
        """`_Pool.place` under the packing rule, and whether that rule refused it: owned GPUs
        over more nodes than they need run slower than predicted."""
        placed = self.pool.place(j, o)
        if placed is not None and self.pack and self.pool.spread(placed):
            for nid, g in placed:
                self.pool.give(self.free[nid], o, g)
            return None, True
        return placed, False

    def _movers(self) -> dict[str, Option]:
        """Best-effort jobs that keep their allocation on owned GPUs and may be moved, newest
        first, each with the option it keeps (`keep_current` matched it to its allocation)."""
        jobs = sorted((b for b in self.jobs if b.job_id in self.allocations and b.guarantee is None
                       and self.allocations[b.job_id] == b.current
                       and b.restarts < self.snapshot.config.max_restarts and b.remaining_samples > 0
                       and any(not self.nodes[nid].recallable
                               for nid, _ in self.allocations[b.job_id].gpus_by_node)),
                      key=lambda b: (-b.arrival, b.job_id))
        return {b.job_id: b.options[self.choice[b.job_id] or 0] for b in jobs}

    def displace(self, g: JobView, idx: int) -> tuple[tuple[str, int], ...] | None:
        """Room on owned GPUs for guaranteed job `g`'s option `idx` made by moving best-effort
        jobs (`_movers`) to other GPUs (the lent ones no job holds, where guaranteed jobs may not
        go): each moved job keeps its option and restarts, none stops. All or nothing: if `g` or
        a moved job finds no place, nothing moves."""
        pool, free = self.pool, self.free
        movers = self._movers()
        moved: list[str] = []
        for jid, o in movers.items():
            for nid, k in self.allocations[jid].gpus_by_node:
                pool.give(free[nid], o, k)
            moved.append(jid)
            placed, _ = self.packed(g, g.options[idx])
            if placed is None:
                continue
            again: list[tuple[str, tuple[tuple[str, int], ...]]] = []
            for m in moved:
                at, _ = self.packed(self.by_id[m], movers[m])
                if at is None:
                    break
                again.append((m, at))
            if len(again) == len(moved):
                for m, at in again:
                    self.allocations[m] = Allocation(gpus_by_node=at, plan=movers[m].plan)
                    self.changed.append(m)
                return placed
            for m, at in again:  # undo: the moved jobs' new GPUs, then g's
                for nid, k in at:
                    pool.give(free[nid], movers[m], k)
            for nid, k in placed:
                pool.give(free[nid], g.options[idx], k)
            break
        for m in reversed(moved):  # nothing moves: every mover takes its GPUs back
            for nid, k in self.allocations[m].gpus_by_node:
                pool.take(free[nid], movers[m], k)
        return None

    def recall_loss(self) -> dict[str, float]:
        """Samples/s each job on lent GPUs would lose if they were recalled: its option now
        minus the largest that fits in its owned GPUs."""
        out: dict[str, float] = {}
        for jid, a in self.allocations.items():
            lent = sum(g for nid, g in a.gpus_by_node if self.nodes[nid].recallable)
            if lent:
                j = self.by_id[jid]
                now = next(o.samples_per_s for o in j.options if o.gpus == a.gpus)
                left = [o for o in j.options if o.gpus <= a.gpus - lent]
                out[jid] = now - (left[-1].samples_per_s if left else 0.0)
        return out
