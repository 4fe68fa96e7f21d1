"""Validation of rank spool documents: typed values out, a reason for everything refused.

Spool files are written by processes the daemon does not control.  A document with the wrong
shape is refused whole (`SchemaError`, with a reason label); a bad entry inside a good
document is dropped alone; a string that becomes a label value is cut to a safe alphabet and
length.  Every drop and every sanitised value is noted, so the collector can count them.

What one document can make the daemon keep is bounded whatever it holds: process groups
(`MAX_PGS`), rank spans a group's `ranks` label shows (`MAX_SPANS`), in-flight entries
(`MAX_INFLIGHT`, the newest), and every label value's length (cut before it is even cached).
Each cut is noted by reason (`Notes.cut`) and counted in llmmon_nccl_spool_cut_total.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Container, NamedTuple

from llmmon.ranks import collectives
from llmmon_reporter.flight import ranges
from llmmon_reporter.entrylog import KIND as LOG_KIND
from llmmon_reporter.layout import MEMORY_KEYS, SCHEMA, safe_job

MAX_RANK = 1 << 20
MAX_PGS = 64
MAX_ENTRIES = 50_000
MAX_INFLIGHT = 2048  # in-flight entries kept from a state file (the newest; the ring's default)
MAX_SPANS = 64  # rank spans kept per group: the `ranks` label stays under ~1 kB
MAX_TENSORS = 1024
MAX_DIMS = 16
MAX_BUCKETS = 64
MAX_SEQ = 1 << 62
MAX_TEXT = 500
MAX_FRAMES = 64
MAX_BLOCKED = 16  # ops one rank is seen blocked in (the reporter writes at most 16)

# label field -> characters kept (others become "_") and the longest value kept
LABEL_RULES: dict[str, tuple[re.Pattern[str], int]] = {
    "pod": (re.compile(r"[^A-Za-z0-9_.-]"), 253),
    "namespace": (re.compile(r"[^a-z0-9-]"), 63),
    "uuid": (re.compile(r"[^A-Za-z0-9-]"), 80),
    "pg": (re.compile(r"[^A-Za-z0-9_.:-]"), 64),
    "pg_desc": (re.compile(r"[^A-Za-z0-9_.:-]"), 64),
    "coll": (re.compile(r"[^a-z0-9_]"), 48),
    "dtype": (re.compile(r"[^A-Za-z0-9_]"), 32),
    "allocator_config": (re.compile(r"[^A-Za-z0-9_.:,=+-]"), 256),
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NCCL_NAME = re.compile(r"NCCL_[A-Z0-9_]{1,64}")
MAX_NCCL_VARIABLES = 64  # NCCL documents about a hundred; a rank sets a handful


class SchemaError(Exception):
    def __init__(self, message: str, reason: str = "schema") -> None:
        super().__init__(message)
        self.reason = reason


class Notes:
    """Sanitised fields and dropped entries met while parsing one document."""

    def __init__(self) -> None:
        self.sanitised: Counter[str] = Counter()
        self.cut: Counter[str] = Counter()  # reason -> items left out to bound memory
        self.dropped = 0
        self.first_drop = ""

    def drop(self, message: str) -> None:
        self.dropped += 1
        self.first_drop = self.first_drop or message


# -- scalar helpers -------------------------------------------------------------------------
def _int(value: Any, what: str, low: int = 0, high: int = MAX_SEQ) -> int:
    """An integer in [low, high]; the Flight Recorder writes some as decimal strings."""
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value.strip()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SchemaError(f"{what}: expected an integer in [{low}, {high}], got {value!r:.40}")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise SchemaError(f"{what}: expected a finite number >= 0, got {value!r:.40}")
    return float(value)


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise SchemaError(f"{what}: expected true or false, got {value!r:.40}")
    return value


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SchemaError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, what: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise SchemaError(f"{what}: expected a list, got {type(value).__name__}")
    if len(value) > limit:
        raise SchemaError(f"{what}: {len(value)} items, more than {limit}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(f"{what}: expected a string, got {type(value).__name__}")
    return value


@functools.lru_cache(maxsize=4096)
def _clean(field: str, text: str) -> str:
    pattern, limit = LABEL_RULES[field]
    return pattern.sub("_", text)[:limit]


def label(value: Any, field: str, notes: Notes) -> str:
    """A string made safe as the value of label `field` (counted when it had to change)."""
    text = _str(value, field)
    cleaned = _clean(field, text[:LABEL_RULES[field][1] + 1])  # the cache holds short keys
    if cleaned != text:
        notes.sanitised[field] += 1
    return cleaned


def text(value: Any, what: str) -> str:
    """Free text for the JSON API and logs: no control characters, bounded length."""
    return _CONTROL.sub(" ", _str(value, what))[:MAX_TEXT]


# -- documents ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Identity:
    job_id: str
    rank: int
    local_rank: int
    world_size: int
    pod: str
    namespace: str
    pid: int
    uuid: str
    gpu_name: str
    allocator_config: str
    start_ticks: int = 0  # /proc/<pid>/stat starttime: tells this process from a reused pid
    # the rank's NCCL_* variables as its reporter sends them; None: not sent (no reporter)
    nccl_env: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True)
class Progress:
    enqueued: int
    started: int
    completed: int


@dataclass(frozen=True)
class Group:
    desc: str
    size: int
    ranks: tuple[tuple[int, int], ...]  # inclusive spans; empty when unknown
    spans_cut: bool = False  # more spans than MAX_SPANS: `ranks` holds the first ones


@dataclass(frozen=True)
class Health:
    errors_total: int
    disabled: bool
    disabled_reason: str
    last_error: str
    fr_api: str


@dataclass(frozen=True)
class Steps:
    steps: int
    tokens: float
    model_flops: float
    loss_nonfinite: int
    buckets: tuple[float, ...]
    counts: tuple[int, ...]  # per bucket, not cumulative; one more than buckets (+Inf)
    seconds_sum: float


class Collective(NamedTuple):
    """One Flight Recorder entry (a tuple: tens of thousands are built per spool read)."""

    record_id: int
    pg: str
    seq: int
    is_p2p: bool
    coll: str
    dtype: str
    nbytes: int | None
    created_ns: int
    duration: float | None  # seconds; only with TORCH_NCCL_ENABLE_TIMING
    state: str
    retired: bool


@dataclass(frozen=True)
class FrDump:
    groups: dict[str, Group]
    progress: dict[str, Progress]
    entries: tuple[Collective, ...]
    first_record: int = -1  # record ids the ring held, parsed or not (-1: no entries)
    last_record: int = -1
    cut_record: int = -1  # the reporter shipped none of the ring's records before this one


@dataclass(frozen=True)
class Activity:
    """The reporter's counters of its own process (main-thread CPU, I/O, switches)."""

    cpu_seconds: float
    read_bytes: int
    written_bytes: int
    voluntary_switches: int
    involuntary_switches: int
    cpu_active: float  # Unix time the training thread last used CPU
    io_active: float  # Unix time the process last moved bytes


class Frame(NamedTuple):
    file: str
    line: int
    function: str
    module: str


class PeerWait(NamedTuple):
    """A torch.distributed op the training thread was blocked in (llmmon_reporter.blocked):
    the only evidence of a p2p wait on gloo, whose Flight Recorder records none."""

    op: str  # send, recv, or a collective's name
    peer: int | None  # global rank; None for a collective or a receive from any source
    pg: str


@dataclass(frozen=True)
class Exit:
    """How the process ended, as its reporter wrote at interpreter exit."""

    at: float  # Unix time
    how: str  # exit or exception
    code: int
    error: str
    collective: Collective | None = None  # an exception's newest record (ranks.failure)


@dataclass(frozen=True)
class RankState:
    identity: Identity
    written_ns: int
    health: Health
    groups: dict[str, Group]
    progress: dict[str, Progress]
    memory: dict[str, int] | None
    steps: Steps | None
    inflight: FrDump | None
    activity: Activity | None = None
    stack: tuple[Frame, ...] | None = None  # innermost first; only while nothing completes
    exit: Exit | None = None
    blocked: tuple[PeerWait, ...] = ()  # with `stack`: the op it waits in, when it shows one


@dataclass(frozen=True)
class RankEntries:
    job_id: str
    rank: int
    pid: int
    written_ns: int
    dump: FrDump


def _load(data: bytes, kind: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise SchemaError(f"not JSON: {str(exc)[:120]}", "invalid_json") from None
    doc = _obj(doc, "document")
    if doc.get("schema") != SCHEMA or doc.get("kind") != kind:
        raise SchemaError(f"not a schema-{SCHEMA} {kind} document "
                          f"(schema={doc.get('schema')!r:.20}, kind={doc.get('kind')!r:.20})")
    return doc


def _job(value: Any, notes: Notes) -> str:
    raw = _str(value, "job_id")
    job = safe_job(raw)
    if job != raw:
        notes.sanitised["job_id"] += 1
    return job


def _identity(raw: Any, notes: Notes) -> Identity:
    doc = _obj(raw, "identity")
    world = _int(doc.get("world_size"), "world_size", 1, MAX_RANK)
    rank = _int(doc.get("rank"), "rank", 0, world - 1)
    return Identity(
        job_id=_job(doc.get("job_id"), notes),
        rank=rank,
        local_rank=_int(doc.get("local_rank"), "local_rank", 0, MAX_RANK),
        world_size=world,
        pod=label(doc.get("pod", ""), "pod", notes),
        namespace=label(doc.get("namespace", ""), "namespace", notes),
        pid=_int(doc.get("pid"), "pid", 1, 1 << 31),
        uuid=label(doc.get("uuid", ""), "uuid", notes),
        gpu_name=text(doc.get("gpu_name", ""), "gpu_name"),
        allocator_config=label(doc.get("allocator_config", ""), "allocator_config", notes),
        start_ticks=_int(doc.get("start_ticks", 0), "start_ticks"),
        nccl_env=None if doc.get("nccl_env") is None else _nccl_env(doc["nccl_env"]),
    )


def _nccl_env(raw: Any) -> tuple[tuple[str, str], ...]:
    """NCCL_* names and their values; other names are dropped, and the count is capped."""
    doc = _obj(raw, "nccl_env")
    out = []
    for name, value in list(doc.items())[:MAX_NCCL_VARIABLES]:
        if isinstance(name, str) and _NCCL_NAME.fullmatch(name):
            out.append((name, text(value, name)))
    return tuple(sorted(out))


def _health(raw: Any) -> Health:
    doc = _obj(raw, "reporter")
    return Health(errors_total=_int(doc.get("errors_total", 0), "errors_total"),
                  disabled=_bool(doc.get("disabled", False), "disabled"),
                  disabled_reason=text(doc.get("disabled_reason", ""), "disabled_reason"),
                  last_error=text(doc.get("last_error", ""), "last_error"),
                  fr_api=text(doc.get("fr_api") or "", "fr_api"))


def _group(desc: str, size: int, spans: list[Any], notes: Notes) -> Group:
    """A group whose rank spans are cut to MAX_SPANS (noted), however many it lists."""
    cut = len(spans) > MAX_SPANS
    if cut:
        notes.cut["rank_spans"] += 1
    return Group(desc, size, tuple((int(a), int(b)) for a, b in spans[:MAX_SPANS]), cut)


def _spans(raw: Any) -> list[tuple[int, int]]:
    spans = []
    for item in _list(raw, "ranks", MAX_RANK)[:MAX_SPANS + 1]:
        pair = _list(item, "ranks span", 2)
        if len(pair) != 2:
            raise SchemaError("ranks: expected [first, last] spans")
        first, last = (_int(v, "rank", 0, MAX_RANK) for v in pair)
        spans.append((first, last))
    return spans


def _groups(raw: Any, notes: Notes) -> dict[str, Group]:
    """The reporter's own group list: {name: {desc, size, ranks: [[first, last], ...]}}."""
    groups, listed = {}, _obj(raw, "pgs")
    for name, value in listed.items():
        if len(groups) >= MAX_PGS:
            notes.cut["groups"] += len(listed) - MAX_PGS
            break
        doc = _obj(value, f"pgs.{name:.40}")
        groups[label(name, "pg", notes)] = _group(label(doc.get("desc", ""), "pg_desc", notes),
                                                  _int(doc.get("size"), "size", 1, MAX_RANK),
                                                  _spans(doc.get("ranks", [])), notes)
    return groups


def _config_groups(raw: Any, notes: Notes) -> dict[str, Group]:
    """Flight Recorder pg_config: {key: {name, desc, ranks: "[0, 1]"}} (gloo leaves it empty)."""
    groups, listed = {}, _obj(raw or {}, "pg_config")
    for value in listed.values():
        if len(groups) >= MAX_PGS:
            notes.cut["groups"] += len(listed) - MAX_PGS
            break
        doc = _obj(value, "pg_config entry")
        name = label(doc.get("name", ""), "pg", notes)
        ranks_text = doc.get("ranks", "")
        if not name or not isinstance(ranks_text, str) or len(ranks_text) > 1_000_000:
            continue
        try:
            members = sorted({_int(r, "rank", 0, MAX_RANK) for r in json.loads(ranks_text)})
        except (ValueError, TypeError, SchemaError):
            notes.drop(f"pg_config {name}: unreadable ranks {ranks_text[:40]!r}")
            continue
        if members:
            groups[name] = _group(label(doc.get("desc", ""), "pg_desc", notes), len(members),
                                  ranges(members), notes)
    return groups


def _pg_ids(raw: Any, notes: Notes) -> dict[str, str] | None:
    """The reporter's map of Flight Recorder group ids to group names (None: a reporter that
    ships none, whose progress stays keyed as torch wrote it)."""
    if raw is None:
        return None
    names, listed = {}, _obj(raw, "pg_ids")
    for pg_id, name in list(listed.items())[:MAX_PGS]:
        names[str(_int(pg_id, "pg_ids key", 0, MAX_SEQ))] = label(name, "pg", notes)
    if len(listed) > MAX_PGS:
        notes.cut["groups"] += len(listed) - MAX_PGS
    return names


def _entry_pg_ids(items: list[Any], notes: Notes) -> dict[str, str]:
    """Group id -> name as the records of a dump pair them (each carries both)."""
    names: dict[str, str] = {}
    for item in items:
        group = item.get("process_group") if isinstance(item, dict) else None
        pg_id = item.get("pg_id") if isinstance(item, dict) else None
        if type(pg_id) is int and isinstance(group, list) and group \
                and isinstance(group[0], str) and str(pg_id) not in names \
                and len(names) < MAX_PGS:
            names[str(pg_id)] = label(group[0], "pg", notes)
    return names


def _named(by_id: dict[str, Any], names: dict[str, str] | None,
           notes: Notes | None) -> dict[str, Any]:
    """`by_id` keyed by group name instead of Flight Recorder group id (torch keys pg_status
    by the group's id in each process, which differs between the members of a mesh's groups:
    llmmon_reporter.groupids).  An id with no known name is left out and noted: joined to
    other ranks under its id it would mix different groups (`notes`: None where that is
    expected, as in a dump whose progress only serves its own records)."""
    if names is None:
        return by_id
    named = {}
    for pg_id, value in by_id.items():
        if pg_id in names:
            named[names[pg_id]] = value
        elif notes is not None:
            notes.cut["unnamed_group"] += 1
    return named


def _progress(raw: Any, notes: Notes) -> dict[str, Progress]:
    progress, listed = {}, _obj(raw or {}, "pg_status")
    for name, value in listed.items():
        if len(progress) >= MAX_PGS:
            notes.cut["groups"] += len(listed) - MAX_PGS
            break
        doc = _obj(value, f"pg_status.{name:.40}")
        progress[label(name, "pg", notes)] = Progress(
            _int(doc.get("last_enqueued_collective"), "last_enqueued_collective", -1),
            _int(doc.get("last_started_collective", -1), "last_started_collective", -1),
            _int(doc.get("last_completed_collective"), "last_completed_collective", -1))
    return progress


def _settle(progress: dict[str, Progress], raw: Any, names: dict[str, str] | None,
            notes: Notes) -> dict[str, Progress]:
    """Progress with the reporter's `settled` sequence numbers: records its ring showed final
    although pg_status' completed number lags (gloo updates it out of order).  A number past
    what the group enqueued settles nothing."""
    settled = {label(pg, "pg", notes): _int(seq, f"settled.{pg:.40}", -1)
               for pg, seq in list(_obj(raw or {}, "settled").items())[:MAX_PGS]}
    settled = _named(settled, names, notes)
    return {pg: dataclasses.replace(p, completed=settled[pg])
            if p.completed < settled.get(pg, -1) <= p.enqueued else p
            for pg, p in progress.items()}


def _tensors(sizes: Any, dtypes: Any, what: tuple[str, str, str, str]
             ) -> tuple[list[list[int]], list[str]]:
    """Shapes and dtype names; `what` names the sizes list, a shape, a dim and the dtypes."""
    shapes = [[_int(d, what[2], 0, 1 << 40) for d in _list(s, what[1], MAX_DIMS)]
              for s in _list(sizes, what[0], MAX_TENSORS)]
    names = [_str(d, what[3]) for d in _list(dtypes, what[3], MAX_TENSORS)]
    return shapes, names


_INPUT = ("input_sizes", "input shape", "input dim", "input_dtypes")
_OUTPUT = ("output_sizes", "output shape", "output dim", "output_dtypes")
_STATES = frozenset(("scheduled", "started", "completed"))


def collective(raw: Any, notes: Notes) -> Collective:
    """One Flight Recorder entry; raises SchemaError when a field has the wrong type."""
    entry = _obj(raw, "entry")
    group = entry.get("process_group")
    if isinstance(group, list) and group and isinstance(group[0], str):
        pg = label(group[0], "pg", notes)
    else:
        pg = str(_int(entry.get("pg_id"), "pg_id"))
    is_p2p = _bool(entry.get("is_p2p", False), "is_p2p")
    seq = _int(entry.get("p2p_seq_id" if is_p2p else "collective_seq_id"), "seq", -1)
    coll = label(collectives.coll_name(_str(entry.get("profiling_name"), "profiling_name")[:200]),
                 "coll", notes)
    inputs = _tensors(entry.get("input_sizes", []), entry.get("input_dtypes", []), _INPUT)
    outputs = _tensors(entry.get("output_sizes", []), entry.get("output_dtypes", []), _OUTPUT)
    state = entry.get("state", "")
    nbytes, dtype = collectives.payload(coll, inputs, outputs)
    duration_ms = entry.get("duration_ms")
    return Collective(
        record_id=_int(entry.get("record_id"), "record_id"),
        pg=pg, seq=seq, is_p2p=is_p2p, coll=coll,
        dtype=label(dtype, "dtype", notes), nbytes=nbytes,
        created_ns=_int(entry.get("time_created_ns"), "time_created_ns"),
        duration=None if duration_ms is None else _number(duration_ms, "duration_ms") / 1000,
        state=state if state in _STATES else text(state, "state")[:16],
        retired=_bool(entry.get("retired", False), "retired"))


def fr_dump(raw: Any, notes: Notes, known: Container[int] = (),
            keep: int = MAX_ENTRIES, names: dict[str, str] | None = None) -> FrDump:
    """A dump; entries whose record_id is in `known` (counted before) are not parsed again,
    and only the newest `keep` entries are (the others are noted as cut).  Its pg_status is
    keyed by group name, through `names` (the reporter's map) and its own records' pairs."""
    doc = _obj(raw, "dump")
    entries, ids = [], []
    items = _list(doc.get("entries", []), "entries", MAX_ENTRIES)
    if len(items) > keep:
        notes.cut["inflight_entries"] += len(items) - keep
        items = items[-keep:]
    for item in items:
        record = item.get("record_id") if isinstance(item, dict) else None
        if isinstance(record, int) and not isinstance(record, bool) and record >= 0:
            ids.append(record)
            if record in known:
                continue
        try:
            entries.append(collective(item, notes))
        except SchemaError as exc:
            notes.drop(f"entry: {exc}")
    paired = _entry_pg_ids(items, notes)
    if paired or names is not None:
        names = {**paired, **(names or {})}
    return FrDump(_config_groups(doc.get("pg_config"), notes),
                  _named(_progress(doc.get("pg_status"), notes), names, None), tuple(entries),
                  min(ids, default=-1), max(ids, default=-1))


def _steps(raw: Any) -> Steps | None:
    if raw is None:
        return None
    doc = _obj(raw, "step")
    seconds = _obj(doc.get("seconds"), "step.seconds")
    buckets = tuple(_number(b, "bucket") for b in _list(seconds.get("buckets"), "buckets",
                                                        MAX_BUCKETS))
    counts = tuple(_int(c, "count") for c in _list(seconds.get("counts"), "counts",
                                                   MAX_BUCKETS + 1))
    if len(counts) != len(buckets) + 1 or list(buckets) != sorted(set(buckets)):
        raise SchemaError("step.seconds: buckets must increase and counts have one more")
    return Steps(steps=_int(doc.get("steps"), "steps"),
                 tokens=_number(doc.get("tokens", 0), "tokens"),
                 model_flops=_number(doc.get("model_flops", 0), "model_flops"),
                 loss_nonfinite=_int(doc.get("loss_nonfinite", 0), "loss_nonfinite"),
                 buckets=buckets, counts=counts,
                 seconds_sum=_number(seconds.get("sum"), "seconds.sum"))


def _activity(raw: Any) -> Activity | None:
    if raw is None:
        return None
    doc = _obj(raw, "activity")
    return Activity(
        cpu_seconds=_number(doc.get("cpu_seconds"), "cpu_seconds"),
        read_bytes=_int(doc.get("read_bytes"), "read_bytes"),
        written_bytes=_int(doc.get("written_bytes"), "written_bytes"),
        voluntary_switches=_int(doc.get("voluntary_switches"), "voluntary_switches"),
        involuntary_switches=_int(doc.get("involuntary_switches"), "involuntary_switches"),
        cpu_active=_int(doc.get("cpu_active_ns"), "cpu_active_ns") / 1e9,
        io_active=_int(doc.get("io_active_ns"), "io_active_ns") / 1e9)


def _stack(raw: Any) -> tuple[Frame, ...] | None:
    if raw is None:
        return None
    return tuple(Frame(text(_obj(f, "frame").get("file", ""), "file"),
                       _int(f.get("line", 0), "line", 0, 1 << 31),
                       text(f.get("function", ""), "function"),
                       text(f.get("module", ""), "module"))
                 for f in _list(raw, "stack", MAX_FRAMES))


def _blocked(raw: Any, notes: Notes) -> tuple[PeerWait, ...]:
    """The ops the reporter saw the thread blocked in; a bad item is dropped alone, and more
    than MAX_BLOCKED are cut."""
    if not isinstance(raw, list):
        if raw is not None:
            notes.drop(f"blocked: expected a list, got {type(raw).__name__}")
        return ()
    if len(raw) > MAX_BLOCKED:
        notes.cut["blocked"] += len(raw) - MAX_BLOCKED
    waits = []
    for item in raw[:MAX_BLOCKED]:
        try:
            doc = _obj(item, "blocked item")
            peer = doc.get("peer")
            waits.append(PeerWait(label(doc.get("op"), "coll", notes),
                                  None if peer is None else _int(peer, "peer", 0, MAX_RANK),
                                  label(doc.get("pg"), "pg", notes)))
        except SchemaError as exc:
            notes.drop(f"blocked: {exc}")
    return tuple(waits)


def _exit(raw: Any, notes: Notes) -> Exit | None:
    if raw is None:
        return None
    doc = _obj(raw, "exit")
    inside = None
    if doc.get("collective") is not None:
        try:
            inside = collective(doc["collective"], notes)
        except SchemaError as exc:  # the end itself still counts
            notes.drop(f"exit.collective: {exc}")
    return Exit(at=_int(doc.get("ns"), "exit.ns") / 1e9, how=text(doc.get("how", ""), "how")[:16],
                code=_int(doc.get("code"), "exit.code", -255, 255),
                error=text(doc.get("error", ""), "exit.error"), collective=inside)


def _memory(raw: Any) -> dict[str, int] | None:
    """The allocator numbers we export; other memory_stats() keys are ignored."""
    if raw is None:
        return None
    stats = _obj(raw, "memory")
    return {key: _int(stats[key], f"memory.{key}") for key in MEMORY_KEYS if key in stats}


def parse_state(data: bytes, notes: Notes) -> RankState:
    """A reporter's state file (written every status interval)."""
    doc = _load(data, "state")
    status = _obj(doc.get("status") or {}, "status")
    inflight = doc.get("inflight")
    names = _pg_ids(doc.get("pg_ids"), notes)
    return RankState(
        identity=_identity(doc.get("identity"), notes),
        written_ns=_int(doc.get("written_ns"), "written_ns"),
        health=_health(doc.get("reporter", {})),
        groups=_groups(doc.get("pgs") or {}, notes) or _config_groups(status.get("pg_config"),
                                                                       notes),
        progress=_settle(_named(_progress(status.get("pg_status"), notes), names, notes),
                         doc.get("settled"), names, notes),
        memory=_memory(doc.get("memory")),
        steps=_steps(doc.get("step")),
        inflight=None if inflight is None else fr_dump(inflight, notes, keep=MAX_INFLIGHT,
                                                       names=names),
        activity=_activity(doc.get("activity")),
        stack=_stack(doc.get("stack")),
        exit=_exit(doc.get("exit"), notes),
        blocked=_blocked(doc.get("blocked"), notes))


def parse_log_header(line: bytes, notes: Notes) -> tuple[str, int, int]:
    """The first line of an entries log (llmmon_reporter/entrylog.py): job, rank and pid."""
    who = _obj(_load(line, LOG_KIND).get("identity"), "identity")
    return (_job(who.get("job_id"), notes), _int(who.get("rank"), "rank", 0, MAX_RANK),
            _int(who.get("pid"), "pid", 1, 1 << 31))


def parse_segment(line: bytes, notes: Notes, known: Container[int] = ()) -> tuple[int, FrDump]:
    """One segment line of an entries log: when it was written, and its records as a dump
    whose record range is the ring's (as the reporter saw it), not the records it carries."""
    try:
        doc = _obj(json.loads(line), "segment")
    except (ValueError, RecursionError) as exc:
        raise SchemaError(f"not JSON: {str(exc)[:120]}", "invalid_json") from None
    first = _int(doc.get("first_record"), "first_record", -1)
    last = _int(doc.get("last_record"), "last_record", -1)
    if (first < 0) != (last < 0) or last < first:
        raise SchemaError(f"record range [{first}, {last}] is not a range")
    cut = -1 if doc.get("cut_record") is None else _int(doc["cut_record"], "cut_record")
    if cut >= 0 and not first < cut <= last:
        raise SchemaError(f"cut_record {cut} is not inside the record range [{first}, {last}]")
    dump = fr_dump({"pg_status": doc.get("pg_status"), "entries": doc.get("entries", [])},
                   notes, known)
    return (_int(doc.get("written_ns"), "written_ns"),
            dataclasses.replace(dump, first_record=first, last_record=last, cut_record=cut))


def parse_entries(data: bytes, notes: Notes, known: Container[int] = ()) -> RankEntries:
    """A whole-ring entries document (reporters before the entries log)."""
    doc = _load(data, "entries")
    who = _obj(doc.get("identity"), "identity")
    return RankEntries(job_id=_job(who.get("job_id"), notes),
                       rank=_int(who.get("rank"), "rank", 0, MAX_RANK),
                       pid=_int(who.get("pid"), "pid", 1, 1 << 31),
                       written_ns=_int(doc.get("written_ns"), "written_ns"),
                       dump=fr_dump(doc.get("dump"), notes, known))
