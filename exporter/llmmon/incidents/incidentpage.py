"""One incident's page, from its directory: the culprit, when, the timeline, the ranks and
their stacks, what changed on the GPUs and ports, the kernel log and the files.

A section whose file is missing, too large for a page or not as the format says shows why, and
the others still render.
"""

from __future__ import annotations

import shlex
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable

from llmmon.incidents import changes, layout
from llmmon.incidents.html import (as_dict, as_ints, as_list, esc, nav, number, page,
                                   ranks_words, section, table, utc)
from llmmon.incidents.store import IncidentError, Store

KMSG_LINES = 500  # the last lines of kmsg.txt shown; the file link has them all
KMSG_TAIL = 1 << 20  # bytes read from the end of kmsg.txt for them
JSON_LIMIT = 8 << 20  # a larger file is linked, not parsed: the server's memory is small
FRAMES_SHOWN = 40  # frames of one stack group shown, innermost first

CAUSES = {
    "rank_not_enqueued": "it never enqueued the collective the other ranks wait in",
    "root": "it waits on nothing while the other ranks wait on it",
    "stack_root": "its stack is the one the other ranks wait on",
    "stack_symmetric": "every rank is stuck at the same place: none is behind the others",
    "ended": "the job ended: a rank exited first",
    "cycle": "the ranks wait on each other (a deadlock of the program's order)",
    "remote": "the rank behind is on another node",
    "": "the daemon named no culprit",
}


@dataclass(frozen=True)
class Part:
    """One file of an incident: its content, or why there is none."""

    value: Any = None
    problem: str = ""

    def note(self) -> str:
        return f"<p class='muted'>{esc(self.problem)}</p>"

    def show(self, render: Callable[[Any], str]) -> str:
        return self.note() if self.problem else render(self.value)


def load(store: Store, incident_id: str, name: str) -> Part:
    """A JSON file of the incident, parsed, or why not."""
    try:
        return Part(store.read_json(incident_id, name, JSON_LIMIT))
    except IncidentError as exc:
        return Part(problem=str(exc))


def tail(store: Store, incident_id: str, name: str) -> Part:
    """The end of a text file of the incident (undecodable bytes replaced), or why not."""
    try:
        return Part(store.tail(incident_id, name, KMSG_TAIL).decode("utf-8", errors="replace"))
    except IncidentError as exc:
        return Part(problem=str(exc))


# The page ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Incident:
    """What the incident page shows: the summary and each file it renders."""

    id: str
    summary: dict[str, Any]
    ranks: Part
    stacks: Part
    gpus: Part
    network: Part
    kmsg: Part

    @classmethod
    def read(cls, store: Store, incident_id: str) -> Incident:
        """IncidentError when the summary itself cannot be read (the page has no subject)."""
        summary = store.summary(incident_id)
        return cls(incident_id, summary, load(store, incident_id, layout.RANKS),
                   load(store, incident_id, layout.STACKS), load(store, incident_id, layout.GPUS),
                   load(store, incident_id, layout.NETWORK),
                   tail(store, incident_id, layout.KMSG))

    @property
    def culprits(self) -> list[int]:
        return as_ints(as_dict(self.summary.get("culprit")).get("ranks"))


def incident_page(incident: Incident) -> str:
    s = incident.summary
    job, node = s.get("job_id", "?"), s.get("node", "?")
    body = (nav() + f"<h1>Incident of job {esc(job)} on {esc(node)}</h1>"
            + section("Culprit", lambda: _culprit(incident), "culprit")
            + section("When", lambda: _when(s), "when")
            + section("Timeline", lambda: _timeline(incident), "timeline")
            + section("Ranks", lambda: _ranks(incident), "ranks")
            + section("Stacks", lambda: _stacks(incident), "stacks")
            + section("GPUs", lambda: incident.gpus.show(changes.gpus), "gpus")
            + section("Network", lambda: incident.network.show(changes.network), "network")
            + section("Kernel log", lambda: incident.kmsg.show(_kmsg), "kmsg")
            + section("Files", lambda: _files(incident), "files")
            + section("Across nodes", lambda: _across(job), "across"))
    return page(f"{job}: incident {incident.id} on {node} · llmmon", body)


def _culprit(incident: Incident) -> str:
    s = incident.summary
    culprit = as_dict(s.get("culprit"))
    cause = culprit.get("cause", "")
    ranks = incident.culprits
    who = ranks_words(ranks) if ranks else "no rank"
    words = CAUSES.get(cause, cause) if isinstance(cause, str) else str(cause)
    text = culprit.get("text") or ""
    groups = [f"{esc(g.get('pg_desc') or g.get('pg', '?'))}"
              + (f" ({esc(g['dimension'])})" if g.get("dimension") else "")
              + f", no progress for {number(g.get('stalled_seconds'))} s"
              for g in map(as_dict, as_list(s.get("stalled_groups")))]
    return (f"<div class='culprit' id='culprit-line'><p><strong>Culprit: {esc(who)}</strong>"
            f" — {esc(words)}</p>" + (f"<p>{esc(text)}</p>" if text else "")
            + f"<p>{esc(s.get('verdict') or 'no verdict recorded')}</p>"
            + (f"<p>Stalled groups: {'; '.join(groups)}</p>" if groups else "") + "</div>")


def _when(s: dict[str, Any]) -> str:
    onset, completed = s.get("onset"), s.get("completed")
    after = (f"complete {completed - onset:.1f} s after onset"
             if all(isinstance(v, (int, float)) for v in (onset, completed)) else "")
    rows = [("job", esc(s.get("job_id", "?"))), ("node", esc(s.get("node", "?"))),
            ("trigger", esc(s.get("trigger", "?"))), ("onset", utc(onset)),
            ("declared", utc(s.get("declared"))), ("completed", utc(completed)),
            ("incident", esc(s.get("id", "?")))]
    listed = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in rows)
    return f"<dl>{listed}</dl>" + (f"<p>{esc(after)}</p>" if after else "")


@dataclass(frozen=True)
class Event:
    at: Any  # Unix time; an event without one is left out
    what: str


def _timeline(incident: Incident) -> str:
    s = incident.summary
    events = [Event(s.get("onset"), "onset: the stall began, as the daemon saw it"
                    if s.get("trigger") == "stalled" else "onset: the job began to end"),
              Event(s.get("declared"), "declared: the daemon saw the verdict")]
    dumps = as_dict(s.get("dumps"))
    if dumps:
        said = ", ".join(f"rank {r}: {v}" for r, v in sorted(dumps.items(), key=_rank_key))
        events.append(Event(s.get("declared"), f"Flight Recorder dumps requested ({said})"))
    end = as_dict(as_dict(incident.ranks.value).get("end") or s.get("end"))
    for rank_end in map(as_dict, as_list(end.get("ranks"))):
        code = rank_end.get("code")
        events.append(Event(rank_end.get("latest"), f"rank {rank_end.get('rank')} exited: "
                            f"{rank_end.get('how')}" + ("" if code is None else f", code {code}")
                            + (f": {rank_end['error']}" if rank_end.get("error") else "")))
    events.append(Event(s.get("completed"), "completed: the incident directory was written"))
    timed = [e for e in events if isinstance(e.at, (int, float))]
    timed.sort(key=lambda e: e.at)
    onset = s["onset"] if isinstance(s.get("onset"), (int, float)) else None
    rows = [[f"<span class='nowrap'>{utc(e.at)}</span>",
             "" if onset is None else f"{e.at - onset:+.1f} s", esc(e.what)] for e in timed]
    return table(["time", "from onset", "what"], rows)


def _rank_key(item: tuple[str, Any]) -> tuple[int, str]:
    name = item[0]
    return (int(name), "") if _decimal(name) else (1 << 30, name)


def _decimal(text: Any) -> bool:
    return isinstance(text, str) and text.isascii() and text.isdigit()


def _ranks(incident: Incident) -> str:
    ranks = as_list(as_dict(incident.ranks.value).get("ranks"))
    if not ranks:
        return incident.ranks.note() if incident.ranks.problem else \
            "<p class='muted'>no rank in ranks.json</p>"
    rows, classes = [], []
    for rank in map(as_dict, ranks):
        doing, exit_ = as_dict(rank.get("doing")), as_dict(rank.get("exit"))
        idle = doing.get("cpu_idle_seconds")
        ended = f"{exit_.get('how', '')} {'' if exit_.get('code') is None else exit_['code']}"
        rows.append([esc(rank.get("rank", "?")), esc(rank.get("pod") or "—"),
                     esc(doing.get("state") or "—"), esc(doing.get("where") or "—"),
                     "—" if idle is None else f"{number(idle)} s",
                     esc(ended.strip()) if exit_ else "alive" if rank.get("alive") else "—"])
        classes.append("hl" if rank.get("rank") in incident.culprits else "")
    return table(["rank", "pod", "state", "where", "no CPU for", "exit"], rows, classes)


@dataclass(frozen=True)
class StackGroup:
    frames: tuple[tuple[str, str, str], ...]  # (function, file, line), innermost first
    ranks: list[int]
    where: str


def stack_groups(incident: Incident) -> list[StackGroup]:
    """Ranks with the same frames, once each: stacks.json, else the stacks in ranks.json."""
    stacks: dict[int, tuple[list[Any], str]] = {}
    for key, entry in as_dict(as_dict(incident.stacks.value).get("ranks")).items():
        if _decimal(key):
            entry = as_dict(entry)
            stacks[int(key)] = (as_list(entry.get("frames")), str(entry.get("where") or ""))
    if not stacks:
        for rank in map(as_dict, as_list(as_dict(incident.ranks.value).get("ranks"))):
            if isinstance(rank.get("rank"), int) and rank.get("stack"):
                where = as_dict(rank.get("doing")).get("where") or ""
                stacks[rank["rank"]] = (as_list(rank["stack"]), str(where))
    groups: dict[tuple[tuple[str, str, str], ...], StackGroup] = {}
    for rank in sorted(stacks):
        frames, where = stacks[rank]
        key = tuple((str(f.get("function", "?")), str(f.get("file", "?")), str(f.get("line", "")))
                    for f in map(as_dict, frames))
        groups.setdefault(key, StackGroup(key, [], where)).ranks.append(rank)
    return list(groups.values())


def _stacks(incident: Incident) -> str:
    every = stack_groups(incident)
    groups = [g for g in every if g.frames]
    bare = sorted(r for g in every if not g.frames for r in g.ranks)
    none = f"<p class='muted'>no stack captured of {esc(ranks_words(bare))}</p>" if bare else ""
    if not groups:
        problem = incident.stacks.problem or "no stack captured"
        return none or f"<p class='muted'>{esc(problem)}</p>"
    out = []
    for group in sorted(groups, key=lambda g: not set(g.ranks) & set(incident.culprits)):
        blamed = bool(set(group.ranks) & set(incident.culprits))
        shown = group.frames[:FRAMES_SHOWN]
        lines = "\n".join(f"{function}  ({file}:{line})" for function, file, line in shown)
        more = len(group.frames) - len(shown)
        out.append(
            f"<div class='group{' culprit' if blamed else ''}'>"
            f"<h3>{esc(ranks_words(group.ranks))}{' — culprit' if blamed else ''}"
            + (f" <span class='muted'>in {esc(group.where)}</span>" if group.where else "")
            + f"</h3><pre>{esc(lines)}</pre>"
            + (f"<p class='muted'>{more} outer frames more in the file</p>" if more > 0 else "")
            + "</div>")
    return "".join(out) + none


def _kmsg(text: str) -> str:
    lines = text.splitlines()
    if not lines:
        return "<p class='muted'>no kernel line since the stall began</p>"
    shown = lines[-KMSG_LINES:]
    cut = (f"<p class='muted'>the last {len(shown)} lines; kmsg.txt (below) has them all</p>"
           if len(shown) < len(lines) else "")
    return cut + f"<pre>{esc(chr(10).join(shown))}</pre>"


def file_url(incident_id: str, name: str) -> str:
    return f"/api/v1/incidents/{incident_id}/files/{urllib.parse.quote(name, safe='/')}"


def _files(incident: Incident) -> str:
    s = incident.summary
    items = []
    for name, size in sorted(as_dict(s.get("files")).items()):
        shown = f"{esc(name)} <span class='muted'>({_bytes(size)})</span>"
        items.append(f"<li><a href='{esc(file_url(incident.id, name))}'>{shown}</a></li>"
                     if layout.allowed(name) else f"<li>{shown}</li>")
    left_out = "".join(f"<li>{esc(line)}</li>" for line in as_list(s.get("left_out")))
    errors = "".join(f"<li>{esc(line)}</li>" for line in as_list(s.get("errors")))
    return (f"<ul>{''.join(items)}</ul>"
            + (f"<h3>Left out</h3><ul>{left_out}</ul>" if left_out else "")
            + (f"<h3>Could not be captured</h3><ul class='bad'>{errors}</ul>" if errors else "")
            + f"<p class='muted'>{_bytes(s.get('bytes'))} in all; "
            f"<a href='/api/v1/incidents/{esc(incident.id)}'>summary.json</a></p>")


def _bytes(size: Any) -> str:
    exact = isinstance(size, int) and not isinstance(size, bool)
    return f"{size:,} bytes" if exact else f"{esc(size)} bytes"


def _across(job: Any) -> str:
    command = f"llmmon incident {shlex.quote(str(job))} --prometheus URL"
    return ("<p>This page shows one node. The report across the job's nodes merges each "
            "node's directory:</p>" f"<pre>{esc(command)}</pre>")


