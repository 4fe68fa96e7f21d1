"""Hang evidence: per job and process group, who waits, in which collective, and who is behind.

The rule (PyTorch Flight Recorder, NVRx's fr_attribution): ranks of a group that enqueued the
oldest collective the group has not completed are waiting in it; a rank whose last enqueued
sequence number is below it never entered it — the culprit.  A node only sees its own ranks:
when every local member waits, the rank behind is on another node.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from llmmon.ranks.ledger import Ledger, RankTrack
from llmmon.ranks.schema import Group
from llmmon_reporter.flight import ranges


def join_spans(spans: Iterable[Sequence[int]], dash: str = "-") -> str:
    """[[0, 3], [7, 7]] -> '0-3,7' (ASCII, for label values and JSON)."""
    return ",".join(f"{a}" if a == b else f"{a}{dash}{b}" for a, b in spans)


def group_ranks(group: Group) -> str:
    """A group's ranks as a label value; ',...' when the spool listed more spans than kept."""
    return join_spans(group.ranks) + (",..." if group.spans_cut else "")


def spans_text(ranks: list[int]) -> str:
    """[0, 1, 2, 3, 7] -> '0–3, 7' (for people)."""
    return join_spans(ranges(sorted(ranks)), "–").replace(",", ", ")


def _rank_json(track: RankTrack, now: float, stale_after: float) -> dict[str, Any]:
    state, who = track.state, track.state.identity
    return {
        "rank": who.rank, "local_rank": who.local_rank, "world_size": who.world_size,
        "pod": who.pod, "namespace": who.namespace, "pid": who.pid, "uuid": who.uuid,
        "gpu_name": who.gpu_name, "allocator_config": who.allocator_config,
        "up": track.age(now) <= stale_after,
        "report_age_seconds": round(track.age(now), 3),
        "reporter": {"errors_total": state.health.errors_total,
                     "disabled": state.health.disabled,
                     "disabled_reason": state.health.disabled_reason,
                     "last_error": state.health.last_error, "fr_api": state.health.fr_api},
        "memory": state.memory,
        "steps": state.steps.steps if state.steps else None,
        "groups": {
            pg: {"enqueued": p.enqueued, "started": p.started, "completed": p.completed,
                 "last_progress": track.last_progress(pg),
                 "oldest_inflight_age_seconds": round(track.inflight_age(pg, now), 3)}
            for pg, p in sorted(state.progress.items())},
    }


def _group_json(job: str, pg: str, members: list[RankTrack], now: float, stale_after: float,
                stall_after: float) -> dict[str, Any]:
    progress = {t.state.identity.rank: t.state.progress[pg] for t in members}
    meta = next((t.groups()[pg] for t in members if pg in t.groups()), None)
    frontier = min(p.completed for p in progress.values()) + 1
    waiting = sorted(r for r, p in progress.items() if p.enqueued >= frontier > p.completed)
    behind = sorted(r for r, p in progress.items() if p.enqueued < frontier)
    stale = sorted(t.state.identity.rank for t in members if t.age(now) > stale_after)
    noted = [t.last_progress(pg) for t in members]
    since = now - max((n for n in noted if n is not None), default=now)
    created = [t.index.get(pg, {}).get(frontier) for t in members]
    known = [c for c in created if c is not None]
    waited = now - min(c.created_ns for c in known) / 1e9 if known else None
    op = {"seq": frontier, "coll": known[0].coll if known else None,
          "waiting_seconds": None if waited is None else round(waited, 3)} if waiting else None
    # How long the group has been stuck: the daemon's own observation, or how long the oldest
    # outstanding collective has waited (known even right after a daemon restart).
    stalled_for = max(since, waited or 0.0) if op else 0.0
    group = {
        "job_id": job, "pg": pg, "pg_desc": meta.desc if meta else "",
        "size": meta.size if meta else None,
        "ranks": group_ranks(meta) if meta else "",
        "local_ranks": sorted(progress),
        "enqueued": {str(r): p.enqueued for r, p in sorted(progress.items())},
        "completed": {str(r): p.completed for r, p in sorted(progress.items())},
        "last_completed": frontier - 1,
        "waiting": waiting,
        "behind": behind if waiting else [],  # nobody waits: a rank behind is just idle
        "stale": stale,
        "op": op,
        "no_progress_seconds": round(since, 3),
        "stalled_seconds": round(stalled_for, 3),
        # A job whose waiting ranks all stopped reporting is gone, not hung.
        "stalled": bool(op) and stalled_for >= stall_after and bool(set(waiting) - set(stale)),
    }
    group["summary"] = summary(group, progress)
    return group


def summary(group: dict[str, Any], progress: dict[int, Any]) -> str:
    """One sentence an SRE can act on."""
    head = f"job {group['job_id']}, group {group['pg']}"
    if group["pg_desc"]:
        head += f" ({group['pg_desc']})"
    op = group["op"]
    if op is None:
        return f"{head}: nothing in flight (last completed #{group['last_completed']})"
    name = f"{op['coll'] or 'collective'} #{op['seq']}"
    verb = "wait" if len(group["waiting"]) > 1 else "waits"
    text = (f"{head}: ranks {spans_text(group['waiting'])} {verb} in {name} for "
            f"{group['stalled_seconds']:.0f} s")
    if len(group["waiting"]) == 1:
        text = text.replace("ranks ", "rank ", 1)
    if group["behind"]:
        behind = ", ".join(f"rank {r} never enqueued it (last enqueued "
                           f"#{progress[r].enqueued})" for r in group["behind"])
        text += f"; {behind}"
    elif group["size"] and group["size"] > len(group["local_ranks"]):
        text += (f"; every rank on this node enqueued it: the rank behind is on another node "
                 f"(group ranks {group['ranks']})")
    elif group["stalled"]:
        text += "; every rank enqueued it and none completes: suspect the GPU or the network"
    if group["stale"]:
        text += f"; rank(s) {spans_text(group['stale'])} stopped reporting"
    elif not group["stalled"]:
        text += " (still within the stall window)"
    return text


def evidence(ledger: Ledger, now: float, stale_after: float,
             stall_after: float) -> dict[str, Any]:
    """The document /api/v1/ranks serves and `llmmon diagnose --ranks` reads."""
    jobs = []
    for job, tracks in ledger.jobs().items():
        pgs = sorted({pg for t in tracks for pg in t.state.progress})
        groups = [_group_json(job, pg, [t for t in tracks if pg in t.state.progress], now,
                              stale_after, stall_after) for pg in pgs]
        jobs.append({"job_id": job,
                     "ranks": [_rank_json(t, now, stale_after) for t in tracks],
                     "groups": groups,
                     "stalled_groups": [g["pg"] for g in groups if g["stalled"]]})
    return {"generated_at": now, "stale_after_seconds": stale_after,
            "stall_after_seconds": stall_after, "jobs": jobs}
