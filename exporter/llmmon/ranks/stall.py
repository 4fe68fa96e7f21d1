"""Hang evidence: per job and process group, who waits, in which collective, and who is behind.

The rule (PyTorch Flight Recorder, NVRx's fr_attribution): ranks of a group that enqueued the
oldest collective the group has not completed are waiting in it; a rank whose last enqueued
sequence number is below it never entered it — the culprit.  A node only sees its own ranks:
when every local member waits, the rank behind is on another node.

Each rule is a small function; `judge` applies them to the ledger and returns typed verdicts
(`GroupVerdict`, `RankView`, `JobEvidence`).  The /api/v1/ranks document (`.json()`), the
summary sentence and the collector's metric families are views of those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Any, Mapping

from llmmon.ranks import culprit, desync, dimension, ending, pace, slowdown, stacks, waitfor
from llmmon.ranks.culprit import Doing
from llmmon.ranks.discover import SEEN_FROM_OUTSIDE
from llmmon.ranks.ending import End
from llmmon.ranks.ledger import Ledger, RankTrack
from llmmon.ranks.liveness import PidWatch, Process
from llmmon.ranks.netns import TcpWatch
from llmmon.ranks.validate import Group, Progress, RankState
from llmmon.ranks.spans import join_spans, spans_text

BUSY_WINDOW = 60.0  # seconds of activity shown per rank in /api/v1/ranks
# A group's frontier collective is exported per rank (what each issued) once it has waited this
# long, or its job ended with it in flight: a healthy job completes it in far less.
ISSUED_AFTER = 5.0


@dataclass(frozen=True)
class StallThresholds:
    """When a rank is down and a group stalled: `stall_after` is the ceiling; below it the
    threshold is learned from the job's pace (llmmon.ranks.pace)."""

    stale_after: float
    stall_after: float
    stall_floor: float = 10.0
    stall_factor: float = 5.0


def group_ranks(group: Group) -> str:
    """A group's ranks as a label value; ',...' when the spool listed more spans than kept."""
    return join_spans(group.ranks) + (",..." if group.spans_cut else "")


# The rules ----------------------------------------------------------------------------------

def frontier(progress: Mapping[int, Progress], held: AbstractSet[int]) -> int:
    """The oldest sequence number the group has not completed.  A stale, stopped or vanished
    rank (`held`) reported long ago: the others may have completed more since, so the frontier
    is that of the ranks that still report (the silent one is behind it)."""
    fresh = [r for r in progress if r not in held] or list(progress)
    return min(progress[r].completed for r in fresh) + 1


def waiting_ranks(progress: Mapping[int, Progress], seq: int) -> tuple[int, ...]:
    """Ranks that enqueued collective `seq` and have not completed it."""
    return tuple(sorted(r for r, p in progress.items() if p.enqueued >= seq > p.completed))


def behind_ranks(progress: Mapping[int, Progress], seq: int) -> tuple[int, ...]:
    """Ranks that never enqueued collective `seq` while another waits in it: the culprits.
    While nobody waits, a rank behind is just idle: none is named."""
    if not waiting_ranks(progress, seq):
        return ()
    return tuple(sorted(r for r, p in progress.items() if p.enqueued < seq))


def stalled_for(no_progress: float, waited: float | None, since_enqueue: float) -> float:
    """How long the group has been stuck: the daemon's own observation, or how long the oldest
    outstanding collective has waited (known even right after a daemon restart); but never
    longer than since a member last enqueued something: a rank that just caught up (after a
    checkpoint) is progress, its collective completes at the next reports."""
    return min(max(no_progress, waited or 0.0), since_enqueue)


def behind_remote(behind: tuple[int, ...], stopped: tuple[int, ...],
                  found: dict[str, Any] | None, meta: Group | None, local: int) -> bool:
    """Every local member waits, none stopped, no desync, and the group has ranks this node
    does not follow: the rank behind is on another node, whose daemon sees whether it is hung
    or busy (a checkpoint); this one calls the group stalled only at the ceiling."""
    return (not behind and not stopped and not found
            and bool(meta and meta.size and meta.size > local))


def inflight_stalled(stuck: float, threshold: float, ceiling: float, *,
                     live_waiters: bool, excused: bool, ended: bool) -> bool:
    """A group that waits in a collective is stalled past the learned `threshold`, unless its
    job ended (an end, not a hang) or no waiting rank still reports or is stopped (gone, not
    hung); a busy rank behind, or one on another node (`excused`), is given until the
    `ceiling`."""
    return (not ended and stuck >= threshold and live_waiters
            and (not excused or stuck >= ceiling))


def quiet_stalled(quiet: float, threshold: float, busy: tuple[int, ...]) -> bool:
    """Nothing in flight and the job's ranks here quiet on every group past the `threshold`:
    each is stuck before its next collective (a one-rank job's loader, a dead file system under
    every rank), or frozen; a rank that works (an evaluation, a checkpoint) holds it off."""
    return bool(quiet) and quiet >= threshold and not busy


# The verdicts -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outstanding:
    """The collective ranks wait in: the group's frontier."""

    seq: int
    coll: str | None  # as the first member that indexed it issued it; None: none did
    waiting_seconds: float | None  # since its first enqueue here, to the ms

    def json(self) -> dict[str, Any]:
        return {"seq": self.seq, "coll": self.coll, "waiting_seconds": self.waiting_seconds}


@dataclass(frozen=True)
class GroupVerdict:
    """Whether a process group of a job is stalled here, and who is to blame.  Seconds are kept
    to the millisecond: the API, the metrics and the sentence show the same number."""

    job_id: str
    pg: str
    meta: Group | None  # the reporters' (or Flight Recorder's) description of the group
    progress: Mapping[int, Progress]  # local member -> its sequence numbers in the group
    frontier: int
    waiting: tuple[int, ...]
    behind: tuple[int, ...]
    stale: tuple[int, ...]
    stopped: tuple[int, ...]
    busy: tuple[int, ...]  # behind and working, or quiet and working: given the ceiling
    elsewhere: Mapping[int, str]  # never enqueued it, as they wait inside another operation
    remote: bool  # the rank behind is on another node
    outstanding: Outstanding | None  # while a rank waits
    issued: Mapping[int, str]  # rank -> what it issued at the frontier, once that is exported
    desync: dict[str, Any] | None  # llmmon.ranks.desync.find
    last_progress: float | None  # Unix time a member last completed something
    no_progress_seconds: float
    stalled_seconds: float
    quiet_seconds: float
    quiet_ranks: tuple[int, ...]
    pace: pace.Pace
    gap: slowdown.GroupPace | None
    threshold_seconds: float
    ceiling_seconds: float
    stalled: bool
    doing: Mapping[int, Doing]  # the ranks the sentence names, with what they do
    said: Mapping[int, str]  # ... in words
    end: dict[str, Any] | None  # the job's end (llmmon.ranks.ending.verdict)

    @property
    def last_completed(self) -> int:
        return self.frontier - 1

    @property
    def ranks_label(self) -> str:
        return group_ranks(self.meta) if self.meta else ""

    @property
    def spans_nodes(self) -> bool:
        """The group has ranks this node does not follow."""
        return bool(self.meta and self.meta.size and self.meta.size > len(self.progress))

    def json(self) -> dict[str, Any]:
        """The group's entry of /api/v1/ranks."""
        meta, ordered = self.meta, sorted(self.progress.items())
        return {
            "job_id": self.job_id, "pg": self.pg, "pg_desc": meta.desc if meta else "",
            "dimension": dimension.of(meta.desc) if meta else "",
            "size": meta.size if meta else None,
            "ranks": self.ranks_label,
            "local_ranks": sorted(self.progress),
            "enqueued": {str(r): p.enqueued for r, p in ordered},
            "completed": {str(r): p.completed for r, p in ordered},
            "last_completed": self.last_completed,
            "waiting": list(self.waiting),
            "behind": list(self.behind),
            "stale": list(self.stale),
            "stopped": list(self.stopped),
            "busy": list(self.busy),
            "elsewhere": {str(r): where for r, where in self.elsewhere.items()},
            "remote": self.remote,
            "op": None if self.outstanding is None else self.outstanding.json(),
            "issued": {str(r): s for r, s in self.issued.items()},
            "desync": self.desync,
            "last_progress": self.last_progress,
            "no_progress_seconds": self.no_progress_seconds,
            "stalled_seconds": self.stalled_seconds,
            "quiet_seconds": self.quiet_seconds,
            "quiet_ranks": list(self.quiet_ranks),
            "pace": self.pace.json(),
            "gap": None if self.gap is None else self.gap.json(),
            "stall_threshold_seconds": self.threshold_seconds,
            "stall_ceiling_seconds": self.ceiling_seconds,
            "stalled": self.stalled,
            "doing": {str(r): d.json() for r, d in self.doing.items()},
            "summary": self.summary(),
        }

    def summary(self) -> str:
        """One sentence an SRE can act on."""
        head = f"job {self.job_id}, group {self.pg}"
        if self.meta and self.meta.desc:
            head += f" ({self.meta.desc})"
        found = self.desync
        if self.end is not None:
            return f"{head}: not a hang: {self.end['summary']}" + (
                desync.text(found) if found else "")
        if self.outstanding is None and self.quiet_seconds >= self.threshold_seconds:
            return _quiet_summary(head, self)
        if self.outstanding is None:
            return f"{head}: nothing in flight (last completed #{self.last_completed})"
        return _waiting_summary(head, self, self.outstanding)


def _waiting_summary(head: str, group: GroupVerdict, op: Outstanding) -> str:
    """Who waits in which collective, who is behind or stopped, and why it is (not) stalled."""
    name = f"{op.coll or 'collective'} #{op.seq}"
    verb = "wait" if len(group.waiting) > 1 else "waits"
    text = (f"{head}: ranks {spans_text(list(group.waiting))} {verb} in {name} for "
            f"{group.stalled_seconds:.0f} s")
    if len(group.waiting) == 1:
        text = text.replace("ranks ", "rank ", 1)
    if group.behind:
        text += "; " + "; ".join(
            f"rank {r} never enqueued it (last enqueued #{group.progress[r].enqueued})"
            + (f": {group.said[r]}" if group.said.get(r) else "") for r in group.behind)
    if group.elsewhere:
        text += "; " + "; ".join(f"rank {r} waits elsewhere, in {where}"
                                 for r, where in group.elsewhere.items())
    elif group.behind or group.stopped or group.desync:
        pass  # named below
    elif group.spans_nodes:
        text += (f"; every rank on this node enqueued it: the rank behind is on another node "
                 f"(group ranks {group.ranks_label})")
    elif group.stalled:
        text += "; every rank enqueued it and none completes: suspect the GPU or the network"
    for rank in group.stopped:
        if rank not in group.behind:
            text += f"; rank {rank} {group.said.get(rank) or 'is stopped'}".replace(
                " it is ", " is ", 1)
    if group.desync:
        text += desync.text(group.desync)
    if group.stale:
        text += f"; rank(s) {spans_text(list(group.stale))} stopped reporting"
    return text if group.stalled else text + _window_clause(group)


def _window_clause(group: GroupVerdict) -> str:
    """Why a group that waits is not stalled yet: the window it gets, and who gets the
    ceiling."""
    ceiling = f"{group.ceiling_seconds:.0f} s"
    return (f" (still within the stall window: {group.threshold_seconds:.0f} s, "
            f"{group.pace.basis}"
            + (f"; busy ranks get {ceiling}" if group.busy else "")
            + (f"; a rank behind on another node gets {ceiling} here: its own node's daemon "
               "judges it at the learned threshold" if group.remote else "") + ")")


def _quiet_summary(head: str, group: GroupVerdict) -> str:
    """A group with nothing in flight whose ranks here have enqueued nothing for too long."""
    if not group.quiet_ranks:
        return (f"{head}: nothing in flight (last completed #{group.last_completed}); its ranks "
                "here wait inside other groups' operations (see the job's verdict)")
    stopped = "stopped or " if group.stopped else ""
    text = (f"{head}: nothing in flight, and no rank here enqueued a collective of any group "
            f"for {group.quiet_seconds:.0f} s (last completed #{group.last_completed}; "
            f"the job's pace allows {group.threshold_seconds:.0f} s): every rank here "
            f"is {stopped}stuck before its next collective")
    for rank in group.quiet_ranks:
        said = group.said.get(rank) or "it is outside any collective"
        text += f"; rank {rank} {said}".replace(" it is ", " is ", 1)
    if group.spans_nodes:
        text += (f" (group ranks {group.ranks_label}: a rank of another node that waits inside "
                 "a collective for these is named by its own daemon, with these behind)")
    if not group.stalled:
        text += (" (not called stalled while a rank here works: an evaluation or a checkpoint "
                 "without collectives)")
    return text


@dataclass(frozen=True)
class RankProgress:
    """A rank's sequence numbers in one group, with what the daemon noted of them."""

    progress: Progress
    last_progress: float | None  # Unix time the daemon saw its completed number change
    inflight_age: float  # seconds since its oldest uncompleted collective was enqueued


@dataclass(frozen=True)
class RankView:
    """A rank as of one read: its report, its end and what it does (the ledger moves on)."""

    state: RankState
    up: bool
    end: End | None
    report_age: float
    doing: Doing  # over the last BUSY_WINDOW seconds
    groups: Mapping[str, RankProgress]

    @property
    def rank(self) -> int:
        return self.state.identity.rank

    @property
    def alive(self) -> bool:
        return self.end is None

    def json(self) -> dict[str, Any]:
        """The rank's entry of /api/v1/ranks."""
        state, who, health = self.state, self.state.identity, self.state.health
        return {
            "rank": who.rank, "local_rank": who.local_rank, "world_size": who.world_size,
            "pod": who.pod, "namespace": who.namespace, "pid": who.pid, "uuid": who.uuid,
            "gpu_name": who.gpu_name, "allocator_config": who.allocator_config,
            "up": self.up,
            "alive": self.alive,
            "exit": self.end.json() if self.end else None,
            "report_age_seconds": round(self.report_age, 3),
            "reporter": {"errors_total": health.errors_total, "disabled": health.disabled,
                         "disabled_reason": health.disabled_reason,
                         "last_error": health.last_error, "fr_api": health.fr_api},
            "memory": state.memory,
            "steps": state.steps.steps if state.steps else None,
            "doing": self.doing.json(),
            "stack": [f._asdict() for f in state.stack] if state.stack else None,
            "blocked": [w._asdict() for w in state.blocked],
            "groups": {
                pg: {"enqueued": g.progress.enqueued, "started": g.progress.started,
                     "completed": g.progress.completed, "last_progress": g.last_progress,
                     "oldest_inflight_age_seconds": round(g.inflight_age, 3)}
                for pg, g in self.groups.items()},
        }


@dataclass(frozen=True)
class JobVerdict:
    """One verdict per job, whatever the number of its groups: the root ranks (waiting on
    nothing, with what they do), every other rank's wait, or the cycle they wait in."""

    job_id: str
    stalled: bool
    roots: tuple[int, ...]
    graph: waitfor.Graph
    said: Mapping[int, str]  # root -> what it does, in words
    groups_of: Mapping[int, str]  # root -> its groups, in words
    fallback: str  # a stalled group's own sentence, where the graph names no root
    quiet: float  # seconds no rank here enqueued anything, when that is what stalled the job
    lead: str = ""  # what stalled the job, said before the roots (the stacks' verdict)

    def json(self) -> dict[str, Any]:
        return {"stalled": self.stalled, "roots": list(self.roots),
                "cycle": list(self.graph.cycle), "remote": self.graph.remote,
                "waits": [w.json() for ws in self.graph.waits.values() for w in ws],
                "summary": self.summary()}

    def summary(self) -> str:
        """`rank 1 (dp group 2 {1,3}, tp group 3 {0-1}) is in stuck_forever (job.py:70), no
        CPU for 40 s; rank 0 waits in tp all_reduce #6 (group 3) for rank 1; ...`; empty while
        the job is not stalled."""
        if not self.stalled:
            return ""
        head = f"job {self.job_id}: {self.lead}"
        roots = [f"rank {r} ({self.groups_of[r]}) " + (self.said.get(r) or "waits on nothing")
                 .replace("it is ", "is ", 1) for r in self.roots]
        waits = self._waits_text()
        if roots and self.quiet and not waits:
            head += (f"nothing in flight, and no rank here enqueued a collective of any group "
                     f"for {self.quiet:.0f} s: every rank here is stuck before its next "
                     "collective; ")
        if roots:
            return head + "; ".join(roots + waits)
        if self.graph.cycle:
            ring = ", ".join(str(r) for r in self.graph.cycle)
            return (head + f"ranks {ring} wait on each other, each inside another group's "
                    "operation: a deadlock of the program's order; " + "; ".join(waits))
        return self.fallback or head + "; ".join(waits)

    def _waits_text(self) -> list[str]:
        """`ranks 0–2 wait in tp all_reduce #6 (group 3) for rank 1`, one clause per
        operation and ranks waited on; a rank waited on that waits too is marked so (it is
        not blamed)."""
        alike: dict[tuple[str, tuple[int, ...], bool], list[int]] = {}
        for rank, waits in self.graph.waits.items():
            if rank not in self.roots:
                wait = waits[0]
                alike.setdefault((wait.where, wait.on, wait.remote), []).append(rank)
        clauses = []
        for (where, on, remote), ranks in alike.items():
            targets = [f"rank {r}" + ("" if r in self.roots else " (waiting too)") for r in on]
            if remote:
                targets.append("ranks on other nodes")
            who = f"ranks {spans_text(ranks)} wait" if len(ranks) > 1 else f"rank {ranks[0]} waits"
            clauses.append(f"{who} in {where}" + (f" for {', '.join(targets)}" if targets
                                                    else ", which every member entered"))
        return clauses


@dataclass(frozen=True)
class JobEvidence:
    """One job's ranks on this node, the verdict on each of its groups, and how it ended."""

    job_id: str
    ranks: tuple[RankView, ...]
    groups: tuple[GroupVerdict, ...]
    end: dict[str, Any] | None  # llmmon.ranks.ending.verdict
    enqueue_lag: Mapping[str, Mapping[int, float]]  # pg -> rank -> seconds late
    slowdown: dict[str, Any] | None  # llmmon.ranks.slowdown.verdict
    verdict: JobVerdict
    stacks: stacks.StackVerdict | None = None  # ranks seen from outside only (no reporter)

    @property
    def stalled_groups(self) -> list[str]:
        return [g.pg for g in self.groups if g.stalled]

    def json(self) -> dict[str, Any]:
        return {"job_id": self.job_id,
                "ranks": [r.json() for r in self.ranks],
                "groups": [g.json() for g in self.groups],
                "end": self.end,
                "enqueue_lag": {pg: {str(r): v for r, v in lag.items()}
                                for pg, lag in self.enqueue_lag.items()},
                "slowdown": self.slowdown,
                "stalled_groups": self.stalled_groups,
                "stacks": None if self.stacks is None else self.stacks.json(),
                "verdict": self.verdict.json()}


@dataclass(frozen=True)
class Evidence:
    """The hang evidence of every job on this node as of `generated_at`."""

    generated_at: float
    limits: StallThresholds
    jobs: tuple[JobEvidence, ...]

    def json(self) -> dict[str, Any]:
        """The document /api/v1/ranks serves and `llmmon diagnose --ranks` reads."""
        limits = self.limits
        return {"generated_at": self.generated_at, "stale_after_seconds": limits.stale_after,
                "stall_after_seconds": limits.stall_after,
                "stall_floor_seconds": limits.stall_floor, "stall_factor": limits.stall_factor,
                "jobs": [job.json() for job in self.jobs]}


# Applying the rules -------------------------------------------------------------------------

@dataclass
class _Job:
    """One job's ranks on this node with what the daemon knows of their processes."""

    tracks: list[RankTrack]
    processes: dict[int, Process | None]
    end: dict[str, Any] | None

    @classmethod
    def of(cls, job_id: str, tracks: list[RankTrack], watch: PidWatch | None) -> _Job:
        processes = {_rank(t): None if watch is None else watch.get((job_id, _rank(t), t.pid))
                     for t in tracks}
        ends = [e for e in (ending.end_of(t, processes[_rank(t)]) for t in tracks)
                if e is not None]
        return cls(tracks, processes, ending.verdict(
            job_id, [_rank(t) for t in tracks], ends,
            lambda end: desync.behind_abort(tracks, end)))

    def quiet(self, now: float) -> float:
        """Seconds since any of its ranks here enqueued or completed a collective of any
        group: a group used only at start-up is not quiet while another one progresses."""
        noted = [n for t in self.tracks for pg in t.state.progress
                 for n in (t.last_progress(pg), t.last_enqueue(pg)) if n is not None]
        return now - max(noted, default=now)

    def doing(self, track: RankTrack, now: float, window: float,
              limits: StallThresholds) -> Doing:
        return culprit.doing(track, self.processes[_rank(track)], now, window,
                             limits.stale_after)

    def end_of(self, track: RankTrack) -> End | None:
        return ending.end_of(track, self.processes[_rank(track)])

    def report_age(self, rank: int, now: float) -> float:
        return next(t.age(now) for t in self.tracks if _rank(t) == rank)


def _rank(track: RankTrack) -> int:
    return track.state.identity.rank


def _held(job: _Job, members: list[RankTrack], stale: tuple[int, ...], now: float,
          limits: StallThresholds) -> set[int]:
    """Members whose last report is old: stale, stopped (SIGSTOP) or vanished."""
    frozen = {_rank(t) for t in members if job.doing(t, now, 1.0, limits).stopped}
    gone = {_rank(t) for t in members
            if (end := job.end_of(t)) is not None and end.how == "vanished"}
    return frozen | gone | set(stale)


def _inflight(job: _Job, members: list[RankTrack], pg: str, seq: int, last: float | None,
              now: float) -> tuple[Outstanding, float, dict[str, Any] | None, dict[int, str]]:
    """The collective `seq` ranks wait in; how long the group is stuck (`stalled_for`); a
    desync at it; and what each rank issued there, once that is exported (ISSUED_AFTER)."""
    issued = {_rank(t): entry for t in members
              if (entry := t.index.get(pg, {}).get(seq)) is not None}
    waited = now - min(e.created_ns for e in issued.values()) / 1e9 if issued else None
    entered = max((t.last_enqueue(pg) or 0.0 for t in members), default=0.0)
    stuck = stalled_for(now - (now if last is None else last), waited, now - entered)
    found = desync.find(seq, issued, desync.before(members, pg, seq))
    first = next(iter(issued.values()), None)
    op = Outstanding(seq, first.coll if first else None,
                     None if waited is None else round(waited, 3))
    shown = stuck >= ISSUED_AFTER or job.end is not None
    return op, stuck, found, ({r: desync.compared(e) for r, e in sorted(issued.items())}
                              if shown else {})


@dataclass(frozen=True)
class _Standing:
    """Where a group stands before blame is laid: its members here and their positions."""

    members: list[RankTrack]
    meta: Group | None
    progress: dict[int, Progress]
    stale: tuple[int, ...]
    seq: int  # the frontier
    last_progress: float | None
    op: Outstanding | None
    stuck: float  # stalled_for
    found: dict[str, Any] | None
    issued: dict[int, str]
    doing: dict[int, Doing]  # over `window`: max(stuck, 1 s)
    window: float


def _standing(job: _Job, pg: str, now: float, limits: StallThresholds) -> _Standing:
    members = [t for t in job.tracks if pg in t.state.progress]
    progress = {_rank(t): t.state.progress[pg] for t in members}
    stale = tuple(sorted(_rank(t) for t in members if t.age(now) > limits.stale_after))
    seq = frontier(progress, _held(job, members, stale, now, limits))
    last = max((n for n in (t.last_progress(pg) for t in members) if n is not None),
               default=None)
    op, stuck, found, issued = (_inflight(job, members, pg, seq, last, now)
                                if waiting_ranks(progress, seq) else (None, 0.0, None, {}))
    window = max(stuck, 1.0)
    return _Standing(members,
                     next((t.groups()[pg] for t in members if pg in t.groups()), None),
                     progress, stale, seq, last, op, stuck, found, issued,
                     {_rank(t): job.doing(t, now, window, limits) for t in members}, window)


def _quiet(job: _Job, st: _Standing, now: float) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
    """With nothing of the group in flight: how long the job's ranks here have been quiet, the
    ranks that count (still reporting, or stopped: silent and unseen ones are gone, not hung)
    and those of them that work (outside collectives: an evaluation, not a hang)."""
    present = tuple(r for r in st.progress if r not in st.stale or st.doing[r].stopped)
    quiet = job.quiet(now) if st.op is None and job.end is None and present else 0.0
    if not quiet:
        return 0.0, (), ()
    return quiet, present, tuple(r for r in present if st.doing[r].busy)


def _verdict(job_id: str, job: _Job, pg: str, now: float, limits: StallThresholds,
             graph: waitfor.Graph) -> GroupVerdict:
    """The rules applied to group `pg` of a job: where it stands, then who is to blame.  A rank
    behind here that waits inside another group's operation (`graph`) is not to blame here."""
    st = _standing(job, pg, now, limits)
    waiting = waiting_ranks(st.progress, st.seq)
    behind, elsewhere = _behind(st, pg, graph)
    stopped = tuple(sorted(r for r, d in st.doing.items() if d.stopped))
    learned = pace.pace(st.members, pg, limits.stall_floor, limits.stall_after,
                        limits.stall_factor)
    busy = tuple(r for r in behind if st.doing[r].busy)
    remote = st.op is not None and not elsewhere and behind_remote(
        behind, stopped, st.found, st.meta, len(st.progress))
    quiet, present, idle_busy = _quiet(job, st, now)
    quiet_ranks = tuple(r for r in present if not graph.waiting(r))
    stalled = st.op is not None and inflight_stalled(
        st.stuck, learned.threshold, limits.stall_after, excused=bool(busy or remote),
        live_waiters=bool(set(waiting) - set(st.stale) or stopped), ended=job.end is not None)
    named = tuple(dict.fromkeys(behind + stopped)) if st.op else quiet_ranks
    last = st.last_progress
    return GroupVerdict(
        job_id=job_id, pg=pg, meta=st.meta, progress=st.progress, frontier=st.seq,
        waiting=waiting, behind=behind, stale=st.stale, stopped=stopped,
        busy=busy or idle_busy, elsewhere=elsewhere, remote=remote, outstanding=st.op,
        issued=st.issued, desync=st.found, last_progress=last,
        no_progress_seconds=round(now - (now if last is None else last), 3),
        stalled_seconds=round(st.stuck, 3), quiet_seconds=round(quiet, 3),
        quiet_ranks=quiet_ranks, pace=learned, gap=slowdown.group_pace(st.members, pg, now),
        threshold_seconds=round(learned.threshold, 3), ceiling_seconds=limits.stall_after,
        stalled=stalled or bool(quiet_ranks) and quiet_stalled(quiet, learned.threshold,
                                                               idle_busy),
        doing={r: st.doing[r] for r in named},
        said={r: st.doing[r].text(st.window, job.report_age(r, now)) for r in named},
        end=job.end)


def _behind(st: _Standing, pg: str, graph: waitfor.Graph
            ) -> tuple[tuple[int, ...], dict[int, str]]:
    """The ranks behind in group `pg` to blame, and those that are behind as they wait inside
    another group's operation (with where)."""
    elsewhere = {r: other[0].where for r in behind_ranks(st.progress, st.seq)
                 if (other := [w for w in graph.waits.get(r, ()) if w.pg != pg])}
    return tuple(r for r in behind_ranks(st.progress, st.seq) if r not in elsewhere), elsewhere


def _graph(job: _Job, pgs: list[str]) -> waitfor.Graph:
    """The job's waits on this node: collectives in flight by the Flight Recorder, and what
    the frames of the ranks show them blocked in where it shows nothing.  A CPU rank whose
    frames show its thread outside torch waits on nothing: what it has in flight is
    asynchronous, and it is stuck before waiting on it.  A GPU rank's thread blocked in a CUDA
    synchronisation (`.item()`) looks the same from its frames, so its recorder's waits stand."""
    waits: list[waitfor.Wait] = []
    outside = {_rank(t) for t in job.tracks if not t.state.identity.uuid
               and not t.state.blocked and culprit.outside_torch(t.state.stack)}
    for pg in pgs:
        members = [t for t in job.tracks if pg in t.state.progress]
        progress = {_rank(t): t.state.progress[pg] for t in members}
        issued = {_rank(t): entry.coll for t in members
                  if (entry := t.index.get(pg, {}).get(progress[_rank(t)].completed + 1))}
        meta = next((t.groups()[pg] for t in members if pg in t.groups()), None)
        waits += [w for w in waitfor.collective_waits(pg, meta, progress, issued)
                  if w.rank not in outside]
    recorded: dict[int, set[str]] = {}
    for wait in waits:
        recorded.setdefault(wait.rank, set()).add(wait.pg)
    for track in job.tracks:
        if track.state.blocked:
            waits += waitfor.frame_waits(_rank(track), track.state.blocked, track.groups(),
                                         recorded.get(_rank(track), ()))
    return waitfor.graph(waits, [_rank(t) for t in job.tracks])


def judge(ledger: Ledger, now: float, limits: StallThresholds, watch: PidWatch | None = None,
          tcp: TcpWatch | None = None,
          seen: Mapping[str, stacks.StackVerdict] | None = None) -> Evidence:
    """The verdicts on every job the ledger follows (`tcp`: the job's TCP loss, for the cause
    of an even slowdown; `seen`: the stack verdicts of jobs whose ranks run without the
    reporter)."""
    jobs = ledger.jobs().items()
    return Evidence(now, limits, tuple(
        _job_evidence(ledger, job_id, tracks, now, limits, watch, tcp, (seen or {}).get(job_id))
        for job_id, tracks in jobs))


def _job_evidence(ledger: Ledger, job_id: str, tracks: list[RankTrack], now: float,
                  limits: StallThresholds, watch: PidWatch | None,
                  tcp: TcpWatch | None, seen: stacks.StackVerdict | None) -> JobEvidence:
    job = _Job.of(job_id, tracks, watch)
    pgs = sorted({pg for t in tracks for pg in t.state.progress})
    graph = _graph(job, pgs)
    groups = tuple(_verdict(job_id, job, pg, now, limits, graph) for pg in pgs)
    up = [t for t in tracks if t.age(now) <= limits.stale_after]
    lags = {pg: lag for pg in pgs
            if (lag := ledger.enqueue_lag([t for t in up if pg in t.state.progress], pg))}
    loss = tcp.loss(job_id, now, slowdown.WINDOW) if tcp else None
    ranks = tuple(_rank_view(job, t, now, limits) for t in tracks)
    slow = None if job.end else slowdown.verdict(job_id, [g.json() for g in groups], lags, loss)
    outside_only = all(t.state.health.fr_api == SEEN_FROM_OUTSIDE for t in tracks)
    if seen is not None and outside_only:  # no rank here has a reporter: the stacks judge
        return JobEvidence(job_id, ranks, groups, job.end, lags, slow,
                           _stack_job_verdict(job_id, job, seen, now, limits), seen)
    return JobEvidence(job_id, ranks, groups, job.end, lags, slow,
                       _job_verdict(job_id, job, groups, graph, now, limits))


def _stack_job_verdict(job_id: str, job: _Job, seen: stacks.StackVerdict, now: float,
                       limits: StallThresholds) -> JobVerdict:
    """The job's one verdict from its ranks' stacks: the roots with what they do, the others
    waiting in the operation their frames show (on the roots, or off this node)."""
    stalled = seen.stalled and job.end is None
    roots = seen.roots if stalled else ()
    waits = [waitfor.Wait(rank, "", "", op if op != stacks.INSIDE_TORCH else
                          "torch (in no collective its frames name)", roots, not roots, "stack")
             for rank, op in sorted(seen.waits.items()) if rank not in roots]
    graph = waitfor.graph(waits if stalled else (), [_rank(t) for t in job.tracks])
    window = max(seen.unchanged, 1.0)
    tracks = {_rank(t): t for t in job.tracks}
    said = {r: job.doing(tracks[r], now, window, limits).text(window, job.report_age(r, now))
            for r in roots if r in tracks}
    fallback = ""
    if stalled and seen.symmetric:
        fallback = (f"job {job_id}: every rank here has waited in {seen.symmetric} for "
                    f"{seen.unchanged:.0f} s, its stack unchanged, and none is outside it: a "
                    "symmetric stall. The rank to blame is on another node, or suspect the "
                    "GPUs and the network of the job's nodes")
    elif stalled and seen.disagree:
        fallback = (f"job {job_id}: the ranks here wait in different collectives, as many in "
                    f"each, their stacks unchanged for {seen.unchanged:.0f} s: a desync; the "
                    "odd rank is the one whose collective differs from the other nodes'")
    lead = ""
    if roots and not waits:
        lead = (f"every rank here has held its stack still outside torch.distributed for "
                f"{seen.unchanged:.0f} s: every rank here is stuck before its next "
                "collective; ")
    return JobVerdict(job_id, stalled, roots, graph, said,
                      {r: "seen from outside, no reporter" for r in roots}, fallback, 0.0,
                      lead)


def _job_verdict(job_id: str, job: _Job, groups: tuple[GroupVerdict, ...],
                 graph: waitfor.Graph, now: float, limits: StallThresholds) -> JobVerdict:
    """The roots: ranks the waits lead to, and those the stalled groups blame that wait on
    nothing; a rank stopped inside an operation, or inside another one than its peers (a
    desync's odd rank), is a root though the recorder has it wait."""
    stalled = [g for g in groups if g.stalled and g.end is None]
    blamed = {r for g in stalled for r in g.behind + g.stale + g.quiet_ranks}
    forced = {r for g in stalled for r in g.stopped + tuple((g.desync or {}).get("odd", ()))}
    roots = tuple(sorted((set(graph.roots) | blamed) - set(graph.waits) | forced)) \
        if stalled else ()
    window = max((g.stalled_seconds for g in stalled), default=1.0)
    tracks = {_rank(t): t for t in job.tracks}
    said = {r: job.doing(tracks[r], now, max(window, 1.0), limits).text(
        max(window, 1.0), job.report_age(r, now)) for r in roots if r in tracks}
    quiet = max((g.quiet_seconds for g in stalled if g.outstanding is None), default=0.0)
    return JobVerdict(job_id, bool(stalled), roots, graph, said,
                      {r: _groups_text(groups, r) for r in roots},
                      stalled[0].summary() if stalled else "", quiet)


def _groups_text(groups: tuple[GroupVerdict, ...], rank: int) -> str:
    """`tp group 3 {0-1}, dp group 2 {1,3}`: the groups a rank is in, by the mesh dimension
    each carries."""
    return ", ".join((f"{dimension.of(g.meta.desc)} " if g.meta and g.meta.desc else "")
                     + f"group {g.pg}" + (f" {{{g.ranks_label}}}" if g.ranks_label else "")
                     for g in groups if rank in g.progress) or "no group"


def _rank_view(job: _Job, track: RankTrack, now: float, limits: StallThresholds) -> RankView:
    return RankView(track.state, track.age(now) <= limits.stale_after, job.end_of(track),
                    track.age(now), job.doing(track, now, BUSY_WINDOW, limits),
                    {pg: RankProgress(p, track.last_progress(pg), track.inflight_age(pg, now))
                     for pg, p in sorted(track.state.progress.items())})


def evidence(ledger: Ledger, now: float, stale_after: float, stall_after: float,
             watch: PidWatch | None = None, stall_floor: float = 10.0,
             stall_factor: float = 5.0, tcp: TcpWatch | None = None) -> dict[str, Any]:
    """The document /api/v1/ranks serves and `llmmon diagnose --ranks` reads (`tcp`: the
    job's TCP loss, for the cause of an even slowdown)."""
    return judge(ledger, now, StallThresholds(stale_after, stall_after, stall_floor,
                                              stall_factor), watch, tcp).json()
