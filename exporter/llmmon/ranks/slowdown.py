"""A job that slows evenly: every rank of a group completes collectives at a fraction of the
group's own earlier pace, and no rank is behind.

A straggler leaves a trace (it enqueues late: llmmon.ranks.stall, the enqueue-lag rules); a
degraded link between nodes does not: every rank enters each collective on time and waits
longer in it.  What this daemon can tell it by is the pace itself (the mean gap between the
group's collectives over the ranks' last RATE_WINDOW seconds of status reports, against the
fastest mean gap of an earlier WINDOW still in their Flight Recorder index) and, for the
cause, two things: the TCP retransmissions in the ranks' network namespaces
(llmmon.ranks.netns), and where the added time is spent.  Each status report says whether the
rank had a collective in flight (enqueued, not completed); the share of reports that did, now
and before, splits the added seconds per collective into those spent waiting inside the
collectives (a slow or congested link: the cause is the network even without loss) and those
spent before them (every rank late together: the input pipeline, the step, every GPU's clocks).
Neither said clearly enough, no cause is claimed: over RDMA the NIC counters and their rules
speak.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from statistics import mean, median
from typing import Any, Iterable

from llmmon.ranks import dimension, pace
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
MIN_REPORTS = 4  # status reports a share needs (now, and before): one rank read every 5 s
INSIDE = 0.7  # of the added time spent inside the collectives: the network is the suspect
OUTSIDE = 0.25  # ... at most this: the ranks are late to them together, not the network
SHARP = 0.5  # in flight in more of the reports before than this (NCCL's CPU enqueues ahead of
# the GPU), a share now as high says nothing: only a fall is read


@dataclass(frozen=True)
class GroupPace:
    """A group's pace on this node (mean seconds per collective): now, and the fastest of an
    earlier WINDOW still in the ranks' Flight Recorder index."""

    recent: float
    basis: str  # status (its reports' last enqueued numbers) or ring (its newest gaps)
    baseline: float | None
    windows: int  # earlier windows the baseline was chosen from
    # share of the ranks' status reports with a collective in flight: over the last
    # RATE_WINDOW, and over the baseline's window (None: under MIN_REPORTS of them)
    inside: float | None = None
    inside_before: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.recent / self.baseline if self.baseline else None

    @property
    def added_inside(self) -> float | None:
        """Share of the seconds added per collective that the ranks spend inside collectives
        (0-1; None without both shares or under a FACTOR x slowdown, where the added time is
        too small to split, or when it is over OUTSIDE while the ranks had a collective in
        flight in most reports before: then it tells nothing)."""
        if self.inside is None or self.inside_before is None or not self.baseline \
                or self.recent < FACTOR * self.baseline:
            return None
        added = min(1.0, max(0.0, (self.inside * self.recent - self.inside_before * self.baseline)
                             / (self.recent - self.baseline)))
        return None if added > OUTSIDE and self.inside_before > SHARP else added

    def json(self) -> dict[str, Any]:
        ratio, added = self.ratio, self.added_inside
        return {"recent_seconds": round(self.recent, 4), "recent_basis": self.basis,
                "baseline_seconds": None if self.baseline is None else round(self.baseline, 4),
                "ratio": None if ratio is None else round(ratio, 2),
                "window_seconds": WINDOW, "earlier_windows": self.windows,
                "inside_share": _rounded(self.inside),
                "inside_share_before": _rounded(self.inside_before),
                "added_inside_share": _rounded(added)}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _share(members: list[RankTrack], pg: str, start: float, end: float) -> float | None:
    """Share of the members' status reports written in [start, end) with a collective in
    flight (None: under MIN_REPORTS of them)."""
    flags = [flag for track in members for at, flag in track.inside.get(pg, ())
             if start <= at < end]
    return sum(flags) / len(flags) if len(flags) >= MIN_REPORTS else None


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


def _earlier(gaps: list[tuple[float, float]], since: float) -> list[tuple[float, int]]:
    """(mean gap, block) of each WINDOW before `since` (block k ends k WINDOWs before it) that
    the rank's gaps cover at least half of (the oldest, cut by the ring or by the job's start,
    would compare its first burst of set-up collectives)."""
    blocks: dict[int, list[float]] = {}
    for t, gap in gaps[:bisect.bisect_left(gaps, (since,))]:
        blocks.setdefault(int((since - t) // WINDOW), []).append(gap)
    return [(sum(b) / len(b), k) for k, b in blocks.items()
            if len(b) >= MIN_GAPS and sum(b) >= WINDOW / 2]


def group_pace(members: Iterable[RankTrack], pg: str, now: float) -> GroupPace | None:
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
    if not earlier:
        return GroupPace(now_pace, basis, None, 0)
    baseline, block = min(earlier)
    # where the ranks waited then: the reports of the baseline's own window, not of whatever
    # came between it and now (a slowdown an hour old would be its own baseline)
    end = since - block * WINDOW
    return GroupPace(now_pace, basis, baseline, len(earlier),
                _share(members, pg, now - RATE_WINDOW, now + 1),
                _share(members, pg, end - WINDOW, end))


@dataclass(frozen=True)
class _Slowed:
    """The slowest evenly slowed group, read once from its JSON for the cause rules."""

    text: str  # what every summary starts with: the pace now and before
    added: float | None  # GroupPace.added_inside
    local: bool  # every rank of the group is on this node: no network between nodes
    dim: str  # the group's mesh dimension (llmmon.ranks.dimension)

    @property
    def between(self) -> str:
        return dimension.link(self.dim, self.local)


def _slowest_even(groups: list[dict[str, Any]], lags: dict[str, dict[int, float]]
                  ) -> dict[str, Any] | None:
    """The slowest group FACTOR x slower than its own pace with no local rank behind (a rank
    behind is the straggler rules' to name)."""
    slowed = [g for g in groups if not g["stalled"] and g["gap"] and g["gap"]["ratio"]
              and g["gap"]["ratio"] >= FACTOR]
    even = [g for g in slowed
            if max(lags.get(g["pg"], {}).values(), default=0.0)
            < LAG_SHARE * g["gap"]["recent_seconds"]]
    return max(even, key=lambda g: g["gap"]["ratio"]) if even else None


def _read(job_id: str, group: dict[str, Any]) -> _Slowed:
    gap = group["gap"]
    dim = group.get("dimension", "")
    name = group["pg"] + (f" ({dim})" if dim else "")
    text = (f"job {job_id} runs {gap['ratio']:.1f}x slower than its own pace: group {name} "
            f"enqueues a collective every {gap['recent_seconds']:.2f} s, every "
            f"{gap['baseline_seconds']:.2f} s before, and every local rank enters them on time")
    added = gap.get("added_inside_share")
    if added is not None:
        text += (f"; its ranks had a collective in flight in {gap['inside_share']:.0%} of their "
                 f"status reports over the last {RATE_WINDOW:.0f} s, "
                 f"{gap['inside_share_before']:.0%} before: {added:.0%} of the added time is "
                 "spent inside the collectives")
    local = group.get("size") is not None and group["size"] <= len(group.get("local_ranks", ()))
    return _Slowed(text, added, local, dim)


def _lossy(slowed: _Slowed, loss: Loss | None) -> str | None:
    """TCP loss explains it unless the ranks are shown to wait before their collectives."""
    if not (loss is not None and loss.share >= LOSS_SHARE
            and loss.retransmitted >= MIN_RETRANSMITTED
            and (slowed.added is None or slowed.added > OUTSIDE)):
        return None
    return (f"{slowed.text}; {loss.share:.1%} of the TCP segments sent in the network namespace "
            f"of {loss.netns} were retransmitted over the last {loss.seconds:.0f} s "
            f"({loss.retransmitted} of {loss.sent}): suspect {slowed.between} (a lossy or "
            "congested link), not a rank")


def _waits_inside(slowed: _Slowed) -> str | None:
    """The added time is spent inside the collectives: a slow link even without loss."""
    if not (slowed.added is not None and slowed.added >= INSIDE):
        return None
    return (f"{slowed.text}, waiting for data, not before them: suspect {slowed.between} (a slow "
            "or congested link; no TCP loss seen), not a rank here or the input pipeline"
            + ("; a rank on another node that entered late would be named by its own "
               "node's daemon and the straggler rule" if not slowed.local else ""))


def _late_together(slowed: _Slowed) -> str | None:
    """The added time is spent before the collectives: what every rank does between them."""
    if not (slowed.added is not None and slowed.added <= OUTSIDE):
        return None
    return (f"{slowed.text}, the rest before them, every rank late together: suspect what they "
            "all do between collectives (the input pipeline, the step's compute, every GPU's "
            "clocks), not the network" + ("" if slowed.local else
            "; this node's ranks only: if the other nodes' ranks wait inside the collectives,"
            " the ranks here are the late ones (the straggler rule compares them)"))


def verdict(job_id: str, groups: list[dict[str, Any]], lags: dict[str, dict[int, float]],
            loss: Loss | None) -> dict[str, Any] | None:
    """The job's slowest group if it runs FACTOR x slower than its own pace with no local rank
    behind, with the cause when TCP loss or where the ranks wait explains it (`cause` None
    otherwise)."""
    group = _slowest_even(groups, lags)
    if group is None:
        return None
    slowed = _read(job_id, group)
    cause = _lossy(slowed, loss) or _waits_inside(slowed) or _late_together(slowed)
    return {"pg": group["pg"], "gap": group["gap"], "tcp": loss.json() if loss else None,
            "summary": cause or f"{slowed.text}: a rank on another node, or something all "
                                "ranks share (the network, the input pipeline, every GPU's "
                                "clocks)",
            "cause": cause}
