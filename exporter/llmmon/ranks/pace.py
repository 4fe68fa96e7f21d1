"""How long a process group may go without completing before it is stalled: from its own pace.

A fixed window is wrong both ways: 60 s is 300 steps of a 0.2 s-step job and less than two
steps of a 40 s-step one.  The gaps between the group's consecutive collectives (their enqueue
times in the Flight Recorder) and the ranks' step times say how long this job normally goes
quiet; a group is stalled after `factor` times the 99th percentile of either (NVRx's 5x
safety factor), never sooner than `floor` and never later than `ceiling`.  Until enough gaps
are known (a job's first steps, warm-up, compilation), the ceiling applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from llmmon.ranks.ledger import RankTrack
from llmmon.ranks.validate import Steps

MIN_SAMPLES = 20
MAX_GAPS = 512  # newest gaps per rank and group


@dataclass(frozen=True)
class Pace:
    threshold: float
    basis: str  # learned or ceiling
    gap_p99: float | None
    step_p99: float | None
    samples: int

    def json(self) -> dict[str, object]:
        return {"threshold_seconds": round(self.threshold, 3), "basis": self.basis,
                "gap_p99_seconds": _round(self.gap_p99), "step_p99_seconds": _round(self.step_p99),
                "gaps": self.samples}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _p99(values: list[float]) -> float:
    values = sorted(values)
    return values[int(0.99 * (len(values) - 1))]


def timed_gaps(track: RankTrack, pg: str) -> list[tuple[float, float]]:
    """(Unix time of the later enqueue, seconds since the one before) for consecutive
    collectives of `pg` on this rank, oldest first; kept until the rank's index of the group
    changes (a new ring read: every 20 s, while the daemon judges every 5 s)."""
    seqs = track.index.get(pg, {})
    version = (len(seqs), next(reversed(seqs), -1))  # insertion order: the newest read last
    cached = track.timed.get(pg)
    if cached is not None and cached[0] == version:
        return cached[1]
    ordered = sorted(seqs)
    found = [(seqs[b].created_ns / 1e9, (seqs[b].created_ns - seqs[a].created_ns) / 1e9)
             for a, b in zip(ordered, ordered[1:]) if b == a + 1]
    track.timed[pg] = (version, found)
    return found


def gaps(track: RankTrack, pg: str) -> list[float]:
    """Seconds between the enqueue of consecutive collectives of `pg` on this rank (newest)."""
    return [gap for _, gap in timed_gaps(track, pg)[-MAX_GAPS:]]


def step_p99(steps: Steps | None) -> float | None:
    """The bucket bound holding the 99th percentile step time (None: too few, or +Inf)."""
    if steps is None or sum(steps.counts) < MIN_SAMPLES:
        return None
    target, running = 0.99 * sum(steps.counts), 0
    for bound, count in zip(steps.buckets, steps.counts):
        running += count
        if running >= target:
            return bound
    return None


def pace(members: Iterable[RankTrack], pg: str, floor: float, ceiling: float,
         factor: float) -> Pace:
    members = list(members)
    pooled = [gap for track in members for gap in gaps(track, pg)]
    gap = _p99(pooled) if len(pooled) >= MIN_SAMPLES else None
    step = max((s for s in (step_p99(t.state.steps) for t in members) if s is not None),
               default=None)
    known = [v for v in (gap, step) if v is not None]
    if not known:
        return Pace(ceiling, "ceiling", None, None, len(pooled))
    return Pace(min(ceiling, max(floor, factor * max(known))), "learned", gap, step,
                len(pooled))
