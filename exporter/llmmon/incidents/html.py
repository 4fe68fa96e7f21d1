"""Incident pages: self-contained HTML (inline CSS, no script, no external asset) rendered by
the server process from the directory on disk, so that an incident reads in a browser while
Prometheus, Grafana or the collector process are down, and from a saved copy off the node.

Job ids, frames and kernel lines are anybody's text: every value goes through `esc`. A section
whose file is missing or not as the format says shows why and the others still render.
"""

from __future__ import annotations

import html
import math
import shlex
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable

from llmmon.incidents import layout
from llmmon.incidents.store import FILE_LIMIT, IncidentError, Listing, Store
from llmmon.ranks.spans import spans_text
from llmmon.textsafe import printable

KMSG_LINES = 500  # the last lines of kmsg.txt shown; the file link has them all
FRAMES_SHOWN = 40  # frames of one stack group shown, innermost first
TABLE_ROWS = 200  # rows of one GPU or network table
HIGHLIGHTED = 3  # rows marked as the ones that changed most

CSS = """
body{font-family:system-ui,sans-serif;margin:1.2em 2em;color:#1d1d1f;line-height:1.35}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.15em;margin:1.4em 0 .4em;
border-bottom:1px solid #ddd}h3{font-size:1em;margin:1em 0 .3em}
table{border-collapse:collapse;margin:.3em 0}td,th{padding:.2em .7em;text-align:left;
vertical-align:top;border-bottom:1px solid #eee}th{background:#f4f4f6}
td,th,p,li,dd{overflow-wrap:break-word}pre{overflow-wrap:anywhere}.nowrap{white-space:nowrap}
.scroll{overflow-x:auto;max-width:100%}
pre{white-space:pre-wrap;background:#f7f7f9;padding:.5em;margin:.2em 0;font-size:.85em}
.culprit{background:#fdecea;border-left:5px solid #b00020;padding:.6em 1em;margin:.6em 0}
.culprit strong{color:#b00020}.group{border:1px solid #ddd;padding:.3em .8em;margin:.5em 0}
.group.culprit{border-left:5px solid #b00020}
tr.hl td{background:#fff3cd}.muted{color:#666}.bad{color:#b00020}
.ok{color:green}.failed{color:#b00}.empty{color:gray}.suspect{color:#b00020}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.1em 1em;margin:.4em 0}
dt{color:#555}dd{margin:0}nav a{margin-right:1em}
"""

CAUSES = {
    "rank_not_enqueued": "it never enqueued the collective the other ranks wait in",
    "stack_root": "its stack is the one the other ranks wait on",
    "stack_symmetric": "every rank is stuck at the same place: none is behind the others",
    "ended": "the job ended: a rank exited first",
    "cycle": "the ranks wait on each other (a deadlock of the program's order)",
    "remote": "the rank behind is on another node",
    "": "the daemon named no culprit",
}


def esc(value: Any) -> str:
    """Any value as HTML text: escaped, and encodable (lone surrogates written as escapes)."""
    return html.escape(printable(str(value)))


def utc(when: Any) -> str:
    if not isinstance(when, (int, float)) or isinstance(when, bool):
        return "—"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))
    except (OverflowError, OSError, ValueError):
        return "—"


def number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "—" if value is None else esc(value)
    return f"{value:.4g}"


def page(title: str, body: str, refresh: int = 0) -> str:
    """A whole document; `refresh`: seconds between reloads (a live page without script)."""
    meta = f"<meta http-equiv='refresh' content='{refresh}'>" if refresh else ""
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width'>"
            f"{meta}<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"{body}</body></html>")


def section(title: str, render: Callable[[], str], anchor: str = "") -> str:
    """An h2 and its content; content other code wrote in a shape it should not have becomes a
    line saying so, never an error for the whole page."""
    try:
        inner = render()
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ArithmeticError) as exc:
        inner = f"<p class='bad'>could not be shown: {esc(type(exc).__name__)}: {esc(exc)}</p>"
    ident = f" id='{anchor}'" if anchor else ""
    return f"<section{ident}><h2>{esc(title)}</h2>{inner}</section>"


def table(head: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    """Cells are HTML already; `classes` gives each row's class."""
    header = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join(_row(row, c) for row, c in zip(rows, classes or [""] * len(rows)))
    return f"<div class='scroll'><table><tr>{header}</tr>{body}</table></div>"


def _row(cells: list[str], cls: str) -> str:
    attribute = f" class='{cls}'" if cls else ""
    return f"<tr{attribute}>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def ranks_words(ranks: list[int]) -> str:
    """`rank 3`, `ranks 0–2, 5`."""
    return ("rank " if len(ranks) == 1 else "ranks ") + spans_text(ranks)


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_ints(value: Any) -> list[int]:
    return [v for v in as_list(value) if isinstance(v, int) and not isinstance(v, bool)]


@dataclass(frozen=True)
class Part:
    """One file of an incident: its content, or why there is none."""

    value: Any = None
    problem: str = ""

    def note(self) -> str:
        return f"<p class='muted'>{esc(self.problem)}</p>"


def load(store: Store, incident_id: str, name: str, text: bool = False) -> Part:
    """A file of the incident, parsed as JSON (or decoded as text), or why not."""
    try:
        if text:
            raw = store.read(incident_id, name, FILE_LIMIT)
            return Part(raw.decode("utf-8", errors="replace"))
        return Part(store.json(incident_id, name, FILE_LIMIT))
    except IncidentError as exc:
        return Part(problem=str(exc))


# The incident page ----------------------------------------------------------------------

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
                   load(store, incident_id, layout.KMSG, text=True))

    @property
    def culprits(self) -> list[int]:
        return as_ints(as_dict(self.summary.get("culprit")).get("ranks"))


def incident_page(incident: Incident) -> str:
    s = incident.summary
    job, node = s.get("job_id", "?"), s.get("node", "?")
    body = (_nav() + f"<h1>Incident of job {esc(job)} on {esc(node)}</h1>"
            + section("Culprit", lambda: _culprit(incident), "culprit")
            + section("When", lambda: _when(s), "when")
            + section("Timeline", lambda: _timeline(incident), "timeline")
            + section("Ranks", lambda: _ranks(incident), "ranks")
            + section("Stacks", lambda: _stacks(incident), "stacks")
            + section("GPUs", lambda: _gpus(incident.gpus), "gpus")
            + section("Network", lambda: _network(incident.network), "network")
            + section("Kernel log", lambda: _kmsg(incident.kmsg), "kmsg")
            + section("Files", lambda: _files(incident), "files")
            + section("Across nodes", lambda: _across(job), "across"))
    return page(f"{job}: incident {incident.id} on {node} · llmmon", body)


def error_page(message: str) -> str:
    """What a page route answers when there is no such incident, or it cannot be read."""
    return page("llmmon: incident not shown", _nav() + f"<h1>Not shown</h1><p>{esc(message)}</p>")


def _nav() -> str:
    return "<nav><a href='/'>Node status</a><a href='/incidents'>Incidents</a></nav>"


def _culprit(incident: Incident) -> str:
    s = incident.summary
    culprit = as_dict(s.get("culprit"))
    cause = culprit.get("cause", "")
    ranks = incident.culprits
    who = ranks_words(ranks) if ranks else "no rank"
    words = CAUSES.get(cause, str(cause)) if isinstance(cause, str) else esc(cause)
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
    rows = [[f"<span class='nowrap'>{utc(e.at)}</span>", "" if onset is None else f"{e.at - onset:+.1f} s", esc(e.what)]
            for e in timed]
    return table(["time", "from onset", "what"], rows)


def _rank_key(item: tuple[str, Any]) -> tuple[int, str]:
    name = item[0]
    return (int(name), "") if name.isdigit() else (1 << 30, name)


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
        if isinstance(key, str) and key.isdigit():
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
    groups = stack_groups(incident)
    if not groups:
        problem = incident.stacks.problem or "no stack captured"
        return f"<p class='muted'>{esc(problem)}</p>"
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
            + f"</h3><pre>{esc(lines) or '(no frames)'}</pre>"
            + (f"<p class='muted'>{more} outer frames more in the file</p>" if more > 0 else "")
            + "</div>")
    return "".join(out)


@dataclass(frozen=True)
class Change:
    """One counter or gauge before and during the stall, for a table row."""

    cells: list[str]
    before: Any
    during: Any
    score: float


def _score(before: Any, during: Any, spans: tuple[float, float] | None, counter: bool) -> float:
    """How much it changed: relative, per second for counters over spans of different length."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (before, during)):
        return 0.0
    if counter and spans:
        before, during = before / spans[0], during / spans[1]
    return abs(during - before) / max(abs(before), 1.0)


def _spans(document: dict[str, Any]) -> tuple[float, float] | None:
    spans = as_dict(document.get("spans"))
    try:
        (b0, b1), (d0, d1) = spans["before"], spans["during"]
        lengths = (float(b1) - float(b0), float(d1) - float(d0))
    except (KeyError, TypeError, ValueError):
        return None
    return lengths if min(lengths) > 0 else None


def _changes_table(head: list[str], changes: list[Change], spans: tuple[float, float] | None
                   ) -> str:
    if not changes:
        return "<p class='muted'>no values</p>"
    scores = sorted((c.score for c in changes if c.score > 0), reverse=True)[:HIGHLIGHTED]
    least = scores[-1] if scores else math.inf
    top = [c for c in changes if c.score >= least]  # the HIGHLIGHTED first, and their ties
    shown = changes[:TABLE_ROWS]
    rows = [c.cells + [number(c.before), number(c.during)] for c in shown]
    span_words = (f"before: the {spans[0]:.0f} s before onset; during: the {spans[1]:.0f} s "
                  "after; counters are increases over each span, gauges means") if spans else ""
    most = "".join(f"<li>{' '.join(c.cells)}: {number(c.before)} → {number(c.during)}</li>"
                   for c in top)
    return ((f"<p>Changed most:</p><ul>{most}</ul>" if most else "")
            + (f"<p class='muted'>{esc(span_words)}</p>" if span_words else "")
            + table(head + ["before", "during"], rows,
                    ["hl" if c.score >= least else "" for c in shown])
            + (f"<p class='muted'>{len(changes) - len(shown)} rows more in the file</p>"
               if len(changes) > len(shown) else ""))


def _gpus(part: Part) -> str:
    if part.problem:
        return part.note()
    document = as_dict(part.value)
    spans = _spans(document)
    changes, xids = [], []
    for gpu in map(as_dict, as_list(document.get("gpus"))):
        label = esc(gpu.get("gpu", "?"))
        for metric, pair in sorted(as_dict(gpu.get("values")).items()):
            pair = as_dict(pair)
            changes.append(Change([f"GPU {label}", esc(metric)], pair.get("before"), pair.get("during"),
                                  _score(pair.get("before"), pair.get("during"), spans,
                                         metric.endswith("_total"))))
        for xid in map(as_dict, as_list(gpu.get("xids"))):
            xids.append(f"GPU {label} ({esc(gpu.get('uuid', ''))}): XID {esc(xid.get('xid'))}"
                        f" ×{esc(xid.get('count'))}")
    names = "".join(f"<li>GPU {esc(g.get('gpu', '?'))}: {esc(g.get('name', ''))} "
                    f"{esc(g.get('uuid', ''))}</li>" for g in map(as_dict, as_list(document.get("gpus"))))
    return ((f"<p class='bad'>{'<br>'.join(xids)}</p>" if xids else "<p>no XID error</p>")
            + (f"<ul>{names}</ul>" if names else "")
            + _changes_table(["gpu", "metric"], changes, spans))


def _network(part: Part) -> str:
    if part.problem:
        return part.note()
    document = as_dict(part.value)
    spans = _spans(document)
    changes = []
    for port in map(as_dict, as_list(document.get("ports"))):
        where = " ".join(str(port.get(k) or "") for k in ("kind", "device", "port", "netdev"))
        for metric, pair in sorted(as_dict(port.get("counters")).items()):
            pair = as_dict(pair)
            changes.append(Change([esc(where.strip()), esc(metric)], pair.get("before"),
                                  pair.get("during"),
                                  _score(pair.get("before"), pair.get("during"), spans, True)))
    return _changes_table(["port", "counter"], changes, spans)


def _kmsg(part: Part) -> str:
    if part.problem:
        return part.note()
    lines = str(part.value).splitlines()
    if not lines:
        return "<p class='muted'>no kernel line since the stall began</p>"
    shown = lines[-KMSG_LINES:]
    cut = (f"<p class='muted'>the last {len(shown)} of {len(lines)} lines</p>"
           if len(shown) < len(lines) else "")
    return cut + f"<pre>{esc(chr(10).join(shown))}</pre>"


def file_url(incident_id: str, name: str) -> str:
    return f"/api/v1/incidents/{incident_id}/files/{urllib.parse.quote(name, safe='/')}"


def _files(incident: Incident) -> str:
    s = incident.summary
    items = []
    for name, size in sorted(as_dict(s.get("files")).items()):
        shown = f"{esc(name)} <span class='muted'>({number(size)} bytes)</span>"
        items.append(f"<li><a href='{esc(file_url(incident.id, name))}'>{shown}</a></li>"
                     if layout.allowed(name) else f"<li>{shown}</li>")
    left_out = "".join(f"<li>{esc(line)}</li>" for line in as_list(s.get("left_out")))
    errors = "".join(f"<li>{esc(line)}</li>" for line in as_list(s.get("errors")))
    return (f"<ul>{''.join(items)}</ul>"
            + (f"<h3>Left out</h3><ul>{left_out}</ul>" if left_out else "")
            + (f"<h3>Could not be captured</h3><ul class='bad'>{errors}</ul>" if errors else "")
            + f"<p class='muted'>{number(s.get('bytes'))} bytes in all; "
            f"<a href='/api/v1/incidents/{esc(incident.id)}'>summary.json</a></p>")


def _across(job: Any) -> str:
    command = f"llmmon incident {shlex.quote(str(job))} --prometheus URL"
    return ("<p>This page shows one node. The report across the job's nodes merges each "
            "node's directory:</p>" f"<pre>{esc(command)}</pre>")


# The list ------------------------------------------------------------------------------

def list_page(listing: Listing, job_id: str | None = None) -> str:
    title = f"Incidents of job {job_id}" if job_id else "Incidents on this node"
    return page(f"{title} · llmmon", _nav() + f"<h1>{esc(title)}</h1>" + incidents_table(listing))


def incidents_table(listing: Listing, limit: int | None = None) -> str:
    """The newest `limit` incidents as a table, and the ones that could not be read."""
    rows = [[f"<a class='nowrap' href='/incidents/{esc(s['id'])}'>{utc(s.get('completed'))}</a>",
             esc(s.get("job_id", "?")), esc(s.get("node", "?")), esc(s.get("trigger", "?")),
             esc(s.get("verdict") or "")] for s in listing.incidents[:limit]]
    shown = (table(["completed", "job", "node", "trigger", "verdict"], rows) if rows
             else "<p class='muted'>no incident recorded here</p>")
    bad = "".join(f"<li>{esc(line)}</li>" for line in listing.unreadable)
    return shown + (f"<p class='bad'>Not readable:</p><ul class='bad'>{bad}</ul>" if bad else "")
