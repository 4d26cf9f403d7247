"""The one job state machine (`tidal.core.state`): its shape, checked over the whole graph."""

from __future__ import annotations

from tidal.core.state import ALLOWED, TERMINAL, JobState


def _reachable(start: JobState) -> set[JobState]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in ALLOWED[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_terminal_states_have_no_way_out_and_every_other_state_can_be_cancelled() -> None:
    assert set(ALLOWED) == set(JobState)
    for state in JobState:
        assert (ALLOWED[state] == frozenset()) == (state in TERMINAL) == state.terminal
        if not state.terminal:
            assert JobState.CANCELLED in ALLOWED[state], state


def test_every_state_is_reached_from_a_submit_and_every_live_one_can_end() -> None:
    assert _reachable(JobState.PROFILING) == set(JobState)
    for state in JobState:
        assert _reachable(state) & TERMINAL, f"{state} can never end"
        assert state not in ALLOWED[state], f"{state} -> itself is not a change of state"


def test_the_policy_sees_exactly_the_planned_jobs_that_have_not_ended() -> None:
    assert {s for s in JobState if s.scheduled} == {JobState.QUEUED, JobState.RUNNING, JobState.STOPPING}
    # a job leaves the policy's view only by ending, or (before it is planned) never enters it
    assert JobState.PROFILING not in set().union(*(ALLOWED[s] for s in JobState if s.scheduled))
    # a lost run (fault, restarted scheduler) goes back to the queue, never to profiling
    assert JobState.QUEUED in ALLOWED[JobState.RUNNING]
