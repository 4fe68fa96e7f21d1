"""One report from the incidents a job's nodes kept: what each saw, put side by side.

Each node judges the hang from its own ranks.  A node whose ranks only wait for a peer on
another node can say no more than "remote"; the node that holds the rank they wait for saw it
(its stack, its missing collective), so its word wins.  Where nodes that saw for themselves
name different ranks, the report says so rather than pick silently.  Across nodes it also
reads what no single node can: every rank's Flight Recorder dump matched together
(`frtrace`), the same stack on ranks of several nodes, and the one node whose counters rose
far more than the others' during the stall (`outliers`).
"""

from __future__ import annotations

import gc
import json
import re
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping

from llmmon.incidents import frtrace, layout
from llmmon.incidents.outliers import Outlier, node_deltas, outliers
from llmmon.textsafe import json_ready, printable

MAX_JSON_BYTES = 64 << 20
SPANS = re.compile(r"(\d+)(?:-(\d+))?")
FR_RANK = re.compile(r"^fr/rank_(\d{1,7})(\.json)?$")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class NodeIncident:
    """One node's incident as fetched: its summary.json and the bytes of its other files."""

    source: str  # where it came from (the daemon's address, or a directory)
    summary: Mapping[str, Any]
    files: Mapping[str, bytes] = field(default_factory=dict)
    errors: tuple[str, ...] = ()  # files that could not be fetched

    @property
    def node(self) -> str:
        name = self.summary.get("node")
        return name if isinstance(name, str) and name else self.source


@dataclass(frozen=True)
class Missing:
    """A node of the job whose incident could not be had, and why."""

    node: str
    reason: str


@dataclass(frozen=True)
class Event:
    at: float  # Unix time
    node: str
    what: str


@dataclass(frozen=True)
class Culprit:
    ranks: tuple[int, ...]
    cause: str  # a summary's culprit.cause, or "flight_recorder" when only the dumps name one
    text: str
    named_by: tuple[str, ...]  # the nodes whose summary names these ranks
    agreed: bool  # every node that saw for itself names the same ranks
    notes: tuple[str, ...]  # disagreements, and where the culprit's node is missing


@dataclass(frozen=True)
class StackGroup:
    """Ranks, on any node, whose stacks are frame for frame the same."""

    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    where: str
    frames: tuple[str, ...]  # "function (file:line)", innermost first


@dataclass(frozen=True)
class NodeView:
    node: str
    source: str
    incident: str
    trigger: str
    local_ranks: tuple[int, ...]
    verdict: str
    culprit: Mapping[str, Any]
    left_out: tuple[str, ...]
    errors: tuple[str, ...]


@dataclass(frozen=True)
class Report:
    job_id: str
    nodes: tuple[NodeView, ...]
    missing: tuple[Missing, ...]
    timeline: tuple[Event, ...]
    culprit: Culprit
    fr: frtrace.Analysis
    stacks: tuple[StackGroup, ...]
    outliers: tuple[Outlier, ...]
    errors: tuple[str, ...]

    def json(self) -> dict[str, Any]:
        """Strict JSON whatever the nodes sent (no NaN, no lone surrogate)."""
        doc = asdict(self)
        doc["fr"] = self.fr.json()
        return json_ready(doc)

    def text(self) -> str:
        return render(self)


def merge(job_id: str, incidents: Iterable[NodeIncident],
          missing: Iterable[Missing] = ()) -> Report:
    """The job's report from its nodes' incidents (one per node: the newest)."""
    incidents = _named(incidents)
    errors: list[str] = []
    docs = {i.node: {name: _json(i, name, errors) for name in
                     (layout.RANKS, layout.STACKS, layout.GPUS, layout.NETWORK)}
            for i in incidents}
    fr = _flight_records(incidents, docs)
    deltas = {i.node: node_deltas(docs[i.node][layout.NETWORK], docs[i.node][layout.GPUS])
              for i in incidents}
    return Report(
        job_id, tuple(_view(i) for i in incidents), tuple(missing),
        tuple(_timeline(incidents)), culprit(incidents, fr), fr,
        tuple(_stacks({n: d[layout.STACKS] for n, d in docs.items()})),
        tuple(outliers(deltas)), tuple(errors))


def _named(incidents: Iterable[NodeIncident]) -> list[NodeIncident]:
    """Sorted by node, a name two nodes share told apart by where each came from."""
    incidents = list(incidents)
    names = [i.node for i in incidents]
    return sorted((i if names.count(i.node) == 1 else replace(
        i, summary={**i.summary, "node": f"{i.node} ({i.source})"}) for i in incidents),
        key=lambda i: i.node)


def _json(incident: NodeIncident, name: str, errors: list[str]) -> Any:
    data = incident.files.get(name)
    if data is None:
        return None
    try:
        if len(data) > MAX_JSON_BYTES:
            raise ValueError(f"{len(data)} bytes, over the cap")
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        errors.append(f"{incident.node}: {name}: not read: {exc}")
        return None


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(v for v in value if type(v) is int) if isinstance(value, list) else ()


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _view(incident: NodeIncident) -> NodeView:
    s = incident.summary
    culprit = s.get("culprit") if isinstance(s.get("culprit"), dict) else {}
    return NodeView(incident.node, incident.source, _text(s.get("id")), _text(s.get("trigger")),
                    _ints(s.get("local_ranks")), _text(s.get("verdict")), culprit,
                    _strings(s.get("left_out")), _strings(s.get("errors")) + incident.errors)


# The culprit ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Claim:
    node: str
    ranks: tuple[int, ...]
    cause: str
    text: str


def culprit(incidents: list[NodeIncident], fr: frtrace.Analysis) -> Culprit:
    """The ranks the nodes blame.  Nodes that saw the culprit themselves outvote nodes that
    only see their ranks wait on a remote peer; among those, the ranks the Flight Recorder
    also names win, then the most nodes."""
    claims = _claims(incidents)
    pool = [c for c in claims if c.cause not in ("remote", "")] or claims
    if not pool:
        if fr.culprits:
            return Culprit(fr.culprits, "flight_recorder",
                           "; ".join(f.text for f in fr.findings if f.kind != "desync"), (),
                           True, ("no node names a culprit; the Flight Recorder dumps do",))
        return Culprit((), "", "no node names a culprit", (), True, ())
    together = _own_roots(incidents, pool)
    if together is not None:
        return together
    by_ranks: dict[tuple[int, ...], list[_Claim]] = {}
    for claim in pool:
        by_ranks.setdefault(claim.ranks, []).append(claim)
    chosen = max(by_ranks, key=lambda r: (bool(set(r) & set(fr.culprits)), len(by_ranks[r]),
                                          [-x for x in r]))
    first = by_ranks[chosen][0]
    return Culprit(chosen, first.cause, first.text,
                   tuple(c.node for c in claims if c.ranks == chosen), len(by_ranks) == 1,
                   tuple(_notes(incidents, fr, claims, pool, chosen)))


ROOTS = ("root", "stack_root")


def _own_roots(incidents: list[NodeIncident], pool: list[_Claim]) -> Culprit | None:
    """Every node that blames somebody names roots among its own ranks: they do not compete,
    each node judged its own (every rank stuck in its data loader, on every node): the
    culprit is all of them."""
    held = {i.node: set(_ints(i.summary.get("local_ranks"))) for i in incidents}
    if len(pool) < 2 or not all(c.cause in ROOTS and set(c.ranks) <= held.get(c.node, set())
                                for c in pool):
        return None
    ranks = tuple(sorted({r for c in pool for r in c.ranks}))
    return Culprit(ranks, pool[0].cause, "; ".join(c.text for c in pool),
                   tuple(c.node for c in pool), True,
                   (f"each of {len(pool)} nodes names roots among its own ranks",))


def _claims(incidents: list[NodeIncident]) -> list[_Claim]:
    claims = []
    for incident in incidents:
        c = incident.summary.get("culprit")
        if isinstance(c, dict) and _ints(c.get("ranks")):
            claims.append(_Claim(incident.node, tuple(sorted(_ints(c.get("ranks")))),
                                 _text(c.get("cause")), _text(c.get("text"))))
    return claims


def _notes(incidents: list[NodeIncident], fr: frtrace.Analysis, claims: list[_Claim],
           pool: list[_Claim], chosen: tuple[int, ...]) -> list[str]:
    """What a reader must know beside the chosen ranks: who disagrees, and why unsure."""
    notes = []
    if len({c.ranks for c in pool}) > 1:
        notes.append("nodes disagree: " + "; ".join(
            f"{c.node} names {_ranks(c.ranks)} ({c.cause or 'no cause'})" for c in pool))
    notes += [f"{c.node} sees its ranks wait for remote {_ranks(c.ranks)}" for c in claims
              if c not in pool and c.ranks != chosen]
    if fr.culprits and set(fr.culprits) != set(chosen):
        notes.append(f"the Flight Recorder dumps point at {_ranks(fr.culprits)}")
    held = {r for i in incidents for r in _ints(i.summary.get("local_ranks"))}
    if not set(chosen) & held:
        notes.append(f"no node that answered holds {_ranks(chosen)}")
    return notes


# Timeline, stacks, dumps ---------------------------------------------------------------------

def _timeline(incidents: list[NodeIncident]) -> list[Event]:
    events = []
    for incident in incidents:
        s, node = incident.summary, incident.node
        for key, what in (("onset", "stall began, as this node saw it"),
                          ("declared", "verdict declared"), ("completed", "incident written")):
            if _time(s.get(key)) is not None:
                events.append(Event(_time(s.get(key)), node, what))
        end = s.get("end") if isinstance(s.get("end"), dict) else {}
        for e in end.get("ranks") or () if isinstance(end.get("ranks"), list) else ():
            if isinstance(e, dict) and _time(e.get("earliest")) is not None:
                how = " ".join(str(e[k]) for k in ("how", "code") if e.get(k) is not None)
                error = f": {_text(e.get('error'))[:120]}" if e.get("error") else ""
                events.append(Event(_time(e.get("earliest")), node,
                                    f"rank {e.get('rank')} ended ({how}){error}"))
        dumps = s.get("dumps") if isinstance(s.get("dumps"), dict) else {}
        if dumps and _time(s.get("completed")) is not None:
            said = ", ".join(f"rank {r}: {v}" for r, v in sorted(
                dumps.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else -1))
            events.append(Event(_time(s.get("completed")), node, f"Flight Recorder dumps: {said}"))
    return sorted(events, key=lambda e: (e.at, e.node))


def _time(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    return float(value) if ok else None


def _stacks(docs: Mapping[str, Any]) -> list[StackGroup]:
    groups: dict[tuple[str, ...], tuple[list[int], set[str], str]] = {}
    for node, doc in docs.items():
        ranks = doc.get("ranks") if isinstance(doc, dict) else None
        for rank, stack in (ranks.items() if isinstance(ranks, dict) else ()):
            if not (isinstance(stack, dict) and str(rank).isdigit()):
                continue
            frames = tuple(
                f"{_text(f.get('function'))} ({_text(f.get('file'))}:{f.get('line')})"
                for f in stack.get("frames") or () if isinstance(f, dict)) \
                if isinstance(stack.get("frames"), list) else ()
            where = _text(stack.get("where"))
            if not frames and not where:
                continue
            entry = groups.setdefault(frames or (where,), ([], set(), where))
            entry[0].append(int(rank))
            entry[1].add(node)
    return sorted((StackGroup(tuple(sorted(r)), tuple(sorted(n)), w, k)
                   for k, (r, n, w) in groups.items()), key=lambda g: (len(g.ranks), g.ranks))


def _flight_records(incidents: list[NodeIncident], docs: Mapping[str, Mapping[str, Any]]
                    ) -> frtrace.Analysis:
    """Every node's dumps read together; a group's members from any node's ranks.json.

    The garbage collector is held off meanwhile: records hold no cycles, and rescanning a
    heap that grows by a million of them tripled the time (512 ranks of 2,000 entries: 20 s
    to 6 s on the 2-core development VM)."""
    dumps: dict[int, frtrace.Dump] = {}
    problems = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        for incident in incidents:
            names = sorted((n for n in incident.files if FR_RANK.match(n)),
                           key=lambda n: n.endswith(".json"), reverse=True)  # JSON first
            for name in names:
                rank = int(FR_RANK.match(name).group(1))  # type: ignore[union-attr]
                if rank in dumps:
                    continue
                try:
                    dumps[rank] = frtrace.parse(rank, frtrace.load(incident.files[name]))
                except frtrace.DumpError as exc:
                    problems.append(f"{incident.node}: {name}: {exc}")
        return frtrace.analyse(dumps.values(), _members(docs), problems)
    finally:
        if collecting:
            gc.enable()


def _members(docs: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[int, ...]]:
    """pg name -> its ranks, from the ranks.json of any node ("0-3,8"; cut lists are left)."""
    members: dict[str, tuple[int, ...]] = {}
    for doc in docs.values():
        ranks = doc.get(layout.RANKS)
        for group in (ranks.get("groups") or () if isinstance(ranks, dict) else ()):
            label = group.get("ranks") if isinstance(group, dict) else None
            if isinstance(label, str) and label and "..." not in label \
                    and isinstance(group.get("pg"), str):
                spans = [(int(a), int(b or a)) for a, b in SPANS.findall(label)]
                if spans and sum(b - a + 1 for a, b in spans) <= 1 << 20:
                    members[group["pg"]] = tuple(r for a, b in spans for r in range(a, b + 1))
    return members


# Text ----------------------------------------------------------------------------------------

def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return f"rank{'s' if len(ranks) != 1 else ''} {frtrace.ranges(ranks)}"


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}"


def render(report: Report) -> str:
    """The report as plain text, most telling first."""
    nodes = ", ".join(v.node for v in report.nodes) or "none"
    lines = [f"job {report.job_id}: incidents from {len(report.nodes)} node(s): {nodes}"]
    lines += [f"  missing: {m.reason if m.node in m.reason else f'{m.node}: {m.reason}'}"
              for m in report.missing]
    for section in (_culprit_lines, _fr_lines, _outlier_lines, _stack_lines, _timeline_lines,
                    _node_lines):
        part = section(report)
        lines += [""] + part if part else []
    if report.errors:
        lines += ["", "errors:"] + [f"  {e}" for e in report.errors]
    return "\n".join(map(terminal_safe, lines)) + "\n"


def terminal_safe(line: str) -> str:
    """A line of text from other machines as it may reach a terminal: control characters
    (escape sequences, a newline that fakes a line of the report) shown, never acted on."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", printable(line))


def _culprit_lines(report: Report) -> list[str]:
    c = report.culprit
    if not c.ranks:
        return [f"culprit: {c.text}"] + [f"  {note}" for note in c.notes]
    lines = [f"culprit: {_ranks(c.ranks)} ({c.cause or 'no cause'}), named by "
             f"{', '.join(c.named_by) or 'no node'}"]
    return lines + ([f"  {c.text}"] if c.text else []) + [f"  {note}" for note in c.notes]


def _fr_lines(report: Report) -> list[str]:
    if not report.fr.ranks:
        return []
    found = [f"  {line}" for line in report.fr.lines()]
    return [f"Flight Recorder ({_ranks(report.fr.ranks)}):"] + (
        found or ["  every collective matched on every rank whose dump was read"])


def _outlier_lines(report: Report) -> list[str]:
    found = [f"  {o.text}" for o in report.outliers]
    return ["counters that stand out during the stall:"] + found if found else []


def _stack_lines(report: Report) -> list[str]:
    lines = []
    for group in report.stacks:
        lines.append(f"  {_ranks(group.ranks)} on {', '.join(group.nodes)}: {group.where}")
        lines += [f"      {frame}" for frame in group.frames[:8]]
    return ["stacks (identical frames grouped):"] + lines if lines else []


def _timeline_lines(report: Report) -> list[str]:
    if not report.timeline:
        return []
    day = time.strftime("%Y-%m-%d", time.gmtime(report.timeline[0].at))
    return [f"timeline (UTC, {day}):"] + [f"  {_clock(e.at)}  {e.node}: {e.what}"
                                          for e in report.timeline]


def _node_lines(report: Report) -> list[str]:
    lines = ["nodes:"]
    for v in report.nodes:
        ranks = _ranks(v.local_ranks) if v.local_ranks else "no ranks"
        lines.append(f"  {v.node} ({v.source}): incident {v.incident}, {v.trigger}, {ranks}")
        lines += [f"    {v.verdict}"] if v.verdict else []
        lines += [f"    left out: {x}" for x in v.left_out] + [f"    error: {x}" for x in v.errors]
    return lines
