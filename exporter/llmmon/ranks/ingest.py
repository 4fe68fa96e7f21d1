"""One pass over the spool: pick each rank's current files, parse them, feed the ledger.

Each file version is parsed once (keyed by inode, mtime and size) and each problem reported
once per version, so a bad file sitting in the spool is one error, not one per run.  A rank
claimed by two fresh files keeps the newer one; files of ranks gone for `drop_after` are
deleted (the spool is the daemon's tmpfs, it must not fill up with dead jobs).

Changed files are parsed in the scan's order (round-robin over jobs, each job's newest first)
until `max_read_bytes` have been read or `max_parse_seconds` spent in the run; the rest wait
for the next run, so no spool, however large, makes a run outlast its timeout and starve the
others (the first changed file of a run is always read: every run makes progress).
Parses are kept only as far as they are needed again: an entries file's only its stamp (its
records are counted), a state file's without its in-flight dump (indexed once), so memory is
what the ledger keeps, not what the files hold.  An entries log is read from where the last
read stopped (its last complete line), so a refresh costs what was appended, not the ring;
another file under its name (its header line differs) is read from the start.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Generic, TypeVar

from llmmon.ranks.ledger import Ledger
from llmmon.ranks.validate import Notes, RankEntries, RankState, SchemaError, parse_entries, \
    parse_log_header, parse_segment, parse_state
from llmmon.sources.spool import SpoolError, SpoolFile, SpoolSource, Stamp

T = TypeVar("T")


@dataclass(frozen=True)
class Problem:
    reason: str  # a short label value: invalid_json, schema, too_large, duplicate, ...
    key: str  # what it concerns, for the collector's error log
    message: str


@dataclass
class IngestResult:
    problems: list[Problem] = field(default_factory=list)
    persisting: list[Problem] = field(default_factory=list)  # reported before, still there
    sanitised: Counter[str] = field(default_factory=Counter)
    cut: Counter[str] = field(default_factory=Counter)
    dropped: int = 0
    read_bytes: int = 0


@dataclass
class _Parsed(Generic[T]):
    stamp: Stamp
    value: T | None
    error: SpoolError | SchemaError | None
    dropped: str = ""  # what the parser left out of this version, for the error log


@dataclass
class _LogRead:
    """How far an entries log has been read: its complete lines up to `offset`.  The file is
    known by its header line, not by its inode alone (a wiped spool's inode numbers recur)."""

    stamp: Stamp  # the version read (a refused log: the version refused)
    offset: int
    header: bytes = b""
    error: SpoolError | SchemaError | None = None
    dropped: str = ""
    seen: Stamp | None = None  # the version last looked at, when not `stamp`


class SpoolIngest:
    def __init__(self, source: SpoolSource, ledger: Ledger, stale_after: float,
                 drop_after: float, max_read_bytes: int,
                 max_parse_seconds: float = float("inf"),
                 offset: Callable[[], float] = lambda: 0.0) -> None:
        """`offset`: the wall clock minus the clock `run` is given (llmmon.ranks.clock), by
        which a file's modification time is read onto that clock."""
        self.source = source
        self.offset = offset
        self._written: dict[str, tuple[float, float]] = {}  # path -> (mtime, on our clock)
        self.max_read_bytes = max_read_bytes
        self.max_parse_seconds = max_parse_seconds
        self._budget = max_read_bytes
        self._deadline = 0.0
        self.ledger = ledger
        self.stale_after = stale_after
        self.drop_after = drop_after
        self._states: dict[str, _Parsed[RankState]] = {}
        self._entries: dict[str, _Parsed[RankEntries]] = {}
        self._logs: dict[str, _LogRead] = {}
        self._reported: dict[str, tuple[str, Stamp | None]] = {}

    def written(self, path: str, mtime: float) -> float:
        """When `path` was written, on the clock `run` is given: its mtime less the wall
        clock's offset when this version was first seen, so a version read before a clock
        step keeps its age after it."""
        known = self._written.get(path)
        if known is None or known[0] != mtime:
            known = self._written[path] = (mtime, mtime - self.offset())
        return known[1]

    def run(self, now: float) -> IngestResult:
        result = IngestResult()
        self._budget = self.max_read_bytes
        self._deadline = time.monotonic() + self.max_parse_seconds
        try:
            scan = self.source.scan()
        except SpoolError as exc:
            self._problem(result, exc.reason, exc.path, str(exc), None)
            return result
        for rejected in scan.rejected:
            self._problem(result, rejected.reason, rejected.path, str(rejected), None)
        states = [f for f in scan.files if f.kind == "state"]
        entries = {(f.job_dir, f.rank, f.pid): f for f in scan.files if f.kind == "entries"}
        logs = {(f.job_dir, f.rank, f.pid): f for f in scan.files if f.kind == "log"}
        current = self._current(states, now, result)
        for spool_file, state in current:
            written = self.written(spool_file.path, spool_file.mtime)
            if not self.ledger.observe_state(state, written, now, spool_file.uid):
                self._problem(result, "too_many_ranks", spool_file.path,
                              f"{spool_file.path}: more than {self.ledger.max_ranks} ranks, "
                              f"{self.ledger.max_ranks_per_job} of job {spool_file.job_dir} "
                              f"or {self.ledger.max_ranks_per_uid} of uid {spool_file.uid}; "
                              "skipped", spool_file.stamp)
                continue
            key = (spool_file.job_dir, spool_file.rank, spool_file.pid)
            if key in entries:
                self._ingest_entries(entries[key], result)
            if key in logs:
                self._ingest_log(logs[key], result)
        result.dropped = len(self.ledger.expire(now, self.drop_after))
        result.cut.update(self.ledger.cut)
        self.ledger.cut.clear()
        self._sweep(scan.files, scan.temporaries, now)
        live = {f.path for f in scan.files} | {r.path for r in scan.rejected}
        live |= {path for path, _ in scan.temporaries}
        for cache in (self._states, self._entries, self._logs, self._reported, self._written):
            for path in set(cache) - live - {self.source.root}:
                del cache[path]
        return result

    # selection ---------------------------------------------------------------------------
    def _current(self, files: list[SpoolFile], now: float,
                 result: IngestResult) -> list[tuple[SpoolFile, RankState]]:
        """The newest valid state per (job, rank); a second fresh claimant is a duplicate."""
        chosen: dict[tuple[str, int], tuple[SpoolFile, RankState]] = {}
        parsed = [(f, state) for f in files
                  if (state := self._parse(self._states, f, parse_state, result)) is not None]
        for spool_file, state in sorted(parsed, key=lambda p: p[0].stamp[1], reverse=True):
            if state.inflight is not None:  # a new version: the ledger indexes it this run
                self._states[spool_file.path].value = replace(state, inflight=None)
            who = state.identity
            if (who.job_id, who.rank, who.pid) != (spool_file.job_dir, spool_file.rank,
                                                  spool_file.pid):
                self._problem(result, "identity_mismatch", spool_file.path,
                              f"{spool_file.path}: says job {who.job_id!r} rank {who.rank} "
                              f"pid {who.pid}; its path says otherwise", spool_file.stamp)
                continue
            key = (who.job_id, who.rank)
            if key not in chosen:
                chosen[key] = (spool_file, state)
            elif now - self.written(spool_file.path, spool_file.mtime) <= self.stale_after:
                winner = chosen[key][0]
                self._problem(result, "duplicate", spool_file.path,
                              f"{spool_file.path}: job {who.job_id} rank {who.rank} is also "
                              f"reported by pid {winner.pid}; kept the newer file",
                              spool_file.stamp)
        return list(chosen.values())

    def _ingest_entries(self, spool_file: SpoolFile, result: IngestResult) -> None:
        cached = self._entries.get(spool_file.path)
        if cached is not None and cached.stamp == spool_file.stamp:
            # already fed to the ledger; what was wrong with this version is still wrong
            self._report(cached, spool_file, result)
            return
        known = self.ledger.counted(spool_file.job_dir, spool_file.rank, spool_file.pid)
        entries = self._parse(self._entries, spool_file,
                              lambda data, notes: parse_entries(data, notes, known), result)
        if entries is None:
            return
        parsed = self._entries[spool_file.path]
        parsed.value = None  # counted below (or refused); only the stamp and problems matter
        if (entries.job_id, entries.rank, entries.pid) != (spool_file.job_dir, spool_file.rank,
                                                          spool_file.pid):
            parsed.error = SchemaError("entries of another rank or pid", "identity_mismatch")
            self._report(parsed, spool_file, result)
            return
        self.ledger.observe_entries(entries)

    def _ingest_log(self, spool_file: SpoolFile, result: IngestResult) -> None:
        """Feed the ledger the segments appended to an entries log since the last read."""
        before = self._logs.get(spool_file.path) or _LogRead((0, 0, 0), 0)  # never read: b""
        if spool_file.stamp in (before.stamp, before.seen):
            self._report(before, spool_file, result)  # already read; its problems stand
            return
        header = before.header
        refused = bool(header) and before.error is not None
        start = before.offset if before.offset <= spool_file.stamp[2] and (
            refused or before.error is None) else 0
        if not self._spend(spool_file.stamp[2] - start, result):
            return
        notes = Notes()
        read = _LogRead(spool_file.stamp, start, header)
        try:
            head, data, read.stamp = self.source.read_from(spool_file, start, len(header))
            result.read_bytes += len(head) + len(data)
            if refused and head == header:  # the same refused log, grown: still refused
                before.seen = spool_file.stamp
                self._report(before, spool_file, result)
                return
            if start and head != header:  # another file under the same name: from the start
                start = read.offset = 0
                _, data, read.stamp = self.source.read_from(spool_file, 0, 0)
                result.read_bytes += len(data)
            end = data.rfind(b"\n") + 1  # a line still being appended is read next time
            lines = data[:end].split(b"\n")[:-1]
            read.offset = start + end
            if start == 0 and lines:
                read.header = lines.pop(0) + b"\n"
                who = parse_log_header(read.header, notes)
                if who != (spool_file.job_dir, spool_file.rank, spool_file.pid):
                    raise SchemaError("entries log of another rank or pid", "identity_mismatch")
        except (SpoolError, SchemaError) as exc:
            read.error, lines = exc, []
        self._logs[spool_file.path] = read
        for line in lines:
            known = self.ledger.counted(spool_file.job_dir, spool_file.rank, spool_file.pid)
            try:
                written_ns, dump = parse_segment(line, notes, known)
            except SchemaError as exc:
                notes.drop(f"segment: {exc}")
                continue
            self.ledger.observe_entries(RankEntries(spool_file.job_dir, spool_file.rank,
                                                    spool_file.pid, written_ns, dump))
        if notes.dropped:
            read.dropped = (f"{spool_file.path}: dropped {notes.dropped} item(s), "
                            f"first: {notes.first_drop}")
        result.sanitised.update(notes.sanitised)
        result.cut.update(notes.cut)
        self._report(read, spool_file, result)

    def _spend(self, size: int, result: IngestResult) -> bool:
        """Take `size` bytes of this run's read budget; False (counted) to leave the file for
        a later run.  The first file of a run is always read."""
        if self._budget < self.max_read_bytes and (
                size > self._budget or time.monotonic() >= self._deadline):
            result.cut["read_budget"] += 1  # read in a later run
            return False
        self._budget -= size
        return True

    def _parse(self, cache: dict[str, _Parsed[T]], spool_file: SpoolFile,
               parser: Callable[[bytes, Notes], T], result: IngestResult) -> T | None:
        cached = cache.get(spool_file.path)
        if cached is None or cached.stamp != spool_file.stamp:
            if not self._spend(spool_file.stamp[2], result):
                return None
            notes = Notes()
            try:
                data, stamp = self.source.read(spool_file)
                result.read_bytes += len(data)
                cached = _Parsed(stamp, parser(data, notes), None)
            except (SpoolError, SchemaError) as exc:
                cached = _Parsed(spool_file.stamp, None, exc)
            if notes.dropped and cached.error is None:
                cached.dropped = (f"{spool_file.path}: dropped {notes.dropped} item(s), "
                                  f"first: {notes.first_drop}")
            cache[spool_file.path] = cached
            result.sanitised.update(notes.sanitised)
            result.cut.update(notes.cut)
        self._report(cached, spool_file, result)
        return cached.value

    def _report(self, cached: _Parsed[T] | _LogRead, spool_file: SpoolFile,
                result: IngestResult) -> None:
        """The problems of a parsed version: new the first time, persisting after."""
        if cached.dropped:
            self._problem(result, "bad_entry", spool_file.path, cached.dropped, cached.stamp)
        if cached.error is not None:
            message = str(cached.error)
            if isinstance(cached.error, SchemaError):
                message = f"{spool_file.path}: {message}"
            self._problem(result, cached.error.reason, spool_file.path, message, cached.stamp)

    def _problem(self, result: IngestResult, reason: str, key: str, message: str,
                 stamp: Stamp | None) -> None:
        """Report a problem once per file version (and again if it changes); while the same
        version stays, it is listed as persisting."""
        if self._reported.get(key) == (reason, stamp):
            result.persisting.append(Problem(reason, key, message))
            return
        self._reported[key] = (reason, stamp)
        result.problems.append(Problem(reason, key, message))

    def _sweep(self, files: list[SpoolFile], temporaries: list[tuple[str, float]],
               now: float) -> None:
        """Delete spool files nobody has written for drop_after, and abandoned temp files."""
        old = [f.path for f in files if now - self.written(f.path, f.mtime) > self.drop_after]
        old += [path for path, mtime in temporaries
                if now - self.written(path, mtime) > self.drop_after]
        for path in old:
            self.source.remove(path)
