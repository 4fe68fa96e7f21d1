"""The entries log: Flight Recorder records the daemon has not been sent, appended as JSON lines.

Rewriting the whole ring into a file every entries tick made the daemon decode 2,000 records
(~1 MB) to find the ten that were new.  The log holds a header line and then one segment line
per tick with only the records newer than what earlier segments shipped in final form; a record
still in flight is shipped again each tick until it is final, so the daemon, which counts each
record once by `record_id`, sees its finished form.  Each segment also says which records the
ring held (`first_record`, `last_record`), so records that left the ring unread are still
counted as missed.

The file is created whole (header and the whole ring, written to a temporary name and renamed)
at the first tick, after a failed append, when the file at its name is no longer the one it
has open (a wiped spool) and once it passes `MAX_BYTES`; the daemon reads a file whose header
line it does not know from the start and otherwise only the bytes appended since its last
read.  Only the
fields the daemon reads are kept (no stack traces, no discovery times).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

from llmmon_reporter import layout, timeslice, spoolfile

KIND = "entries-log"
MAX_BYTES = 2 << 20  # rewritten whole past this: ~3 rings of 2,000 projected records
HOLD_BACK = 256  # a record unfinished this far behind the newest is not shipped again
# Records a tick ships at most, the newest: a job issuing thousands of collectives a second turns
# its ring over between ticks, and decoding and re-encoding all of it (43 ms of Python for 2,000
# gloo records) is most of what the reporter takes from the training thread.  The daemon counts
# the records left out as missed, as it counts those that left the ring between ticks.
MAX_NEW = 500
FIELDS = ("record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "is_p2p",
          "profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes",
          "time_created_ns", "duration_ms", "state", "retired")


def final(entry: Mapping[str, Any]) -> bool:
    """Nothing about this record will change: retired, completed or timed."""
    return bool(entry.get("retired")) or entry.get("state") == "completed" \
        or entry.get("duration_ms") is not None


def project(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a record the daemon reads."""
    return {key: entry[key] for key in FIELDS if key in entry}


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False, default=str).encode()


# A ring read, keeping what `keep` makes of each entry.
Read = Callable[[timeslice.Keep], Mapping[str, Any]]


def of(ring: Mapping[str, Any]) -> Read:
    """An already decoded ring as a read (the simulator's and the benches')."""
    def read(keep: timeslice.Keep) -> Mapping[str, Any]:
        entries = ring.get("entries") or ()
        ids = [e["record_id"] for e in entries
               if isinstance(e, dict) and isinstance(e.get("record_id"), int)]
        if ids and isinstance(keep, _Selection):
            keep.limit(max(ids))
        return {**ring, "entries": timeslice.sift(entries, keep, None)}
    return read


class _Selection:
    """What one write keeps of a ring: the records after `after`, encoded at once (bytes are
    not tracked by the garbage collector, the decoded records are freed as they go); which
    record ids the ring held; which kept records are not final.

    torch numbers records one by one and dumps the ring oldest first, so the ring holds ids
    `first`..`last` in order: `seek` jumps from the first record straight to record `after`
    (the newest one shipped final, still in the ring unless it wrapped), and the records in
    between are never decoded (a ring tick of a job with few new records decodes a few
    records, not 2,000, and keeps the training thread waiting for the GIL that much less)."""

    def __init__(self, after: int) -> None:
        self.after, self.first, self.last = after, -1, -1
        self.pending: list[int] = []
        self.cut = -1  # the oldest record shipped when MAX_NEW left older ones of the ring out
        self.drop_first = False

    def limit(self, newest: int) -> None:
        """Ship at most MAX_NEW records, the newest, when the ring holds more new ones.  Called
        before the records are kept, or (`seek`) after the first: then `drop_first` says the
        first one kept must go."""
        if newest - self.after > MAX_NEW:
            kept_first = self.after < self.first  # (-1 before the first record is seen)
            self.after = newest - MAX_NEW
            self.cut = self.after + 1
            self.drop_first = kept_first and self.first <= self.after
            if self.drop_first and self.first in self.pending:
                self.pending.remove(self.first)

    def __call__(self, entry: Any) -> bytes | None:
        record = entry.get("record_id") if isinstance(entry, dict) else None
        if not isinstance(record, int):
            return None
        self.first = record if self.last < 0 else min(self.first, record)
        self.last = max(self.last, record)
        if record <= self.after:
            return None
        if not final(entry):
            self.pending.append(record)
        return _json(project(entry))

    def seek(self, text: str, pos: int) -> int:
        """The start of record `after`'s element (after MAX_NEW moved it up to the newest
        record's), when the first record (already seen) is older and the guess checks out;
        else `pos`, and every record is read."""
        newest = _newest(text, pos)
        if newest is not None:
            self.limit(newest)
        wanted = self.after
        if self.first < 0 or wanted <= self.first:
            return pos
        key = text.find(f'"record_id":{wanted},', pos)
        if key < 0:
            key = text.find(f'"record_id":{wanted}}}', pos)
        return _checked(text, pos, key, wanted)


def _checked(text: str, pos: int, key: int, record: int) -> int:
    """The start of the element whose `"record_id":` is at `key`, if it decodes to that record;
    else `pos`."""
    start = text.rfind("{", pos, key) if key >= 0 else -1
    found = timeslice.element_at(text, start) if start >= 0 else None
    return start if isinstance(found, dict) and found.get("record_id") == record else pos


def _newest(text: str, pos: int) -> int | None:
    """The record id of the ring's last element (torch dumps the ring oldest first), read
    from the text's end and checked by decoding that element; None if it does not check."""
    key = text.rfind('"record_id":', pos)
    digits = text[key + 12:key + 32].split(",", 1)[0].split("}", 1)[0] if key >= 0 else ""
    if not digits.strip().isdigit():
        return None
    record = int(digits)
    return record if _checked(text, pos, key, record) != pos else None


class EntryLog:
    """One rank process's entries log; `write` is called with each ring read."""

    def __init__(self, directory: str, name: str, identity: Mapping[str, Any]) -> None:
        self.directory, self.name = directory, name
        self.identity = {key: identity[key] for key in ("job_id", "rank", "pid")}
        self._fd: int | None = None
        self._size = 0
        self._shipped = -1  # every record up to this id was shipped in its final form

    def write(self, read: Read, now_ns: int) -> int:
        """Append the records not yet shipped final (or start the file over); bytes written.
        `read` is called once, with the filter that encodes the records to ship."""
        fresh = self._fd is None or self._size > MAX_BYTES or not self._in_place()
        chosen = _Selection(-1 if fresh else self._shipped)
        ring = read(chosen)
        records = ring.get("entries")
        if chosen.drop_first and isinstance(records, list):
            records = records[1:]
        fields = {"written_ns": now_ns, "first_record": chosen.first,
                  "last_record": chosen.last, "pg_status": ring.get("pg_status") or {}}
        if chosen.cut > chosen.first:
            fields["cut_record"] = chosen.cut  # records before it were left out (MAX_NEW)
        head = _json(fields)
        segment = head[:-1] + b',"entries":[' + \
            b",".join(records if isinstance(records, list) else ()) + b"]}\n"
        if fresh:
            header = _json({"schema": layout.SCHEMA, "kind": KIND, "written_ns": now_ns,
                            "identity": self.identity}) + b"\n"
            self.close()
            self._fd = spoolfile.create_appendable(self.directory, self.name, header + segment)
            self._size = len(header) + len(segment)
        else:
            try:
                spoolfile.append(self._fd, segment)  # type: ignore[arg-type]
            except OSError:
                self.close()  # a partial line may be there: start the file over next tick
                raise
            self._size += len(segment)
        if chosen.last >= 0:
            self._shipped = max(min(chosen.pending, default=chosen.last + 1) - 1,
                                chosen.last - HOLD_BACK, self._shipped)
        return len(segment) if not fresh else self._size

    def _in_place(self) -> bool:
        """Our open file is still the one at our name (the spool may have been wiped)."""
        try:
            return os.lstat(os.path.join(self.directory, self.name)).st_ino == \
                os.fstat(self._fd).st_ino  # type: ignore[arg-type]
        except OSError:
            return False

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def remove(self) -> None:
        self.close()
        spoolfile.remove(self.directory, self.name)
