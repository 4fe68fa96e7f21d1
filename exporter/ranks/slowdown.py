"""A job that slows evenly: every rank of a group completes collectives at a fraction of the
group's own earlier pace, and no rank is behind.

A straggler leaves a trace (it enqueues late: llmmon.ranks.hang, the enqueue-lag rules); a
degraded link between nodes does not: every rank enters each collective on time and waits
longer in it.  What this daemon can tell it by is the pace itself (the mean gap between the
group's collectives over the ranks' last RATE_WINDOW seconds of status reports, against the
fastest mean gap of an earlier WINDOW still in their Flight Recorder index) and, for the
cause, the TCP retransmissions in the ranks' network namespaces (llmmon.ranks.netns).  Without
loss on TCP the slowdown is shown but no cause is claimed: over RDMA the NIC counters and
their rules speak, and a common slowdown (input pipeline, every GPU throttled) has other evidence.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from statistics import mean, median
from typing import Any, Iterable

from llmmon.ranks import pace
from llmmon.ranks.ledger import RankTrack
from llmmon.ranks.netns import Loss

RECENT = 10  # newest ring gaps per rank: the pace now when the status cannot give it
RATE_WINDOW = 20.0  # seconds of status reports the pace now may be measured over
MIN_SPAN = 10.0  # ... between two reports at least this far apart
WINDOW = 30.0  # seconds of ring gaps in one earlier pace measurement; the group must have
# enqueued something this recently to have a pace now
MIN_GAPS = 5  # collectives a measurement needs
FACTOR = 2.0  # slower than this many times the group's own pace is a slowdown
LOSS_SHARE = 0.01  # of TCP segments retransmitted over the window: a lossy path
MIN_RETRANSMITTED = 10
LAG_SHARE = 0.1  # a local rank enqueueing this share of the gap late is behind: not even


@dataclass(frozen=True)
class Pace:
    """A group's pace on this node (mean seconds per collective): now, and the fastest of an
    earlier WINDOW still in the ranks' Flight Recorder index."""

    recent: float
    basis: str  # status (its reports' last enqueued numbers) or ring (its newest gaps)
    baseline: float | None
    windows: int  # earlier windows the baseline was chosen from

    @property
    def ratio(self) -> float | None:
        return self.recent / self.baseline if self.baseline else None

    def json(self) -> dict[str, Any]:
        ratio = self.ratio
        return {"recent_seconds": round(self.recent, 4), "recent_basis": self.basis,
                "baseline_seconds": None if self.baseline is None else round(self.baseline, 4),
                "ratio": None if ratio is None else round(ratio, 2),
                "window_seconds": WINDOW, "earlier_windows": self.windows}


def _status_pace(track: RankTrack, pg: str, now: float) -> float | None:
    """Seconds per collective between the rank's newest status report and the newest one at
    least MIN_SPAN older (within RATE_WINDOW)."""
    seen = [(t, seq) for t, seq in track.enqueues.get(pg, ()) if t >= now - RATE_WINDOW]
    if not seen:
        return None
    t1, last = seen[-1]
    start = [(t, seq) for t, seq in seen if t <= t1 - MIN_SPAN]
    if not start or last - start[-1][1] < MIN_GAPS:
        return None
    t0, first = start[-1]
    return (t1 - t0) / (last - first)


def _earlier(gaps: list[tuple[float, float]], since: float) -> list[float]:
    """Mean gap of each WINDOW before `since` that the rank's gaps cover at least half of (the
    oldest, cut by the ring or by the job's start, would compare its first burst of set-up
    collectives)."""
    blocks: dict[int, list[float]] = {}
    for t, gap in gaps[:bisect.bisect_left(gaps, (since,))]:
        blocks.setdefault(int((since - t) // WINDOW), []).append(gap)
    return [sum(b) / len(b) for b in blocks.values()
            if len(b) >= MIN_GAPS and sum(b) >= WINDOW / 2]


def group_pace(members: Iterable[RankTrack], pg: str, now: float) -> Pace | None:
    """None while the group enqueued nothing for WINDOW seconds (idle, hung or slow-stepped).

    Every figure is a mean gap (time over collectives), so a job whose collectives come in
    bursts (ten in 50 ms, then a second of compute) compares like with like."""
    members = list(members)
    timed = [pace.timed_gaps(track, pg) for track in members]
    rates = [r for r in (_status_pace(track, pg, now) for track in members) if r is not None]
    recent = [gap for gaps in timed for _, gap in gaps[-RECENT:]]
    newest = max((gaps[-1][0] for gaps in timed if gaps), default=0.0)
    if not rates and (len(recent) < MIN_GAPS or newest < now - WINDOW):
        return None  # the status proves recent collectives; the ring, only if new enough
    now_pace, basis = (median(rates), "status") if rates else (mean(recent), "ring")
    since = min((gaps[-RECENT:][0][0] for gaps in timed if gaps), default=now)
    if rates:
        since = min(since, now - RATE_WINDOW)
    earlier = [m for gaps in timed for m in _earlier(gaps, since)]
    return Pace(now_pace, basis, min(earlier, default=None), len(earlier))


def verdict(job_id: str, groups: list[dict[str, Any]], lags: dict[str, dict[int, float]],
            loss: Loss | None) -> dict[str, Any] | None:
    """The job's slowest group if it runs FACTOR x slower than its own pace with no local rank
    behind, with the cause when TCP loss explains it (`cause` None otherwise)."""
    slowed = [g for g in groups if not g["stalled"] and g["gap"] and g["gap"]["ratio"]
              and g["gap"]["ratio"] >= FACTOR]
    even = [g for g in slowed
            if max(lags.get(g["pg"], {}).values(), default=0.0)
            < LAG_SHARE * g["gap"]["recent_seconds"]]
    if not even:
        return None
    group = max(even, key=lambda g: g["gap"]["ratio"])
    gap = group["gap"]
    text = (f"job {job_id} runs {gap['ratio']:.1f}x slower than its own pace: group "
            f"{group['pg']} enqueues a collective every {gap['recent_seconds']:.2f} s, every "
            f"{gap['baseline_seconds']:.2f} s before, and every local rank enters them on time")
    cause = None
    if loss is not None and loss.share >= LOSS_SHARE and loss.retransmitted >= MIN_RETRANSMITTED:
        cause = (f"{text}; {loss.share:.1%} of the TCP segments sent in the network namespace "
                 f"of {loss.netns} were retransmitted over the last {loss.seconds:.0f} s "
                 f"({loss.retransmitted} of {loss.sent}): suspect the network between the "
                 "nodes (a lossy or congested link), not a rank")
    return {"pg": group["pg"], "gap": gap, "tcp": loss.json() if loss else None,
            "summary": cause or f"{text}: a rank on another node, or something all ranks share "
                                "(the network, the input pipeline, every GPU's clocks)",
            "cause": cause}
