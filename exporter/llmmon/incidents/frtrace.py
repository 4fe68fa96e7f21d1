"""Every rank's Flight Recorder dump read together: who never entered the collective the others
wait in, who entered a different one, and which receive has no send.

What torch's `fr_trace` tells, computed here so that `llmmon incident` needs no torch.  Groups
are joined across ranks by their name, description and members, never by `pg_id`: that id is
each process's own (on a 2x2 mesh, id 1 is rank 0's dp group {0,2} and rank 1's {1,3}).
Dumps come from other machines and may be hostile: size-capped, pickles read with no global
allowed, every field type-checked (a bad entry is skipped and counted, never raised).
"""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

MAX_BYTES = 64 << 20  # an NCCL dump of 20,000 entries with stacks is ~10 MB
MAX_ENTRIES = 100_000
MAX_DIMS = 64  # tensors per entry kept for comparison
PICKLE = b"\x80"  # PROTO, the first opcode of torch's pickles (2+); JSON never starts with it
# ops whose inputs may differ in shape between ranks and still match (uneven splits, roots)
UNEVEN = frozenset({"all_to_all", "all_to_allv", "alltoall", "alltoall_base", "gather",
                    "scatter", "coalesced", "barrier"})


class DumpError(ValueError):
    """A dump that cannot be read at all (too big, not JSON nor a plain pickle, not a dict)."""


class _NoGlobals(pickle.Unpickler):
    """A Flight Recorder pickle is dicts, lists, tuples, strings and numbers: any global is
    an attack (it is how a pickle runs code), so every one is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def load(data: bytes) -> dict[str, Any]:
    """A dump's document from its bytes: torch's FR JSON, or the pickle ProcessGroupNCCL writes."""
    if len(data) > MAX_BYTES:
        raise DumpError(f"{len(data)} bytes, over the {MAX_BYTES >> 20} MiB cap")
    try:
        if data[:1] == PICKLE:
            doc = _NoGlobals(io.BytesIO(data)).load()
        else:
            doc = json.loads(data)
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, IndexError,
            RecursionError, MemoryError, AttributeError, KeyError) as exc:
        raise DumpError(f"not a Flight Recorder dump: {exc}") from None
    if not isinstance(doc, dict):
        raise DumpError(f"not a Flight Recorder dump: a {type(doc).__name__}, not a dict")
    return doc


@dataclass(frozen=True, slots=True)
class Record:
    """One entry of one rank's ring, reduced to what matching needs."""

    rank: int
    group: str  # the group's name, job-wide
    desc: str
    op: str  # "all_reduce", "send", "recv" (the backend prefix dropped)
    seq: int  # collective_seq_id
    p2p_seq: int
    is_p2p: bool
    peer: tuple[int, int] | None  # p2p: (src, dst), ranks within the group
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    done: bool  # completed, or retired by a backend that never marks completion (gloo)


@dataclass
class Dump:
    """One rank's dump: its records and the members of the groups its pg_config names."""

    rank: int
    records: list[Record] = field(default_factory=list)
    members: dict[str, tuple[int, ...]] = field(default_factory=dict)
    skipped: int = 0  # entries of the wrong shape


def parse(rank: int, doc: Mapping[str, Any]) -> Dump:
    """A loaded dump's records; entries that are not what torch writes are counted, not read."""
    dump = Dump(rank)
    config = doc.get("pg_config")
    for group in (config.values() if isinstance(config, dict) else ()):
        members = _members(group.get("ranks")) if isinstance(group, dict) else None
        name = group.get("name") if isinstance(group, dict) else None
        if isinstance(name, str) and name and members:
            dump.members[name] = members
    entries = doc.get("entries")
    entries = entries[:MAX_ENTRIES] if isinstance(entries, list) else []
    for entry in entries:
        record = _record(rank, entry)
        if record is None:
            dump.skipped += 1
        else:
            dump.records.append(record)
    return dump


def _members(value: Any) -> tuple[int, ...] | None:
    """pg_config's ranks: a JSON list inside a string ("[0, 1]"), or a list."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if len(value) < 1 << 20 else None
        except ValueError:
            return None
    if isinstance(value, list) and all(type(r) is int and r >= 0 for r in value):
        return tuple(sorted(set(value)))
    return None


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _record(rank: int, entry: Any) -> Record | None:
    if not isinstance(entry, dict):
        return None
    group, name = entry.get("process_group"), entry.get("profiling_name")
    seq, p2p_seq = _int(entry.get("collective_seq_id")), _int(entry.get("p2p_seq_id"))
    if not (isinstance(group, (list, tuple)) and len(group) == 2
            and all(isinstance(g, str) for g in group) and isinstance(name, str)
            and seq is not None and p2p_seq is not None):
        return None
    op, _, meta = name.split(":", 1)[-1].partition(" ")
    sizes, dtypes = entry.get("input_sizes"), entry.get("input_dtypes")
    if not (isinstance(sizes, list) and isinstance(dtypes, list)):
        return None
    shape = tuple(tuple(d for d in s if type(d) is int) if isinstance(s, list) else ()
                  for s in sizes[:MAX_DIMS])
    state, retired = entry.get("state"), entry.get("retired")
    return Record(rank, group[0], group[1], op, seq, p2p_seq,
                  entry.get("is_p2p") is True or op in ("send", "recv"), _peer(op, meta),
                  shape, tuple(str(d) for d in dtypes[:MAX_DIMS]),
                  state == "completed" or retired is True)


def _peer(op: str, meta: str) -> tuple[int, int] | None:
    """"send 1->2" is (1, 2), "recv 3<-0" is (0, 3): (src, dst) within the group."""
    arrow = {"send": "->", "recv": "<-"}.get(op)
    if not arrow or arrow not in meta:
        return None
    left, right = meta.split(arrow, 1)
    if not (left.isdigit() and right.isdigit()):
        return None
    return (int(left), int(right)) if op == "send" else (int(right), int(left))


@dataclass(frozen=True)
class Group:
    """A process group as the dumps show it, job-wide."""

    name: str
    desc: str
    members: tuple[int, ...]
    last: dict[int, int]  # rank -> the newest collective seq it entered (-1: none in its ring)

    @property
    def label(self) -> str:
        shown = self.desc if self.desc and self.desc != "undefined" else self.name
        return f"group {shown} (ranks {ranges(self.members)})"


@dataclass(frozen=True)
class Finding:
    """One thing the dumps show, with its sentence."""

    kind: str  # "missing", "unread" (a member whose dump is absent), "desync" or "p2p"
    group: str  # name
    desc: str
    members: tuple[int, ...]
    seq: int  # collective seq, or p2p seq for "p2p"
    op: str
    ranks: tuple[int, ...]  # missing or unread ranks; those that differ; the silent peer
    waiting: tuple[int, ...]  # ranks inside the collective (or the p2p op) that do not return
    text: str


@dataclass(frozen=True)
class Analysis:
    """The dumps of a job read together."""

    ranks: tuple[int, ...]  # whose dump was read
    groups: tuple[Group, ...]
    findings: tuple[Finding, ...]
    culprits: tuple[int, ...]  # ranks others wait for that wait in nothing themselves
    errors: tuple[str, ...]

    def json(self) -> dict[str, Any]:
        doc = asdict(self)
        for group in doc["groups"]:
            group["last"] = {str(k): v for k, v in group["last"].items()}
        return doc

    def lines(self) -> list[str]:
        """One sentence per finding; errors after."""
        return [f.text for f in self.findings] + [f"dumps: {e}" for e in self.errors]


def analyse(dumps: Iterable[Dump], hints: Mapping[str, Iterable[int]] | None = None,
            errors: Iterable[str] = ()) -> Analysis:
    """Match every rank's records group by group.  `hints` names a group's members where no
    dump's pg_config does (gloo leaves it empty; ranks.json knows them)."""
    dumps = {d.rank: d for d in dumps}
    errors = list(errors) + [f"rank {d.rank}: {d.skipped} entries not understood"
                             for d in dumps.values() if d.skipped]
    groups = _groups(dumps, {k: tuple(sorted(set(v))) for k, v in (hints or {}).items()})
    findings: list[Finding] = []
    for group, records in groups:
        findings += _collectives(group, records, set(dumps))
        findings += _p2p(group, records, set(dumps))
    waiting = {r.rank for _, records in groups for r in records if not r.done}
    culprits = sorted({r for f in findings if f.kind in ("missing", "p2p") for r in f.ranks}
                      - waiting)
    return Analysis(tuple(sorted(dumps)), tuple(g for g, _ in groups), tuple(findings),
                    tuple(culprits), tuple(errors))


def _groups(dumps: dict[int, Dump], hints: dict[str, tuple[int, ...]]
            ) -> list[tuple[Group, list[Record]]]:
    """Records by group, a group being (name, desc, members).  Members come from the rank's
    own pg_config, else the hints, else every rank with a record of that name and desc."""
    by_key: dict[tuple[str, str, tuple[int, ...] | None], list[Record]] = {}
    for dump in dumps.values():
        for record in dump.records:
            members = dump.members.get(record.group) or hints.get(record.group)
            by_key.setdefault((record.group, record.desc, members), []).append(record)
    out = []
    for (name, desc, members), records in sorted(by_key.items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2] or ())):
        newest: dict[int, int] = {}
        for r in records:
            if not r.is_p2p and r.seq > newest.get(r.rank, -1):
                newest[r.rank] = r.seq
        members = members or tuple(sorted({r.rank for r in records}))
        last = {rank: newest.get(rank, -1) for rank in members if rank in dumps}
        out.append((Group(name, desc, members, last), records))
    return out


def _collectives(group: Group, records: list[Record], loaded: set[int]) -> list[Finding]:
    """Per collective seq: members that never reached it while others wait in it (the first
    such seq only: later ones follow from it), and members that entered a different one."""
    seqs: dict[int, dict[int, Record]] = {}
    for record in records:
        if not record.is_p2p:
            seqs.setdefault(record.seq, {})[record.rank] = record
    findings: list[Finding] = []
    hung = False
    unread = tuple(r for r in group.members if r not in loaded)
    for seq in sorted(seqs):
        present = seqs[seq]
        findings += _desync(group, seq, present)
        missing = tuple(r for r in group.members if r in loaded and r not in present
                        and group.last.get(r, -1) < seq)
        waiting = tuple(r for r, rec in sorted(present.items()) if not rec.done)
        if (missing or unread) and waiting and not hung:
            hung = True
            op = present[waiting[0]].op
            wait = f"{_ranks(waiting)} {_verb(waiting, 'wait')} in"
            if missing:
                text = f"{_ranks(missing)} never entered {op} #{seq} of {group.label}; {wait} it"
            else:
                text = (f"{wait} {op} #{seq} of {group.label}; no dump of "
                        f"{_ranks(unread)} was read")
            findings.append(Finding("missing" if missing else "unread", group.name, group.desc,
                                    group.members, seq, op, missing or unread, waiting, text))
    return findings


def _desync(group: Group, seq: int, present: dict[int, Record]) -> list[Finding]:
    """Ranks in the same collective seq with another op, other input sizes or dtypes."""
    variants: dict[tuple[Any, ...], list[int]] = {}
    for rank, rec in sorted(present.items()):
        sizes = None if rec.op in UNEVEN else rec.sizes
        variants.setdefault((rec.op, sizes, rec.dtypes), []).append(rank)
    if len(variants) < 2:
        return []
    ordered = sorted(variants.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    tie = len(ordered[0][1]) == len(ordered[1][1])
    odd = tuple(sorted(r for _, ranks in (ordered if tie else ordered[1:]) for r in ranks))
    what = "; ".join(f"{_ranks(ranks)} {op} {_shape(present[ranks[0]])}"
                     for (op, _, _), ranks in ordered)
    majority = ordered[0][0][0]
    text = f"desync in {majority} #{seq} of {group.label}: {what}"
    waiting = tuple(r for r, rec in sorted(present.items()) if not rec.done)
    return [Finding("desync", group.name, group.desc, group.members, seq, majority, odd,
                    waiting, text)]


def _p2p(group: Group, records: list[Record], loaded: set[int]) -> list[Finding]:
    """A send or receive in flight whose peer has no matching one: paired by p2p_seq_id as
    ProcessGroupNCCL numbers them, else by any counterpart in flight between the two."""
    ops = [r for r in records if r.is_p2p and r.peer is not None
           and all(0 <= p < len(group.members) for p in r.peer)]
    posted = {(r.op, r.peer, r.p2p_seq) for r in ops} | {(r.op, r.peer) for r in ops
                                                          if not r.done}
    found = (_unmatched(group, rec, posted, loaded) for rec in sorted(
        ops, key=lambda r: (r.rank, r.p2p_seq)) if not rec.done)
    return [f for f in found if f is not None]


def _unmatched(group: Group, rec: Record, posted: set[tuple[Any, ...]], loaded: set[int]
               ) -> Finding | None:
    src, dst = (group.members[p] for p in rec.peer or ())
    peer, other = (dst, "recv") if rec.op == "send" else (src, "send")
    if peer not in loaded or (other, rec.peer, rec.p2p_seq) in posted \
            or (other, rec.peer) in posted:
        return None
    way = f"to rank {peer}" if rec.op == "send" else f"from rank {peer}"
    text = (f"rank {rec.rank} waits in {rec.op} #{rec.p2p_seq} {way} of {group.label}; "
            f"rank {peer} never {'received' if other == 'recv' else 'sent'} it")
    return Finding("p2p", group.name, group.desc, group.members, rec.p2p_seq, rec.op, (peer,),
                   (rec.rank,), text)


def _shape(rec: Record) -> str:
    sizes = ",".join("x".join(map(str, s)) or "scalar" for s in rec.sizes)
    return f"[{sizes}] {'/'.join(sorted(set(rec.dtypes))) or '-'}"


def _verb(ranks: tuple[int, ...], verb: str) -> str:
    return verb + ("s" if len(ranks) == 1 else "")


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return f"rank{'s' if len(ranks) != 1 else ''} {ranges(ranks)}"


def ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    spans: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if spans and spans[-1][1] == rank - 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)
