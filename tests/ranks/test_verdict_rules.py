"""The stall rules on their own (llmmon.ranks.stall): the edge cases that decide a verdict.
The whole path, from spool files to /api/v1/ranks and the metrics, is in the other tests."""

from __future__ import annotations

from llmmon.ranks import stall
from llmmon.ranks.validate import Group, Progress

def _progress(**ranks: tuple[int, int]) -> dict[int, Progress]:
    """rank r<N>=(enqueued, completed)."""
    return {int(name[1:]): Progress(enqueued, -1, completed)
            for name, (enqueued, completed) in ranks.items()}


def test_a_silent_rank_does_not_hold_the_frontier_back() -> None:
    # rank 2 stopped reporting at #7; the others completed #9 since and wait in #10
    progress = _progress(r0=(10, 9), r1=(10, 9), r2=(7, 7))
    assert stall.frontier(progress, held={2}) == 10
    assert stall.waiting_ranks(progress, 10) == (0, 1)
    assert stall.behind_ranks(progress, 10) == (2,)
    # every rank silent: their own reports are all there is
    assert stall.frontier(progress, held={0, 1, 2}) == 8


def test_the_rank_behind_is_named_only_while_another_waits() -> None:
    progress = _progress(r0=(11, 10), r1=(10, 10), r2=(11, 10))
    assert stall.frontier(progress, held=set()) == 11
    assert stall.waiting_ranks(progress, 11) == (0, 2)
    assert stall.behind_ranks(progress, 11) == (1,)
    idle = _progress(r0=(10, 10), r1=(9, 9))
    assert stall.frontier(idle, held=set()) == 10
    assert (stall.waiting_ranks(idle, 10), stall.behind_ranks(idle, 10)) == ((), ())


def test_stalled_for_is_never_longer_than_since_the_last_enqueue() -> None:
    # a daemon restarted 2 s ago: the collective has waited 50 s
    assert stall.stalled_for(no_progress=2.0, waited=50.0, since_enqueue=300.0) == 50.0
    # a rank that just caught up (after a checkpoint) is progress
    assert stall.stalled_for(no_progress=90.0, waited=90.0, since_enqueue=1.5) == 1.5
    assert stall.stalled_for(no_progress=12.0, waited=None, since_enqueue=300.0) == 12.0


def test_the_rank_behind_is_remote_only_when_the_group_spans_other_nodes() -> None:
    spans = Group("dp", 8, ((0, 7),))
    assert stall.behind_remote((), (), None, spans, local=4)
    assert not stall.behind_remote((), (), None, Group("dp", 4, ((0, 3),)), local=4)
    assert not stall.behind_remote((), (), None, None, local=4)  # size unknown
    assert not stall.behind_remote((3,), (), None, spans, local=4)  # the culprit is here
    assert not stall.behind_remote((), (1,), None, spans, local=4)  # a stopped rank is
    assert not stall.behind_remote((), (), {"seq": 5}, spans, local=4)  # a desync is


def test_a_busy_or_remote_culprit_gets_the_ceiling_not_the_learned_threshold() -> None:
    def stalled(stuck: float, **kwargs: bool) -> bool:
        rule = {"live_waiters": True, "excused": False, "ended": False} | kwargs
        return stall.inflight_stalled(stuck, 20.0, 180.0, **rule)

    assert not stalled(19.9)
    assert stalled(20.0)
    assert not stalled(100.0, excused=True) and stalled(180.0, excused=True)
    assert not stalled(1000.0, ended=True)  # an end, not a hang
    assert not stalled(1000.0, live_waiters=False)  # every waiting rank gone: not hung


def test_a_quiet_job_is_stalled_unless_a_rank_here_works() -> None:
    assert stall.quiet_stalled(45.0, 40.0, busy=())
    assert not stall.quiet_stalled(45.0, 40.0, busy=(1,))  # an evaluation
    assert not stall.quiet_stalled(39.0, 40.0, busy=())
    assert not stall.quiet_stalled(0.0, 0.0, busy=())  # not quiet at all
