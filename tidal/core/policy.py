"""The co-optimization policy: `decide(snapshot) -> Decision`, a pure function.

No Ray, no clock, no randomness, no I/O: the live scheduler and the simulator call the same
function on the same frozen dataclasses (compare Ray Serve's `autoscaling_policy.py` and
AdaptDL's `PolluxPolicy.optimize`). Policy state that must survive a restart lives in the
snapshot (current allocations, restart counts), never in this module.

**What a job offers.** The planner's resource matrix: for each GPU count a job may get, the
best plan and its predicted samples/s (`Option`).

**What the policy maximises: completion rates.** Option i of job j is worth

    u_j(i) = a_j / T_j(i) + (w_j − a_j) / T_j(0),   T_j(i) = restart_j(i) + W_j / s_j(i)

s_j(i): predicted samples/s; W_j = min(remaining samples, horizon_s · max_i s_j(i)): the work
left, capped at what the job could do in `horizon_s` at its fastest, so that long jobs (and
jobs of unknown length) compare by throughput (then u ≈ s_j(i)/(horizon · s_j,max), Rubick's
normalised throughput) while a restart is still weighed against at least `horizon_s` of run
time. (Capping at the *smallest* option's rate, as this module first did, counted only a few
seconds of work for jobs whose smallest option is very slow — llama7's ZeRO-Offload on one
GPU runs at 1/40 of its 16-GPU 3D plan — so a 260-s restart never paid and such jobs were
never grown); restart_j(i) = the job's restart cost unless i is what it runs now; w_j = 1 + t/aging_s
for a job that arrived t seconds ago, so nobody starves: a job waiting (or being
preempted again and again) gains weight until it wins. Maximising Σ 1/T_j
finishes short jobs first (SRPT: with one GPU per job it runs the smallest remaining times),
grows jobs while a GPU shortens their time more than it would shorten another's, and prices
every restart into the decision itself: a change must save more than the restart costs.

Age buys a place, not width: a_j = min(w_j, `aging_width_cap`) multiplies the job's options;
the rest of its weight, w_j − a_j, is the value of its smallest option (option 0), added to
every option. An old job outbids younger ones to run at all, but what it gains from more GPUs
weighs no more than for a job of weight a_j. With the whole weight on every option (what this
module did first; `aging_width_cap=inf`) a wide job that had waited hours (weight ~20) had its
growth weighed 20×, against the starts of jobs that had just arrived: on
benchmarks/sim_sweep.py's workload-base-rate2 (seed 0, `flat` truth) Tidal ran its llama30 jobs
on 32 GPUs for 1,194 of their 1,515 GPU-kiloseconds where 24 do as much (the re-implementation
ran them on 24: 1,227 GPU-ks in all), and its makespan was 0.870 of the re-implementation's;
with the cap at 4, 0.992. The cap was chosen by the sweep's worst cases over seeds 0-2 (45
workloads, `flat`, with phase 1's admission order below): JCT / makespan worst case 0.927 /
0.919 at 2, 0.938 / 0.920 at 3, 1.074 / 0.912 at 4, 0.983 / 0.914 at 6, 1.075 / 0.905 at 8,
0.960 / 0.870 uncapped. (a_j = 1, all of the age on option 0, lost a quarter of the worst JCT
case: 0.743.)

**The algorithm** (Rubick's structure, §4 of the paper, with that objective):

1. Floors first. Guaranteed jobs get the smallest option predicted to reach their guarantee
   (the guarantee: the throughput of the requested GPUs with the job's own plan; the planner's
   better plan often needs fewer GPUs). The model vouches for that prediction alone, and it
   errs: an option on fewer GPUs than requested is a floor only if predicted to beat the
   guarantee by `guarantee_margin` (20%), and at the requested count the job's own plan (whose
   throughput *is* the guarantee) replaces the planner's best one unless that is predicted to
   beat it by as much (`guarded`). On benchmarks/sim_sweep.py's 15 workloads, margin 0 left the
   guarantee violation above the Rubick re-implementation's on 3 (all of it over-predicted
   floors); 0.05 on 1; 0.1 on none (workload-base-sla50: 54,821 → 23,847 s against Rubick's
   59,031), at a price in JCT where half the jobs are guaranteed (0.882 → 0.700 of Rubick's
   there: guaranteed jobs hold the GPUs they asked for). Later, with admission by value per GPU
   and guaranteed jobs keeping their admission, 0.2 was no worse than 0.1 on any figure of the
   sweep over seeds 0-2 (45 workloads, `flat`): worst JCT case 0.931 → 1.066, violation not
   worse on 44 → 45 (syn-r0.5-sla50-large-spread@1: 54,813 → 4,109 s against 52,747), JCT and
   makespan geomeans 1.351 / 1.051 → 1.355 / 1.052, worst makespan case 0.913 both: a floor
   over-predicted by 10-20% ran below its guarantee and, where it held a wide job's GPUs,
   delayed the rest. Admission
   control: running guaranteed jobs keep theirs before any waiting one is admitted (a job that
   arrived earlier but waited never pushes out one admitted since), and so do those admitted
   before that wait for a relaunch (`JobView.admitted`: the controller stops a job whose GPUs
   change and decides again; as a newcomer in the admission order below, a guaranteed job
   stopped to grow lost its place to smaller ones, and stayed stopped: on
   benchmarks/sim_sweep.py's workload-base-sla50, seed 0, four jobs for 2,940 s), then waiting
   ones, by the objective's value per GPU of their floors (`_admission_order`: Smith's rule; it was arrival
   order, and a wide guaranteed job took the GPUs dozens of small ones waited for), while owned
   GPUs remain that neither floors nor running best-effort jobs hold (their smallest options:
   admission shrinks running jobs and never stops one, as in Rubick); a guaranteed job that
   cannot get its floor waits rather than run below its guarantee.
   Letting admission preempt every best-effort job (`admission_preempts="any"`), as this module
   first did, starved wide best-effort jobs where half the jobs are guaranteed: on
   workload-base-sla50 (benchmarks/sim_sweep.py, seed 0) best-effort llama30 jobs (24+ GPUs)
   waited ~30,000 s, started and were preempted by each guaranteed arrival, and Tidal's average
   JCT was 0.645 of the Rubick re-implementation's; sparing the best-effort jobs that arrived
   before the guaranteed one (`"later"`) gave 0.771; sparing all of them, 0.944 (seeds 0-2:
   worst JCT case 0.771 → 0.944, makespan geomean 1.025 → 1.013: where arrivals are dense a
   wide guaranteed job now waits for running best-effort jobs to end or shrink).
2. The remaining GPUs are shared to maximise Σ u: each best-effort job takes one of its
   options or waits, each admitted guaranteed job may grow above its floor. That is a
   multiple-choice knapsack, solved exactly by dynamic programming over GPU counts (numpy,
   O(jobs · options · GPUs)). Rubick moves GPUs greedily, one step at a time, from the job
   whose throughput falls least to the one that gains most; on small seeded instances such a
   greedy fell to 86% of the exhaustive optimum when one job scales almost linearly and the
   best move is a jump of several GPUs; the DP equals the exhaustive optimum
   (tests/core/test_policy.py). Past `DP_CELLS` (jobs × GPUs; 5,000 jobs on 8,192 GPUs is 41 M)
   or `DP_ITEMS` jobs the knapsack is solved by the LP greedy on each job's convex hull instead,
   within one item of the optimum, in O(n log n).
3. Running jobs with no work left (the live scheduler sees a job's last step before its run
   ends) keep their allocation. Running jobs restarted `max_restarts` times keep at least
   their option (a floor, served in phase 1 like a guarantee) and may only grow: freezing
   them outright left a job shrunk to 1 GPU there when it was alone at the end (579,000-s
   makespan on one workload of the family, `benchmarks/sim_sweep.py`).
4. Placement on nodes: unchanged jobs keep their GPUs; the others are placed largest first, on
   one node when one has room (best fit), otherwise over the fewest nodes; every job takes owned
   GPUs before lent ones, and guaranteed jobs never take lent GPUs (their guarantee must not
   depend on capacity inference can recall). A guaranteed job that finds no room on owned GPUs
   moves best-effort jobs that keep their allocation there, newest first, to other GPUs (the
   lent ones no job holds), each keeping its option: a restart, never a stop, all or nothing;
   and admission (phase 1) counts those free lent GPUs against what running best-effort jobs
   hold. Without it, loans let best-effort jobs start on owned GPUs and then kept the guaranteed
   ones off them: on `benchmarks/loan_compare.py --family`'s syn-r0.5-sla50-large-spread the
   loans' JCT speedup was 0.698 (every guaranteed application's JCTs 1.4-7× longer); with it
   1.092, and the family's geomean / worst 0.994 / 0.698 → 1.021 / 0.897 at the envelope's phase
   0; at phase 0.5 it costs the geomean 2% (1.055 → 1.034, worst 0.973 both); with phase 5's
   rule for lent GPUs (below) at phase 0.25, 1% (1.075 / 0.995 → 1.064 / 0.971). It is kept for
   the worst case: 0.90 against 0.72 over the three phases. CPUs and host memory per GPU are
   checked on every node; capacity is never exceeded. No job's owned GPUs are placed over more
   nodes than they need packed (lent GPUs, borrowed where inference leaves them, may add nodes):
   every option's throughput is predicted packed, and the same GPUs spread over more nodes run
   slower (more traffic between nodes; tensor-parallel groups split across nodes). Where the
   free GPUs are that fragmented the job tries fewer GPUs (down to its floor), then waits and
   the knapsack runs again without it. For guaranteed jobs this rule came first: spread
   placements had been most of the sweep's guarantee violation (workload-base-sla50: 32,180 of
   82,162 s). For best-effort jobs it came later: the simulator showed Tidal's llama30 jobs on
   spread placements for 1,769 of their 1,959 GPU-kiloseconds (workload-base-rate2, linear
   truth; the Rubick re-implementation 13 of 1,509), at a fraction of the packed speed.
5. Growth into idle GPUs (`grow_into_idle`): owned GPUs the decision leaves idle go to running
   jobs whose growth pays its restart over their real remaining work (the objective's
   horizon cap hides that when nobody competes for them; a job past half its restart
   allowance not at all by default, or after `settle_s` on its allocation; a kept job, which
   can never give GPUs back, only while no job waits); not while the decision uses lent
   GPUs (capacity that comes and goes: the next round undoes the growth; `grow_into_idle`).

**Lent GPUs** (inference GPUs Serve does not need now: `Node.recallable`) are worth less than
owned ones by their expected recall cost. Guarantees (phase 1) count owned GPUs only. The
knapsack runs over owned + lent GPUs and then picks the total c it uses by

    c* = argmax_c  best(c) − price · max(0, c − C_owned)
    price = risk · (best(C_owned) / C_owned) · restart / (restart + horizon)

best(c): the knapsack's optimum within c GPUs; risk: the chance a lent GPU is recalled within
the horizon (`Node.recall_risk`, from the loan manager's forecast; the GPU-weighted mean over
lent nodes); best(C_owned)/C_owned: the utility an owned GPU earns on average; the last factor:
the share of a horizon's work a recall's restart (the jobs' mean restart cost) throws away.
Since all lent GPUs are alike to the knapsack, this is exact for "Σ u − price · lent GPUs used".

On the Rubick traces (benchmarks/sim_compare.py, workload-base) this objective took the
average JCT from 3,152 s to 1,934 s and the makespan from 58,657 s to 57,743 s against
maximising Σ v with a separate horizon-based damping step, which is what this module did first.
With the planner's later 3D model (data-parallel groups on NIC rails) the smallest-option cap
left llama7 jobs on 4 GPUs for hours (makespan 70,768 s); the fastest-option cap gives avg JCT
1,714 s, makespan 59,765 s. Counting the restart only for the horizon's share of a long run
(so long jobs chase small gains) made both worse: 2,214 s / 65,746 s.

For every job holding recallable GPUs the decision says what it would lose if they were
recalled (`recall_loss`): the capacity lent by inference can be taken back knowingly.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

from tidal.jobs.spec import Plan

Pool = Literal["training", "inference"]

@dataclass(frozen=True, kw_only=True)
class Node:
    """Capacity Tidal may use on one node now (free, plus what Tidal's jobs hold there)."""

    node_id: str
    gpus: int
    cpus: float = 1e9
    memory: float = 1e18
    pool: Pool = "training"
    recallable: bool = False  # GPUs lent by inference: may be recalled
    recall_risk: float = 1.0  # chance (0-1) a lent GPU is recalled within the horizon


@dataclass(frozen=True, kw_only=True)
class Option:
    """One row of a job's resource matrix."""

    gpus: int
    plan: Plan
    samples_per_s: float
    cpus_per_gpu: float = 0.0
    memory_per_gpu: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "plan": self.plan.to_dict(), "samples_per_s": self.samples_per_s,
                "cpus_per_gpu": self.cpus_per_gpu, "memory_per_gpu": self.memory_per_gpu}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Option:
        return cls(**{**d, "plan": Plan.from_dict(d["plan"])})


@dataclass(frozen=True, kw_only=True)
class Allocation:
    gpus_by_node: tuple[tuple[str, int], ...]
    plan: Plan

    @cached_property
    def gpus(self) -> int:
        return sum(g for _, g in self.gpus_by_node)


@dataclass(frozen=True, kw_only=True)
class JobView:
    job_id: str
    arrival: float
    options: tuple[Option, ...]  # ascending GPU counts, one per count
    guarantee: float | None = None  # samples/s the job must get when it runs
    # what a guaranteed job asked for: its own plan on its requested GPUs, at the guarantee's
    # samples/s (the guarantee *is* this option's throughput; the floor falls back on it)
    requested: Option | None = None
    current: Allocation | None = None
    restarts: int = 0
    restart_cost_s: float = 30.0
    running_s: float = 0.0  # seconds it has run on its current allocation (since its last launch)
    remaining_samples: float = float("inf")
    attained_gpu_s: float = 0.0  # GPU-seconds held so far (least-attained-service baselines)
    # the job has run since it was submitted. A guaranteed job admitted once keeps its place
    # while it waits again, e.g. between the stop and the relaunch of a change of GPUs or plan
    # (`tidal.core.controller` decides again once the stop is done): phase 1 readmits it with
    # the running ones, before any waiting job
    admitted: bool = False


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    horizon_s: float = 600.0  # work beyond this many seconds (at the fastest option) is not counted
    max_restarts: int = 20
    # a job this old (since arrival) counts double; 300 s: the best worst JCT case over the
    # sweep's family (benchmarks/sim_sweep.py, seeds 0-2, `flat`: 0.972 against 0.867 at 1,200 s,
    # 0.862 at 600 s, with the online correction's ratio per GPU count; 1,200 s had been the best
    # with one ratio a job)
    aging_s: float = 300.0
    # an option with fewer GPUs than a guaranteed job requested is its floor only if predicted
    # to reach guarantee · (1 + this): the model errs, and the guarantee is measured against the
    # truth (0.1 was the smallest margin that kept every workload of benchmarks/sim_sweep.py, seed
    # 0, within the Rubick re-implementation's violation; 0.2 the best worst case over seeds 0-2:
    # module docstring)
    guarantee_margin: float = 0.2
    # phase 5 (module docstring): owned GPUs no job was given go to running jobs whose growth
    # pays its restart over their real remaining work
    grow_into_idle: bool = True
    # phase 1 (module docstring): which running best-effort jobs a waiting guaranteed job's
    # admission may stop. "none" (Rubick's rule): it is admitted only into owned GPUs that neither
    # floors nor running best-effort jobs hold (their smallest options); it may shrink them, never
    # stop them. "later": it may stop those that arrived after it. "any": every one (what this
    # module did first). benchmarks/sim_sweep.py prints all three
    admission_preempts: Literal["none", "later", "any"] = "none"
    # the aging weight that also multiplies what a job gains from more GPUs; weight above it
    # counts for the job's smallest option only (age buys a place, not width: module docstring).
    # 4 (900 s of waiting at aging_s = 300): the best worst case over the sweep's family
    # (benchmarks/sim_sweep.py, seeds 0-2, `flat`); inf is the weight on every option
    aging_width_cap: float = 4.0
    # phase 5 (`grow_into_idle`): a job past half its restart allowance may grow into idle GPUs
    # once it has run this long on its allocation, if a growth and a shrink both still fit in
    # the allowance; inf: never. benchmarks/sim_sweep.py's family, seeds 0-2, `flat`, JCT /
    # makespan geomean and worst: against the Rubick re-implementation that froze its worn-out
    # jobs, 1.355 / 1.066, 1.052 / 0.913 at inf; 1.354 / 1.039, 1.052 / 0.931 at 1,200 s; 1.350 /
    # 1.066, 1.055 / 0.931 at 2,400 s (the default then). Against the one that grows them
    # (2026-11-29): 1.363 / 0.993, 1.025 / 0.890 at inf; 1.360 / 0.912, 1.029 / 0.890 at 2,400 s
    settle_s: float = math.inf

    def __post_init__(self) -> None:
        """Bad settings fail here, in one line, before any decision is made with them."""
        for name in ("horizon_s", "aging_s"):
            if not (v := getattr(self, name)) > 0 or not math.isfinite(v):
                raise ValueError(f"PolicyConfig.{name} must be a positive number of seconds, got {v!r}")
        if not (isinstance(self.max_restarts, int) and self.max_restarts >= 0):
            raise ValueError(f"PolicyConfig.max_restarts must be an integer >= 0, got {self.max_restarts!r}")
        if not (0.0 <= self.guarantee_margin < math.inf):
            raise ValueError(f"PolicyConfig.guarantee_margin must be >= 0, got {self.guarantee_margin!r}")
        if not self.aging_width_cap >= 1.0:  # NaN fails too
            raise ValueError("PolicyConfig.aging_width_cap must be >= 1 (inf: no cap), "
                             f"got {self.aging_width_cap!r}")
        if not (0.0 <= self.settle_s <= math.inf):  # NaN fails too
            raise ValueError(f"PolicyConfig.settle_s must be >= 0 seconds (inf: never), "
                             f"got {self.settle_s!r}")
        if self.admission_preempts not in ("none", "later", "any"):
            raise ValueError("PolicyConfig.admission_preempts must be 'none', 'later' or 'any', "
                             f"got {self.admission_preempts!r}")


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    now: float = 0.0
    nodes: tuple[Node, ...]
    jobs: tuple[JobView, ...]
    config: PolicyConfig = field(default_factory=PolicyConfig)


@dataclass(frozen=True, kw_only=True)
class Decision:
    allocations: Mapping[str, Allocation]  # job → allocation; a job absent here waits
    reasons: Mapping[str, str]
    recall_loss: Mapping[str, float]  # job → samples/s lost if its recallable GPUs are recalled
    changed: tuple[str, ...]  # running jobs whose allocation or plan changes (restarts)


# -- counts -------------------------------------------------------------------------------


def utility(job: JobView, idx: int | None, now: float, cfg: PolicyConfig) -> float:
    """u_j(i) = w_j / (restart_j(i) + W_j / s_j(i)) (module docstring); 0 for waiting."""
    return 0.0 if idx is None else utilities(job, now, cfg)[idx]


def utilities(job: JobView, now: float, cfg: PolicyConfig) -> list[float]:
    """`utility` of every option of the job at once (`flat_utilities` of this one job)."""
    return [float(u) for u in flat_utilities((job,), now, cfg)[1]]


def guarantee_index(job: JobView, margin: float = 0.0) -> int | None:
    """A guaranteed job's floor: the smallest option predicted to reach its guarantee, where an
    option on fewer GPUs than it requested must reach guarantee · (1 + `margin`) (those are the
    ones the model alone vouches for; `guarded` puts the request itself at its GPU count);
    0 without a guarantee; None if no option reaches it."""
    if job.guarantee is None:
        return 0
    req = job.requested.gpus if job.requested is not None else 0
    for i, o in enumerate(job.options):
        if o.samples_per_s >= job.guarantee * ((1.0 + margin) if o.gpus < req else 1.0) * (1 - 1e-12):
            return i
    return None


def guarded(job: JobView, margin: float) -> JobView:
    """The job with its own request as the option at its requested GPU count wherever the
    planner's best plan there is not predicted to beat it by `margin`: a floor the model may
    have over-predicted is replaced by the one configuration whose throughput is the guarantee
    by definition. Jobs without a request are returned as they are."""
    r = job.requested
    if job.guarantee is None or r is None:
        return job
    at = next((i for i, o in enumerate(job.options) if o.gpus == r.gpus), None)
    if at is not None and job.options[at].samples_per_s >= job.guarantee * (1.0 + margin):
        return job
    if at is not None:
        options = (*job.options[:at], r, *job.options[at + 1:])
    else:
        options = tuple(sorted((*job.options, r), key=lambda o: o.gpus))
    return replace(job, options=options)


def predicted(options: Sequence[Option], requested: Option | None, alloc: Allocation) -> float:
    """The predicted samples/s of what `alloc` runs: the job's option with its GPUs and plan, or
    its own request (`guarded` may put it in the option's place); 0 if neither."""
    for o in (*options, *((requested,) if requested is not None else ())):
        if o.gpus == alloc.gpus and o.plan == alloc.plan:
            return o.samples_per_s
    return 0.0


def current_index(job: JobView) -> int | None:
    """The option the job runs now (by GPU count), None if it waits."""
    if job.current is None:
        return None
    for i, o in enumerate(job.options):
        if o.gpus == job.current.gpus:
            return i
    return None


def _choose_counts(jobs: list[JobView], capacity: int, fixed: Mapping[str, int | None],
                   floor_at: Mapping[str, int | None], cfg: PolicyConfig, now: float,
                   lent: int = 0, risk: float = 1.0,
                   kept: Mapping[str, int] | None = None,
                   owned_held: Mapping[str, int] | None = None, movable: int = 0
                   ) -> tuple[dict[str, int | None], dict[str, str]]:
    """Phases 1-2: an option index per job (None = waits) within `capacity` owned GPUs plus
    `lent` recallable ones (priced by `risk`, module docstring). `jobs` come in arrival order;
    `floor_at`: each job's `guarantee_index` (`_decide` computes them once for all its rounds);
    `fixed` jobs take exactly their index; `kept` jobs at least theirs (they may grow).
    `owned_held`: owned GPUs each running job holds now (admission control: a waiting guaranteed
    job does not take those of running best-effort jobs, under `admission_preempts="later"` of
    the earlier ones only; a job absent from it holds none). `movable`: lent GPUs no job holds,
    to which placement may move a best-effort job off the owned GPUs a guaranteed one needs
    (`place`): that many of the held GPUs do not bar admission."""
    kept = kept or {}
    by_id = {j.job_id: j for j in jobs}
    choice: dict[str, int | None] = {j.job_id: None for j in jobs}
    reasons: dict[str, str] = {}
    free = capacity  # owned GPUs left (negative: floors and kept jobs exceed them)
    held_lent = 0  # lent GPUs that fixed and kept jobs go on holding where they run

    def split(jid: str, idx: int) -> tuple[int, int]:
        """(owned, lent) GPUs a job fixed or kept at option `idx` takes: where it stays on the
        GPUs it runs on, their owned and lent parts; otherwise all of them from the owned ones.
        Counting its lent GPUs as owned, as this did first, kept guaranteed jobs waiting beside
        idle owned GPUs: on `benchmarks/loan_compare.py --family`'s workload-base-sla50, 35
        waited ("needs 2 GPUs, 1 free") with 10 owned GPUs idle while best-effort jobs kept at
        `max_restarts` sat on 10 lent ones, and the loans' JCT speedup there was 0.827 (0.916 after)."""
        g, cur = by_id[jid].options[idx].gpus, by_id[jid].current
        held = owned_held.get(jid) if owned_held else None
        return (g, 0) if held is None or cur is None or g != cur.gpus else (held, g - held)

    for jid, idx in fixed.items():
        choice[jid] = idx
        if idx is not None:
            on_owned, on_lent = split(jid, idx)
            free, held_lent = free - on_owned, held_lent + on_lent
    # floors first: jobs past admission keep theirs (running ones, and guaranteed ones admitted
    # before that wait again, `JobView.admitted`: stopped for a change of GPUs or requeued after
    # a failure; a guaranteed job admitted once is never pushed out by one that arrived earlier
    # but waited), then waiting guaranteed jobs by the objective's value per GPU of their floor,
    # highest first (`_admission_order`)
    admitted = {j.job_id for j in jobs if j.current is not None or (j.admitted and j.guarantee is not None)}
    rank = _admission_order([(j, gi) for j in jobs if j.guarantee is not None and j.job_id not in admitted
                             and j.job_id not in fixed and j.job_id not in kept
                             and (gi := floor_at[j.job_id]) is not None], cfg, now)
    # (not a floor-holder, waits, admission rank: the rest after the ranked ones, arrival, id)
    order = sorted((j for j in jobs if j.job_id not in fixed),
                   key=lambda j: (j.guarantee is None and j.job_id not in kept, j.job_id not in admitted,
                                  j.job_id not in rank, rank.get(j.job_id, 0), j.arrival, j.job_id))
    # owned GPUs running best-effort jobs hold that admission may not take (their smallest
    # options), by arrival: under "later" a waiting guaranteed job leaves those of earlier
    # arrivals alone, under "none" all of them
    held_at: list[float] = []
    held_sum: list[int] = [0]
    if cfg.admission_preempts != "any" and owned_held:
        for j in jobs:  # in arrival order (`decide` sorts them)
            own = owned_held.get(j.job_id)
            if own is None or j.guarantee is not None or j.job_id in fixed or j.job_id in kept:
                continue
            held_at.append(j.arrival)
            held_sum.append(held_sum[-1] + min(j.options[0].gpus, own))
    floor: dict[str, int] = {}
    for j in order:  # phase 1: floors
        if j.guarantee is None and j.job_id not in kept:
            break  # `order` puts the best-effort jobs that are not kept last: no floor among them
        gi = floor_at[j.job_id]
        if j.job_id in kept:  # worn out by restarts: keeps what it runs (and its guarantee)
            f = max(kept[j.job_id], gi or 0)
            choice[j.job_id], floor[j.job_id] = f, f
            on_owned, on_lent = split(j.job_id, f)
            free, held_lent = free - on_owned, held_lent + on_lent
            continue
        if gi is None:
            reasons[j.job_id] = "no option reaches its guarantee"
            continue
        need = j.options[gi].gpus
        # a waiting job is admitted around the running best-effort jobs' GPUs (module docstring):
        # all of them, or under "later" those that arrived before it
        spared = j.arrival if cfg.admission_preempts == "later" else math.inf
        held = (max(0, held_sum[bisect.bisect_left(held_at, spared)] - movable)
                if j.job_id not in admitted else 0)
        if need <= free - held:
            choice[j.job_id], floor[j.job_id] = gi, gi
            free -= need
        elif held:
            reasons[j.job_id] = (f"waiting: its guarantee needs {need} GPUs, {free} free, {held} of them "
                                 "held by running best-effort jobs" + (
                                     "" if cfg.admission_preempts == "none" else " that arrived before it"))
        else:
            reasons[j.job_id] = f"waiting: its guarantee needs {need} GPUs, {free} free"
    # phase 2: the multiple-choice knapsack over the free GPUs: best-effort jobs take any option
    # or wait, guaranteed (admitted) and kept ones upgrades above their floors
    owned = max(0, free)
    lent_left = max(0, lent - held_lent + min(0, free))
    restart = sum(j.restart_cost_s for j in jobs) / max(1, len(jobs))
    choice.update(_phase2([j for j in order if j.job_id in floor or j.guarantee is None], floor,
                          owned + lent_left, owned, risk * restart / (restart + cfg.horizon_s), now, cfg))
    for j in order:
        if choice[j.job_id] is None and j.job_id not in reasons:
            reasons[j.job_id] = f"waiting: needs {j.options[0].gpus} GPUs, others use them better"
    return choice, reasons


def _admission_order(waiting: list[tuple[JobView, int]], cfg: PolicyConfig, now: float) -> dict[str, int]:
    """The order in which phase 1 admits waiting guaranteed jobs: by u_j(f_j) / g_j(f_j), the
    objective's value per GPU of the job's floor f_j, highest first (Smith's rule, the order in
    which the knapsack would rank them; ties by arrival). Not by arrival: on
    benchmarks/sim_sweep.py's workload-base-sla50 a guaranteed llama30 job that had waited since
    22,895 s took 48 of the 64 GPUs for 8,000 s the moment they were free, while ~30 guaranteed
    jobs of 1-16 GPUs that arrived later waited behind it. Aging keeps the wide ones from
    starving: their weight grows without bound against the jobs that keep arriving. `waiting`:
    the waiting jobs with their floors f_j; a job with none (no option reaches its guarantee) is
    absent, ranks last, and phase 1 gives it none anyway."""
    import numpy as np

    if not waiting:
        return {}
    _, u, starts = flat_utilities([j for j, _ in waiting], now, cfg)
    n = len(waiting)
    at = starts + np.fromiter((gi for _, gi in waiting), dtype=np.int64, count=n)
    density = u[at] / np.fromiter((j.options[gi].gpus for j, gi in waiting), dtype=np.float64, count=n)
    ranked = sorted(range(n), key=lambda k: (-float(density[k]), waiting[k][0].arrival, waiting[k][0].job_id))
    return {waiting[k][0].job_id: r for r, k in enumerate(ranked)}


def _rows(lens: Any) -> tuple[Any, Any, Any]:
    """For items of `lens` choices each, flattened in (item, choice) order: each row's item,
    each row's position within its item, and where each item's rows start."""
    import numpy as np

    starts = np.cumsum(lens) - lens
    item = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    return item, np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(starts, lens), starts


def flat_utilities(jobs: Sequence[JobView], now: float, cfg: PolicyConfig) -> tuple[Any, Any, Any]:
    """u_j(i) (module docstring) of every option of `jobs` at once, with numpy: the options'
    GPUs and utilities flattened in (job, option) order, and where each job's options start.

        W_j = max(min(remaining samples, horizon_s · max_i s_j(i)), 0)
        v_j(i) = 1 / max(restart_j + W_j / s_j(i), 1e-6)   (restart_j = 0 for the option the
                                                            job runs now, under its plan)
        w_j = 1 + max(0, now − arrival_j) / aging_s,   a_j = min(w_j, aging_width_cap)
        u_j(i) = a_j · v_j(i) + (w_j − a_j) · v_j(0)"""
    import numpy as np

    n = len(jobs)
    lens = np.fromiter((len(j.options) for j in jobs), dtype=np.int64, count=n)
    starts = np.cumsum(lens) - lens
    opts = [o for j in jobs for o in j.options]
    gpus = np.fromiter((o.gpus for o in opts), dtype=np.int64, count=len(opts))
    sps = np.fromiter((o.samples_per_s for o in opts), dtype=np.float64, count=len(opts))
    if not len(opts):
        return gpus, sps, starts
    peak = np.maximum.reduceat(sps, starts)  # every job has options (`decide` checks)
    remaining = np.fromiter((j.remaining_samples for j in jobs), dtype=np.float64, count=n)
    work = np.maximum(np.minimum(remaining, cfg.horizon_s * peak), 0.0)
    arrival = np.fromiter((j.arrival for j in jobs), dtype=np.float64, count=n)
    weight = 1.0 + np.maximum(0.0, now - arrival) / cfg.aging_s
    restart = np.fromiter((j.restart_cost_s for j in jobs), dtype=np.float64, count=n)
    t = np.repeat(restart, lens) + np.repeat(work, lens) / sps
    v = 1.0 / np.where(t > 1e-6, t, 1e-6)
    for k, j in enumerate(jobs):  # the option a job runs now, under its plan: no restart
        cur = j.current
        if cur is not None and (i := current_index(j)) is not None and j.options[i].plan == cur.plan:
            at = int(starts[k]) + i
            v[at] = 1.0 / max(work[k] / sps[at], 1e-6)
    width = np.minimum(weight, cfg.aging_width_cap)  # a_j; the rest of w_j buys a place
    u = np.repeat(width, lens) * v + np.repeat((weight - width) * v[starts], lens)
    return gpus, u, starts


def _phase2(cand: list[JobView], floor: Mapping[str, int], capacity: int, owned: int,
            lent_price_factor: float, now: float, cfg: PolicyConfig) -> dict[str, int]:
    """Phase 2's knapsack (`_knapsack`) over `cand` in order: a job with a floor chooses among
    the options above it, as upgrades (GPUs and utility over the floor's), any other among all
    its options. Built from `flat_utilities` as arrays, which the greedy takes as they are."""
    import numpy as np

    if not cand:
        return {}
    gpus, u, starts = flat_utilities(cand, now, cfg)
    lens = np.diff(np.append(starts, len(gpus)))
    f = np.fromiter((floor.get(j.job_id, -1) for j in cand), dtype=np.int64, count=len(cand))
    at = starts + np.maximum(f, 0)  # the floor's option (any option for jobs with none)
    base_g = np.where(f >= 0, gpus[at], 0)
    base_u = np.where(f >= 0, u[at], 0.0)
    k_, i_, _ = _rows(lens)
    keep = i_ > np.repeat(f, lens)
    k_, i_ = k_[keep], i_[keep]
    w_ = (gpus - np.repeat(base_g, lens))[keep]
    v_ = (u - np.repeat(base_u, lens))[keep]
    if _exact(len(cand), capacity):
        bounds = np.searchsorted(k_, np.arange(len(cand) + 1))
        ws, vs, is_ = w_.tolist(), v_.tolist(), i_.tolist()
        items = [(j, list(zip(ws[lo:hi], vs[lo:hi], is_[lo:hi], strict=True)))
                 for j, lo, hi in zip(cand, bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]
        return _knapsack_dp(items, capacity, owned, lent_price_factor)
    level = _greedy_flat(k_, i_, w_, v_, capacity, owned, lent_price_factor)
    return {cand[k].job_id: i for k, i in level.items()}


# Above this many DP cells (items × (capacity + 1)) the knapsack is solved by the greedy on
# convex hulls instead (5,000 jobs on 8,192 GPUs: 41 M cells, ~110 ms of numpy alone); also
# above this many items, whatever the capacity: the DP's numpy calls cost ~6 µs an item even
# on few GPUs (3,033 items on 16 GPUs: 18 ms, in policy_latency.py --fragmented's round), and
# the greedy's gap, at most one item's value, is then a small share of the total.
DP_CELLS = 4_000_000
DP_ITEMS = 1_000

Items = list[tuple[JobView, list[tuple[int, float, int]]]]


def _exact(items: int, capacity: int) -> bool:
    """Whether the knapsack over `items` items and `capacity` GPUs is solved by the DP."""
    return items * (capacity + 1) <= DP_CELLS and items <= DP_ITEMS


def _knapsack(items: Items, capacity: int, owned: int | None = None,
              lent_price_factor: float = 0.0) -> dict[str, int]:
    """The multiple-choice knapsack: exact (`_knapsack_dp`) up to `DP_CELLS` and `DP_ITEMS`, else greedy
    (`_knapsack_greedy`, within one item's value of the optimum)."""
    if _exact(len(items), capacity):
        return _knapsack_dp(items, capacity, owned, lent_price_factor)
    return _knapsack_greedy(items, capacity, owned, lent_price_factor)


def _upper_hull(choices: list[tuple[int, float, int]],
                capacity: int) -> tuple[list[int], list[float], list[int]]:
    """The upper concave hull in (GPUs, value) of (0, 0) and an item's choices that fit within
    `capacity`, walked in plain Python: its points' GPUs, values and choice positions (-1 for the
    origin). A point on or under the chord of its neighbours is dropped."""
    hw, hu, hc = [0], [0.0], [-1]  # the hull so far: GPUs, value, choice
    # choices come in ascending GPU counts (options are; upgrades keep their order)
    for ci, (w, u, _) in enumerate(choices):
        if u <= hu[-1] or w <= hw[-1] or w > capacity:
            continue  # more GPUs for no more value (or none to take)
        # pop the last hull point while it lies under the chord from the one before it
        while len(hw) >= 2 and (hu[-1] - hu[-2]) * (w - hw[-2]) <= (u - hu[-2]) * (hw[-1] - hw[-2]):
            hw.pop()
            hu.pop()
            hc.pop()
        hw.append(w)
        hu.append(u)
        hc.append(ci)
    return hw, hu, hc


def _knapsack_greedy(items: Items, capacity: int, owned: int | None = None,
                     lent_price_factor: float = 0.0) -> dict[str, int]:
    """The multiple-choice knapsack's LP greedy (Sinha & Zoltners, 1979), made integral.

    Each item's choices, with (0 GPUs, 0) for "none", are cut to their upper concave hull in
    (w, u); consecutive hull points give increments of efficiency Δu/Δw, falling along each
    hull. All increments are taken in order of efficiency while they fit; an item whose next
    increment does not fit takes no more (its later ones need it). Without integrality this is
    the LP optimum; integral, it is below the optimum by at most the value of the one split
    increment (tests/core/test_policy.py measures the gap against the DP). O(n log n) for n
    choices in all. Lent GPUs (above `owned`) are taken only by increments whose gain exceeds
    the price of the lent GPUs they add, price per GPU = `lent_price_factor` · (the value
    reached within `owned`) / owned, as in `_knapsack_dp`."""
    import numpy as np

    # every choice flattened in (item, choice) order: item, position in the item, GPUs, value
    flat = [choice for _, choices in items for choice in choices]
    if not flat:
        return {}
    lens = np.fromiter((len(choices) for _, choices in items), dtype=np.int64, count=len(items))
    fw, fu, _ = zip(*flat, strict=True)
    k_, c_, _ = _rows(lens)
    level = _greedy_flat(k_, c_, np.array(fw, dtype=np.int64), np.array(fu, dtype=np.float64),
                         capacity, owned, lent_price_factor)
    return {items[k][0].job_id: items[k][1][ci][2] for k, ci in level.items()}


def _greedy_flat(all_k: Any, all_c: Any, all_w: Any, all_u: Any, capacity: int, owned: int | None,
                 lent_price_factor: float) -> dict[int, int]:
    """`_knapsack_greedy` on choices given as numpy arrays in (item, choice) order: item, a label
    that rises along each item's choices (returned for the choice taken), GPUs, value. Returns
    {item: label} for the items that take a choice."""
    import numpy as np

    fits = all_w <= capacity
    k_, c_, w_, u_ = (all_k, all_c, all_w, all_u) if fits.all() else (
        all_k[fits], all_c[fits], all_w[fits], all_u[fits])
    if not len(k_):
        return {}
    first = np.ones(len(k_), dtype=bool)
    first[1:] = k_[1:] != k_[:-1]
    # each point's predecessor on its item's chain, (0, 0) before an item's first choice
    pw = np.where(first, 0, np.roll(w_, 1))
    pu = np.where(first, 0.0, np.roll(u_, 1))
    # An item's choices are their own upper concave hull (the usual case: throughput rising and
    # concave in GPUs) if each adds GPUs and value and no point lies on or under the chord from
    # the point before it to the point after it: the test the hull walk below makes, on the same
    # floats. Those items' increments are computed at once; the others walk the hull.
    bad = (w_ <= pw) | (u_ <= pu)
    ppw, ppu = pw[:-1], pu[:-1]  # the point before each point with a next one
    under = (u_[:-1] - ppu) * (w_[1:] - ppw) <= (u_[1:] - ppu) * (w_[:-1] - ppw)
    bad[:-1] |= ~first[1:] & under
    simple = np.ones(int(all_k[-1]) + 1, dtype=bool)
    simple[k_[bad]] = False
    keep = simple[k_]
    # the increments: efficiency Δu/Δw, item, choice reached, Δw, Δu, step within the item
    inc_k = [k_[keep]]
    inc_c = [c_[keep]]
    inc_dw = [(w_ - pw)[keep]]
    inc_du = [(u_ - pu)[keep]]
    for k in np.flatnonzero(~simple).tolist():
        lo, hi = np.searchsorted(all_k, (k, k + 1))  # its choices, those that do not fit too
        labels = all_c[lo:hi].tolist()
        hw, hu, hc = _upper_hull(list(zip(all_w[lo:hi].tolist(), all_u[lo:hi].tolist(), labels, strict=True)),
                                 capacity)
        n = len(hw) - 1
        inc_k.append(np.full(n, k, dtype=np.int64))
        inc_c.append(np.array([labels[h] for h in hc[1:]], dtype=np.int64))
        inc_dw.append(np.array([hw[s] - hw[s - 1] for s in range(1, n + 1)], dtype=np.int64))
        inc_du.append(np.array([hu[s] - hu[s - 1] for s in range(1, n + 1)], dtype=np.float64))
    ik, ic = np.concatenate(inc_k), np.concatenate(inc_c)
    dw_, du_ = np.concatenate(inc_dw), np.concatenate(inc_du)
    # by falling efficiency, ties in (item, step) order (steps of an item are in choice order)
    order = np.lexsort((ic, ik, -(du_ / dw_)))
    item, pick = ik[order].tolist(), ic[order].tolist()
    dws, dus = dw_[order].tolist(), du_[order].tolist()
    csum_w = np.cumsum(dw_[order])
    csum_u = np.cumsum(du_[order])  # sequential sums, as the loop below adds
    own = capacity if owned is None else min(owned, capacity)

    def fill(limit: int, price: float) -> tuple[dict[int, int], float]:
        # the leading increments that fit within min(limit, owned GPUs) are all taken (none is
        # refused before them, so no item is closed); the loop goes on from the first that doesn't
        j = int(np.searchsorted(csum_w, min(limit, own), side="right"))
        level: dict[int, int] = dict(zip(item[:j], pick[:j], strict=True))
        closed: set[int] = set()
        used, value = (int(csum_w[j - 1]), float(csum_u[j - 1])) if j else (0, 0.0)
        for x in range(j, len(item)):
            if used >= limit:
                break  # full: nothing more fits
            k = item[x]
            if k in closed:
                continue
            dw = dws[x]
            after = used + dw
            # lent GPUs this increment adds: max(0, after − own) − max(0, used − own)
            lent_added = 0 if after <= own else after - own - (used - own if used > own else 0)
            if after > limit or (lent_added and dus[x] <= price * lent_added):
                closed.add(k)
                continue
            level[k] = pick[x]
            used += dw
            value += dus[x]
        return level, value

    level, value = fill(own, 0.0)
    if own < capacity:
        per_gpu = value / own if own > 0 else fill(capacity, 0.0)[1] / capacity
        level, _ = fill(capacity, lent_price_factor * per_gpu)
    return level


def _knapsack_dp(items: Items, capacity: int, owned: int | None = None,
                 lent_price_factor: float = 0.0) -> dict[str, int]:
    """Multiple-choice knapsack by dynamic programming over GPU counts.

        best_k(c) = max(best_{k−1}(c), max_i best_{k−1}(c − w_ki) + u_ki)

    for item k with choices i of weight w (GPUs) and value u; 0 ≤ c ≤ capacity. Vectorised over
    c with numpy: O(items · choices · capacity) simple array operations. Returns the option
    index picked for each item that takes one (items that take none are absent). GPUs above
    `owned` are lent: the total used is argmax_c best(c) − price·max(0, c − owned), price =
    `lent_price_factor` · best(owned)/owned (module docstring).
    """
    import numpy as np

    best = np.zeros(capacity + 1)
    back: list[np.ndarray] = []
    for _, choices in items:
        new = best.copy()
        arg = np.full(capacity + 1, -1, dtype=np.int32)
        for k, (w, u, _) in enumerate(choices):
            if w > capacity or u <= 0:
                continue
            cand = best[: capacity + 1 - w] + u if w > 0 else best + u
            target = new[w:] if w > 0 else new
            better = cand > target + 1e-12
            target[better] = cand[better]
            arg[w:][better] = k
        back.append(arg)
        best = new
    picked: dict[str, int] = {}
    own = capacity if owned is None else min(owned, capacity)
    if own < capacity and lent_price_factor > 0:
        price = lent_price_factor * (best[own] / own if own > 0 else float(best.max()) / max(1, capacity))
        c = int(np.argmax(best - price * np.maximum(0, np.arange(capacity + 1) - own)))
    else:
        c = int(np.argmax(best))
    for (job, choices), arg in zip(reversed(items), reversed(back), strict=True):
        k = int(arg[c])
        if k >= 0:
            w, _, idx = choices[k]
            picked[job.job_id] = idx
            c -= w
    return picked


# -- placement ----------------------------------------------------------------------------


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


def _owned_prefix(nodes: Sequence[Node]) -> list[int]:
    """GPUs on the k largest owned nodes, k = 1, 2, ... (`_fewest_nodes`)."""
    return list(itertools.accumulate(sorted((n.gpus for n in nodes if not n.recallable), reverse=True)))


def _fewest_nodes(prefix: list[int], g: int) -> int:
    """The fewest owned nodes whose whole capacity holds g GPUs: how a request of g GPUs is
    packed (more than there are if none do); `prefix` from `_owned_prefix`."""
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
        self.packed = _owned_prefix(nodes)
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
        return _fewest_nodes(self.packed, g)

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


# -- the decision ---------------------------------------------------------------------------


def decide(snapshot: Snapshot) -> Decision:
    """The decision for `snapshot` (module docstring). A round allocates ~200,000 short-lived
    tuples and lists, all freed by reference counting; the cyclic collector, which would scan
    the snapshot's objects over and over meanwhile, is paused for the round and restored as it
    was (5,000 jobs on 8,192 GPUs, same process and hour: 124-138 ms a round with it, 91-98
    ms without)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _decide(snapshot)
    finally:
        if paused:
            gc.enable()


def _decide(snapshot: Snapshot) -> Decision:
    cfg = snapshot.config
    jobs = sorted(snapshot.jobs, key=lambda j: (j.arrival, j.job_id))
    inf = math.inf
    for j in jobs:  # one plain loop: generators per job were 14 ms of a 5,000-job round
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
    jobs = [guarded(j, cfg.guarantee_margin) for j in jobs]
    snapshot = replace(snapshot, jobs=tuple(jobs))
    capacity = sum(n.gpus for n in snapshot.nodes if not n.recallable)
    lent = sum(n.gpus for n in snapshot.nodes if n.recallable)
    risk = sum(n.gpus * n.recall_risk for n in snapshot.nodes if n.recallable) / lent if lent else 0.0
    running = _running(snapshot)
    # left alone: jobs restarted too often, and jobs with no work left (finishing: a restart
    # would only delay them, and with W = 0 every option looks infinitely good)
    frozen = {j.job_id: current_index(j) for j in running if j.remaining_samples <= 0}
    # jobs restarted `max_restarts` times keep at least what they run: no more shrinking or
    # preempting (that is what thrashes), growth only (a job alone at the end still scales up)
    kept = {j.job_id: i for j in running if j.restarts >= cfg.max_restarts and j.job_id not in frozen
            and (i := current_index(j)) is not None}
    # A job the knapsack (which counts GPUs) chose but placement cannot host (its CPUs or memory
    # are not there, or not on as few nodes as its GPUs need) waits, and the knapsack runs again
    # without it, so that it does not hold GPUs nobody else may use. Every round drops at least
    # one job, and the decision returned is always one with none left stuck: stopping after a
    # fixed number of rounds (4, as this did first) returned a decision whose knapsack had
    # given a floor to a job that could not be placed, and its GPUs sat idle (one workload of
    # benchmarks/sim_sweep.py: 48 of 64 GPUs for hours, while four guaranteed jobs too big for
    # the free nodes were dropped one per round).
    unplaceable: dict[str, str] = {}
    # A running job whose new option placement cannot host keeps what it runs (its own GPUs are
    # placed first when it stays), and the knapsack runs again with it there. It used to wait
    # instead: a running job whose growth found no room, once the jobs placed before it (larger
    # first) had taken the GPUs it gave up, was stopped, with a restart, and a guaranteed one
    # below its guarantee (tests/core/test_policy.py has the case).
    stay: dict[str, int] = {}
    running_by_id = {j.job_id: j for j in running}
    # each job's floor, computed once for every round below (`guarantee_index`: 0 without a
    # guarantee, None where no option reaches it), and the GPUs of the guaranteed jobs' floors
    floor_at = {j.job_id: guarantee_index(j, cfg.guarantee_margin) for j in jobs}
    floor_gpus = {j.job_id: j.options[gi].gpus for j in jobs
                  if j.guarantee is not None and (gi := floor_at[j.job_id]) is not None}
    prefix = _owned_prefix(snapshot.nodes)
    # waiting guaranteed floors by GPU count, with the fewest nodes each needs (non-decreasing in
    # the count: those of at least g GPUs on as many nodes as g are one run from g on); built the
    # first time a floor is found stuck
    waiting_floors: list[tuple[int, int, str]] | None = None
    # owned GPUs each running job holds (without lent GPUs: all it holds)
    owned_ids = {n.node_id for n in snapshot.nodes if not n.recallable}
    owned_held = {j.job_id: (sum(g for nid, g in j.current.gpus_by_node if nid in owned_ids) if lent
                             else j.current.gpus) for j in running if j.current is not None}
    # lent GPUs no running job holds: a best-effort job on owned GPUs a guaranteed one needs can
    # move there (`place`), so admission counts them against what running best-effort jobs hold
    movable = lent - sum(j.current.gpus - owned_held[j.job_id] for j in running if j.current is not None)
    while True:
        new_choice, reasons = _choose_counts(jobs, capacity, {**frozen, **stay, **dict.fromkeys(unplaceable)},
                                             floor_at, cfg, snapshot.now, lent=lent, risk=risk,
                                             kept={k: v for k, v in kept.items()
                                                   if k not in unplaceable and k not in stay},
                                             owned_held=owned_held, movable=max(0, movable))
        reasons = {**reasons, **unplaceable}
        d = place(snapshot, new_choice, reasons, running=running, pack=True)
        stuck = [jid for jid, i in new_choice.items()
                 if i is not None and jid not in d.allocations and jid not in frozen]
        if not stuck:
            break
        for jid in stuck:
            if (jid in running_by_id and jid not in stay
                    and (i := current_index(running_by_id[jid])) is not None):
                stay[jid] = i
            else:  # a running job stuck again where it stays (its GPUs are gone): it waits
                unplaceable[jid] = d.reasons.get(jid, "waiting: cannot be placed")
        stuck = [jid for jid in stuck if jid in unplaceable]
        # A guaranteed floor of g GPUs that found no k = fewest_nodes(g) nodes holding it rules
        # out, in this decision, every waiting guaranteed floor of at least g GPUs on the same k
        # nodes (the guaranteed are placed first, so they meet the same free GPUs): dropped
        # together, not one a round (phase 1 admits them one at a time while its GPU count
        # allows: hundreds of rounds where the free GPUs are fragmented).
        for jid in stuck:
            if d.reasons.get(jid, "").startswith(SPREAD_REASON) and (g := floor_gpus.get(jid)) is not None:
                if waiting_floors is None:
                    waiting_floors = sorted((og, _fewest_nodes(prefix, og), oid)
                                            for oid, og in floor_gpus.items() if oid not in running_by_id)
                k = _fewest_nodes(prefix, g)
                at = bisect.bisect_left(waiting_floors, (g,))
                for _, ok, oid in itertools.islice(waiting_floors, at, None):
                    if ok != k:
                        break
                    unplaceable[oid] = d.reasons[jid]
    if cfg.grow_into_idle:
        d = grow_into_idle(snapshot, d, reasons, running, frozenset(kept), capacity)
    return d


def grow_into_idle(snapshot: Snapshot, d: Decision, reasons: Mapping[str, str], running: list[JobView],
                   kept: frozenset[str], capacity: int) -> Decision:
    """Phase 5: owned GPUs that the decision leaves idle (no waiting job can use them: the
    knapsack gives every GPU a waiting job fits) go to allocated jobs whose growth pays for its
    restart over their *real* remaining work, not the horizon-capped work of the objective:

        grow j from option i to k  iff  saving = W_j/s_j(i) − (R_j + W_j/s_j(k)) > 0

    W_j: remaining samples, R_j: its restart cost (0 when the decision restarts or starts it
    anyway). The growths are chosen by the phase-2 knapsack over the idle GPUs, maximising the
    seconds saved in all. Jobs at half their restart allowance or more do not grow (growth that
    is undone when others arrive costs a restart each way; without this gate a job thrashed
    into `max_restarts`) unless they have run `settle_s` on their allocation (`JobView.running_s`)
    and a growth and the shrink that may undo it both fit in the allowance (a job at
    `max_restarts` keeps at least what it runs: it must not be kept at a growth). Without that
    exception t5-300 of benchmarks/sim_sweep.py's syn-r2-sla0-mix-spread@1, thrashed to 14
    restarts by short jobs, ran its last 39,000 s on 4 of 64 GPUs beside 48 idle ones (makespan
    speedup 0.913 → 0.931; trying it whenever no job waits, instead of after a settled spell,
    lost the worst JCT case: docs/log/policy.md). That was measured against a Rubick
    re-implementation that froze its worn-out jobs; against the one that grows them, the
    exception costs more than it gives (over seeds 0-2 the worst JCT case 0.993 → 0.912, the
    worst makespan case 0.890 both), so `settle_s` is inf by default: the exception is off. If a
    grown job cannot be placed, the decision stays as it was.

    Kept jobs (restarted `max_restarts` times: never shrunk again, phase 3) grow here only while
    no job waits. Such a growth cannot be undone, so the thrash the gate above guards against
    (grow, then shrink for the next arrival, a restart each way) cannot happen; what it costs is
    that the GPUs it takes stay with it until it ends, hence only when nobody waits for them.
    Until 2026-12-01 kept jobs never grew here: vit-185 of sim_sweep.py's
    syn-r2-sla25-small-short-anyplan@2, kept on 4 GPUs after 20 restarts in its first 7,000 s,
    ran its last 50,000 s there beside 60 idle GPUs (makespan speedup 0.890, the family's worst
    case; 1.042 with the rule, the median over its copies 0.896 → 1.040). Over seeds 0-2 and 5
    arrival-jittered copies of each workload (`sim_sweep.py --seeds 3 --copies 5`), the
    medians' JCT geomean / worst 1.363 / 0.969 → 1.362 / 0.969, makespan 1.006 / 0.896 → 1.010
    / 0.903; 3 of the 42 distinct workloads moved by more than 0.02. Letting worn jobs that are
    not kept grow while nobody waits as well lost the worst JCT median (0.969 → 0.819, on
    syn-r0.5-sla50-large-spread@0: docs/log/policy.md).

    Why: the horizon cap makes long jobs compare by throughput, but with no competitor the cap
    hid what growth saves: on benchmarks/sim_sweep.py a t5 job shrunk to 4 GPUs ran its last
    16,000 s there alone on an 18%-busy cluster, and llama30 jobs ran alone on 32 of 64 GPUs.

    Not while the decision uses lent GPUs: the owned GPUs it leaves idle are then fragments
    beside jobs on lent nodes, not a quiet cluster, and the capacity changes as inference
    lends and recalls, so the next round undoes the growth and the job pays a restart each way.
    On `benchmarks/loan_compare.py`'s workload-base phase 5 acted in 239 rounds with loans
    against 70 without, and the jobs restarted 430 times against 182; without it there, the
    loans' JCT speedup over the family (`--family`, 15 workloads, `loan_jct_speedup` geomean /
    worst at the envelope's phases 0, 0.25 and 0.5) went 0.994 / 0.698, 1.040 / 0.724, 1.055 /
    0.973 → 1.005 / 0.717, 1.075 / 0.995, 1.071 / 0.996 (with the borrower moves of `place`:
    1.038 / 0.901, 1.064 / 0.971, 1.060 / 0.998)."""
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
    grown = _knapsack(items, idle)
    if not grown:
        return d
    new: dict[str, int | None] = {**now_at, **grown}
    out = place(snapshot, new, reasons, running=running, pack=True)
    return out if all(jid in out.allocations for jid in d.allocations) else d


SPREAD_REASON = "waiting: its GPUs fit only spread over more nodes than they need"
CAPACITY_REASON = "waiting: no node has the CPUs/memory for its GPUs"


def _running(snapshot: Snapshot) -> list[JobView]:
    """Jobs that hold an allocation the snapshot can still honour (all their nodes present)."""
    nodes = {n.node_id for n in snapshot.nodes}
    return [j for j in snapshot.jobs if j.current is not None and current_index(j) is not None
            and all(nid in nodes for nid, _ in j.current.gpus_by_node)]


def place(snapshot: Snapshot, choice: Mapping[str, int | None],
          reasons: Mapping[str, str] | None = None,
          running: list[JobView] | None = None, pack: bool = False) -> Decision:
    """Phase 4, for any choice of option per job (`decide`'s, or a baseline's in `tidal.sim`):
    unchanged running jobs keep their GPUs; the others are placed largest first (guaranteed
    jobs before best-effort ones), on one node when one has room, else over the fewest nodes,
    falling back to fewer GPUs when CPUs or memory run out; a guaranteed job with no room on
    owned GPUs moves kept best-effort jobs to free lent GPUs (`displace`). Jobs absent from
    `choice` wait."""
    jobs = sorted(snapshot.jobs, key=lambda j: (j.arrival, j.job_id))
    nodes = {n.node_id: n for n in snapshot.nodes}
    by_id = {j.job_id: j for j in jobs}
    running_ids = {j.job_id for j in (_running(snapshot) if running is None else running)}
    reasons = dict(reasons or {})
    new_choice = {j.job_id: choice.get(j.job_id) for j in jobs}
    pool = _Pool(snapshot.nodes)
    free = pool.free
    allocations: dict[str, Allocation] = {}
    changed: list[str] = []
    pending: list[JobView] = []

    def keep_current(j: JobView, idx: int) -> bool:
        """If option `idx` is what the running job runs and its GPUs are still free, it keeps
        them (taken from `free`): no restart."""
        o, cur = j.options[idx], j.current
        if (cur is None or j.job_id not in running_ids or idx != current_index(j) or cur.plan != o.plan
                or not all(_fits(free[nid], o, g) for nid, g in cur.gpus_by_node)):
            return False
        for nid, g in cur.gpus_by_node:
            pool.take(free[nid], o, g)
        return True

    for j in jobs:
        i = new_choice[j.job_id]
        if i is None:
            continue
        if keep_current(j, i):
            assert j.current is not None
            allocations[j.job_id] = j.current
        else:
            pending.append(j)
    pending.sort(key=lambda j: (j.guarantee is None, -j.options[new_choice[j.job_id] or 0].gpus, j.arrival))
    def packed(j: JobView, o: Option) -> tuple[tuple[tuple[str, int], ...] | None, bool]:
        """`pool.place` under the packing rule, and whether that rule refused it: owned GPUs over
        more nodes than they need run slower than predicted."""
        placed = pool.place(j, o)
        if placed is not None and pack and pool.spread(placed):
            for nid, g in placed:
                pool.give(free[nid], o, g)
            return None, True
        return placed, False

    def displace(g: JobView, idx: int) -> tuple[tuple[str, int], ...] | None:
        """Room on owned GPUs for guaranteed job `g`'s option `idx` made by moving best-effort jobs
        that keep their allocation here, newest first, to other GPUs (the lent ones no job
        holds, where guaranteed jobs may not go): each moved job keeps its option and restarts,
        none stops. All or nothing: if `g` or a moved job finds no place, nothing moves."""
        # each mover's option: the one it keeps (`keep_current` matched it to its allocation)
        movers = {b.job_id: b.options[new_choice[b.job_id] or 0] for b in sorted(
            (b for b in jobs if b.job_id in allocations and b.guarantee is None
             and allocations[b.job_id] == b.current and b.restarts < snapshot.config.max_restarts
             and b.remaining_samples > 0
             and any(not nodes[nid].recallable for nid, _ in allocations[b.job_id].gpus_by_node)),
            key=lambda b: (-b.arrival, b.job_id))}
        moved: list[str] = []
        for jid, o in movers.items():
            for nid, k in allocations[jid].gpus_by_node:
                pool.give(free[nid], o, k)
            moved.append(jid)
            placed, _ = packed(g, g.options[idx])
            if placed is None:
                continue
            again: list[tuple[str, tuple[tuple[str, int], ...]]] = []
            for m in moved:
                at, _ = packed(by_id[m], movers[m])
                if at is None:
                    break
                again.append((m, at))
            if len(again) == len(moved):
                for m, at in again:
                    allocations[m] = Allocation(gpus_by_node=at, plan=movers[m].plan)
                    changed.append(m)
                return placed
            for m, at in again:  # undo: the moved jobs' new GPUs, then g's
                for nid, k in at:
                    pool.give(free[nid], movers[m], k)
            for nid, k in placed:
                pool.give(free[nid], g.options[idx], k)
            break
        for m in reversed(moved):  # nothing moves: every mover takes its GPUs back
            for nid, k in allocations[m].gpus_by_node:
                pool.take(free[nid], movers[m], k)
        return None

    for j in pending:
        idx = new_choice[j.job_id]
        assert idx is not None
        placed = None
        spread = False
        while idx is not None and placed is None:
            if keep_current(j, idx):  # the fallback came back to what the job runs
                assert j.current is not None
                placed = j.current.gpus_by_node
                break
            placed, refused = packed(j, j.options[idx])
            spread = spread or refused
            if placed is None:  # CPUs or memory too scarce for this many GPUs: try fewer
                floor = guarantee_index(j, snapshot.config.guarantee_margin) or 0
                idx = idx - 1 if idx > floor else None
        if (placed is None or idx is None) and j.guarantee is not None and pool.lent_free():
            idx = new_choice[j.job_id]
            assert idx is not None
            placed = displace(j, idx)
        if placed is None or idx is None:
            reasons[j.job_id] = SPREAD_REASON if spread else CAPACITY_REASON
            continue
        alloc = Allocation(gpus_by_node=placed, plan=j.options[idx].plan)
        allocations[j.job_id] = alloc
        if j.current is not None and alloc != j.current:
            changed.append(j.job_id)
    for j in jobs:
        if j.current is not None and j.job_id not in allocations:
            changed.append(j.job_id)  # preempted
    recall_loss: dict[str, float] = {}
    for jid, a in allocations.items():
        lent = sum(g for nid, g in a.gpus_by_node if nodes[nid].recallable)
        if lent:
            j = by_id[jid]
            now = next(o.samples_per_s for o in j.options if o.gpus == a.gpus)
            left = [o for o in j.options if o.gpus <= a.gpus - lent]
            recall_loss[jid] = now - (left[-1].samples_per_s if left else 0.0)
    for jid in allocations:
        reasons.pop(jid, None)
    return Decision(allocations=allocations, reasons=reasons, recall_loss=recall_loss,
                    changed=tuple(sorted(set(changed))))
