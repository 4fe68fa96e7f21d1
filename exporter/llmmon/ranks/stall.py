"""Hang evidence: per job and process group, who waits, in which collective, and who is behind.

The rule (PyTorch Flight Recorder, NVRx's fr_attribution): ranks of a group that enqueued the
oldest collective the group has not completed are waiting in it; a rank whose last enqueued
sequence number is below it never entered it — the culprit.  A node only sees its own ranks:
when every local member waits, the rank behind is on another node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmmon.ranks import culprit, desync, ending, pace, slowdown
from llmmon.ranks.ledger import Ledger, RankTrack
from llmmon.ranks.liveness import PidWatch, Process
from llmmon.ranks.netns import TcpWatch
from llmmon.ranks.validate import Group
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



@dataclass
class _Job:
    """One job's ranks on this node with what the daemon knows of their processes."""

    tracks: list[RankTrack]
    processes: dict[int, Process | None]
    end: dict[str, Any] | None

    def quiet(self, now: float) -> float:
        """Seconds since any of its ranks here enqueued or completed a collective of any
        group: a group used only at start-up is not quiet while another one progresses."""
        noted = [n for t in self.tracks for pg in t.state.progress
                 for n in (t.last_progress(pg), t.last_enqueue(pg)) if n is not None]
        return now - max(noted, default=now)

    def doing(self, track: RankTrack, now: float, window: float,
              limits: StallThresholds) -> culprit.Doing:
        return culprit.doing(track, self.processes[track.state.identity.rank], now, window,
                             limits.stale_after)


def _rank_json(job: _Job, track: RankTrack, now: float, limits: StallThresholds) -> dict[str, Any]:
    state, who = track.state, track.state.identity
    process = job.processes[who.rank]
    end = ending.end_of(track, process)
    return {
        "rank": who.rank, "local_rank": who.local_rank, "world_size": who.world_size,
        "pod": who.pod, "namespace": who.namespace, "pid": who.pid, "uuid": who.uuid,
        "gpu_name": who.gpu_name, "allocator_config": who.allocator_config,
        "up": track.age(now) <= limits.stale_after,
        "alive": end is None,
        "exit": end.json() if end else None,
        "report_age_seconds": round(track.age(now), 3),
        "reporter": {"errors_total": state.health.errors_total,
                     "disabled": state.health.disabled,
                     "disabled_reason": state.health.disabled_reason,
                     "last_error": state.health.last_error, "fr_api": state.health.fr_api},
        "memory": state.memory,
        "steps": state.steps.steps if state.steps else None,
        "doing": job.doing(track, now, BUSY_WINDOW, limits).json(),
        "stack": [f._asdict() for f in state.stack] if state.stack else None,
        "groups": {
            pg: {"enqueued": p.enqueued, "started": p.started, "completed": p.completed,
                 "last_progress": track.last_progress(pg),
                 "oldest_inflight_age_seconds": round(track.inflight_age(pg, now), 3)}
            for pg, p in sorted(state.progress.items())},
    }


def _group_json(job_id: str, job: _Job, pg: str, now: float, limits: StallThresholds) -> dict[str, Any]:
    members = [t for t in job.tracks if pg in t.state.progress]
    progress = {t.state.identity.rank: t.state.progress[pg] for t in members}
    meta = next((t.groups()[pg] for t in members if pg in t.groups()), None)
    stale = sorted(t.state.identity.rank for t in members if t.age(now) > limits.stale_after)
    frozen = {t.state.identity.rank for t in members
              if job.doing(t, now, 1.0, limits).stopped}
    # A stale, stopped or vanished rank's last report is old: the others may have completed
    # more since; the frontier is that of the ranks that still report or said how they ended
    # (the silent one is behind it).
    gone = {t.state.identity.rank for t in members
            if (end := ending.end_of(t, job.processes[t.state.identity.rank])) is not None
            and end.how == "vanished"}
    held = frozen | gone | set(stale)
    fresh = [r for r in progress if r not in held] or list(progress)
    frontier = min(progress[r].completed for r in fresh) + 1
    waiting = sorted(r for r, p in progress.items() if p.enqueued >= frontier > p.completed)
    behind = sorted(r for r, p in progress.items() if p.enqueued < frontier)
    noted = [n for n in (t.last_progress(pg) for t in members) if n is not None]
    since = now - max(noted, default=now)
    created = [t.index.get(pg, {}).get(frontier) for t in members]
    known = [c for c in created if c is not None]
    waited = now - min(c.created_ns for c in known) / 1e9 if known else None
    op = {"seq": frontier, "coll": known[0].coll if known else None,
          "waiting_seconds": None if waited is None else round(waited, 3)} if waiting else None
    # How long the group has been stuck: the daemon's own observation, or how long the oldest
    # outstanding collective has waited (known even right after a daemon restart); but never
    # longer than since a member last enqueued something: a rank that just caught up (after a
    # checkpoint) is progress, its collective completes at the next reports.
    entered = max((t.last_enqueue(pg) or 0.0 for t in members), default=0.0)
    stalled_for = min(max(since, waited or 0.0), now - entered) if op else 0.0
    issued = {t.state.identity.rank: c for t, c in zip(members, created) if c is not None}
    found = desync.find(frontier, issued, desync.before(members, pg, frontier)) if op else None
    shown = bool(op) and (stalled_for >= ISSUED_AFTER or job.end is not None)
    learned = pace.pace(members, pg, limits.stall_floor, limits.stall_after, limits.stall_factor)
    gap = slowdown.group_pace(members, pg, now)
    window = max(stalled_for, 1.0)
    doing = {t.state.identity.rank: job.doing(t, now, window, limits) for t in members}
    stopped = sorted(r for r, d in doing.items() if d.stopped)
    busy = sorted(r for r in behind if doing[r].busy) if op else []
    # Every local member waits for a rank of another node: that node's daemon sees whether it
    # is hung or busy (a checkpoint); this one calls the group stalled only at the ceiling.
    remote = bool(op) and not behind and not stopped and not found and bool(
        meta and meta.size and meta.size > len(progress))
    # A job whose waiting ranks all stopped reporting is gone, not hung; one whose rank
    # ended is ended; a busy rank behind, or one on another node, is given until the ceiling.
    stalled = (bool(op) and job.end is None and stalled_for >= learned.threshold
               and bool(set(waiting) - set(stale) or stopped)
               and (not (busy or remote) or stalled_for >= limits.stall_after))
    # Nothing in flight and the job's ranks here quiet on every group: each is stuck before
    # its next collective (a one-rank job's loader, a dead file system under every rank), or
    # frozen.  Peers elsewhere would wait inside the collective and their daemons name these
    # ranks behind; this daemon says what they do.  Ranks silent and unseen are gone, not hung;
    # a rank that uses CPU or I/O is working outside collectives (an evaluation), not hung.
    present = [t.state.identity.rank for t in members
               if t.state.identity.rank not in stale or doing[t.state.identity.rank].stopped]
    quiet = job.quiet(now) if not op and job.end is None and present else 0.0
    idle_busy = sorted(r for r in present if doing[r].busy) if quiet else []
    if quiet and quiet >= learned.threshold and not idle_busy:
        stalled = True  # a rank that works (an evaluation, a checkpoint) holds it off for good
    group = {
        "job_id": job_id, "pg": pg, "pg_desc": meta.desc if meta else "",
        "size": meta.size if meta else None,
        "ranks": group_ranks(meta) if meta else "",
        "local_ranks": sorted(progress),
        "enqueued": {str(r): p.enqueued for r, p in sorted(progress.items())},
        "completed": {str(r): p.completed for r, p in sorted(progress.items())},
        "last_completed": frontier - 1,
        "waiting": waiting,
        "behind": behind if waiting else [],  # nobody waits: a rank behind is just idle
        "stale": stale,
        "stopped": stopped,
        "busy": busy or idle_busy,
        "remote": remote,
        "op": op,
        "issued": {str(r): desync.compared(e) for r, e in sorted(issued.items())} if shown else {},
        "desync": found,
        "last_progress": max(noted, default=None),
        "no_progress_seconds": round(since, 3),
        "stalled_seconds": round(stalled_for, 3),
        "quiet_seconds": round(quiet, 3),
        "quiet_ranks": present if quiet else [],
        "pace": learned.json(),
        "gap": gap.json() if gap else None,
        "stall_threshold_seconds": round(learned.threshold, 3),
        "stall_ceiling_seconds": limits.stall_after,
        "stalled": stalled,
        "doing": {str(r): doing[r].json()
                  for r in (behind + stopped if op else present if quiet else [])},
    }
    group["summary"] = summary(group, progress, {r: d.text(window, _report_age(job, r, now))
                                                 for r, d in doing.items()}, job.end)
    return group


def _report_age(job: _Job, rank: int, now: float) -> float:
    return next(t.age(now) for t in job.tracks if t.state.identity.rank == rank)


def summary(group: dict[str, Any], progress: dict[int, Any], doing: dict[int, str] | None = None,
            end: dict[str, Any] | None = None) -> str:
    """One sentence an SRE can act on."""
    doing = doing or {}
    head = f"job {group['job_id']}, group {group['pg']}"
    if group["pg_desc"]:
        head += f" ({group['pg_desc']})"
    op = group["op"]
    found = group.get("desync")
    if end is not None:
        return f"{head}: not a hang: {end['summary']}" + (desync.text(found) if found else "")
    if op is None and group["quiet_seconds"] >= group["stall_threshold_seconds"]:
        return _quiet_summary(head, group, doing)
    if op is None:
        return f"{head}: nothing in flight (last completed #{group['last_completed']})"
    name = f"{op['coll'] or 'collective'} #{op['seq']}"
    verb = "wait" if len(group["waiting"]) > 1 else "waits"
    text = (f"{head}: ranks {spans_text(group['waiting'])} {verb} in {name} for "
            f"{group['stalled_seconds']:.0f} s")
    if len(group["waiting"]) == 1:
        text = text.replace("ranks ", "rank ", 1)
    if group["behind"]:
        behind = "; ".join(f"rank {r} never enqueued it (last enqueued "
                           f"#{progress[r].enqueued})" + (f": {doing[r]}" if doing.get(r) else "")
                           for r in group["behind"])
        text += f"; {behind}"
    elif group["stopped"] or found:
        pass  # named below
    elif group["size"] and group["size"] > len(group["local_ranks"]):
        text += (f"; every rank on this node enqueued it: the rank behind is on another node "
                 f"(group ranks {group['ranks']})")
    elif group["stalled"]:
        text += "; every rank enqueued it and none completes: suspect the GPU or the network"
    for rank in group["stopped"]:
        if rank not in group["behind"]:
            text += f"; rank {rank} {doing.get(rank) or 'is stopped'}".replace(" it is ", " is ", 1)
    if found:
        text += desync.text(found)
    if group["stale"]:
        text += f"; rank(s) {spans_text(group['stale'])} stopped reporting"
    if not group["stalled"]:
        text += (f" (still within the stall window: {group['stall_threshold_seconds']:.0f} s, "
                 f"{group['pace']['basis']}"
                 + (f"; busy ranks get {group['stall_ceiling_seconds']:.0f} s"
                    if group["busy"] else "")
                 + (f"; a rank behind on another node gets {group['stall_ceiling_seconds']:.0f} s"
                    " here: its own node's daemon judges it at the learned threshold"
                    if group["remote"] else "") + ")")
    return text


def _quiet_summary(head: str, group: dict[str, Any], doing: dict[int, str]) -> str:
    """A group with nothing in flight whose ranks here have enqueued nothing for too long."""
    stopped = "stopped or " if group["stopped"] else ""
    text = (f"{head}: nothing in flight, and no rank here enqueued a collective of any group "
            f"for {group['quiet_seconds']:.0f} s (last completed #{group['last_completed']}; "
            f"the job's pace allows {group['stall_threshold_seconds']:.0f} s): every rank here "
            f"is {stopped}stuck before its next collective")
    for rank in group["quiet_ranks"]:
        said = doing.get(rank) or "it is outside any collective"
        text += f"; rank {rank} {said}".replace(" it is ", " is ", 1)
    if group["size"] and group["size"] > len(group["local_ranks"]):
        text += (f" (group ranks {group['ranks']}: a rank of another node that waits inside a "
                 "collective for these is named by its own daemon, with these behind)")
    if not group["stalled"]:
        text += (" (not called stalled while a rank here works: an evaluation or a checkpoint "
                 "without collectives)")
    return text


def evidence(ledger: Ledger, now: float, stale_after: float, stall_after: float,
             watch: PidWatch | None = None, stall_floor: float = 10.0,
             stall_factor: float = 5.0, tcp: TcpWatch | None = None) -> dict[str, Any]:
    """The document /api/v1/ranks serves and `llmmon diagnose --ranks` reads (`tcp`: the
    job's TCP loss, for the cause of an even slowdown)."""
    limits = StallThresholds(stale_after, stall_after, stall_floor, stall_factor)
    jobs = []
    for job_id, tracks in ledger.jobs().items():
        processes = {t.state.identity.rank: None if watch is None else
                     watch.get((job_id, t.state.identity.rank, t.pid)) for t in tracks}
        ends = [e for e in (ending.end_of(t, processes[t.state.identity.rank]) for t in tracks)
                if e is not None]
        job = _Job(tracks, processes, ending.verdict(
            job_id, [t.state.identity.rank for t in tracks], ends,
            lambda end: desync.behind_abort(tracks, end)))
        pgs = sorted({pg for t in tracks for pg in t.state.progress})
        groups = [_group_json(job_id, job, pg, now, limits) for pg in pgs]
        up = [t for t in tracks if t.age(now) <= stale_after]
        lags = {pg: lag for pg in pgs
                if (lag := ledger.enqueue_lag([t for t in up if pg in t.state.progress], pg))}
        loss = tcp.loss(job_id, now, slowdown.WINDOW) if tcp else None
        jobs.append({"job_id": job_id,
                     "ranks": [_rank_json(job, t, now, limits) for t in tracks],
                     "groups": groups,
                     "end": job.end,
                     "enqueue_lag": {pg: {str(r): v for r, v in lag.items()}
                                     for pg, lag in lags.items()},
                     "slowdown": None if job.end else slowdown.verdict(job_id, groups, lags,
                                                                       loss),
                     "stalled_groups": [g["pg"] for g in groups if g["stalled"]]})
    return {"generated_at": now, "stale_after_seconds": stale_after,
            "stall_after_seconds": stall_after, "stall_floor_seconds": stall_floor,
            "stall_factor": stall_factor, "jobs": jobs}
