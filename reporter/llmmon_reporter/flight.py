"""Reads the PyTorch Flight Recorder through whichever JSON dump function this torch has.

torch 2.5-2.11 CUDA builds keep NCCL entries in `_dump_nccl_trace_json`; the generic
`_dump_fr_trace_json` (2.8+) holds gloo's (and, from 2.12 on, everyone's).  Dumps are returned
as raw bytes: the reporter splices them into its spool file without parsing them.  The whole
ring, which the reporter sifts for new records, is read without the GIL where `native` can call
the dump's C++ function, and decoded record by record between pauses (`pace`), keeping of each
record only what the caller needs, so neither the dump nor its decoding (nor a garbage
collection the decoded ring would start) holds up the training thread.  Elsewhere it is read
through the pickle form of the same dump without stack traces where this torch has it (half
the JSON binding's time; both bindings hold the GIL; see docs/reporter.md).
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Callable

from llmmon_reporter import entrylog, timeslice
from llmmon_reporter.native import NativeDump

NCCL_API = "_dump_nccl_trace_json"
GENERIC_API = "_dump_fr_trace_json"
PICKLED = {NCCL_API: "_dump_nccl_trace", GENERIC_API: "_dump_fr_trace"}  # same ring, pickled


def choose_api(c10d: Any, nccl: bool) -> str | None:
    """The dump function's name: the NCCL one for NCCL jobs where it exists, else generic."""
    order = (NCCL_API, GENERIC_API) if nccl else (GENERIC_API, NCCL_API)
    return next((name for name in order if hasattr(c10d, name)), None)


class FlightRecorder:
    """The three reads the reporter makes, on the cadences the caller decides."""

    def __init__(self, c10d: Any, api: str, native: NativeDump | None = None,
                 paced: timeslice.TimeSlice | None = None) -> None:
        self.api = api
        self._dump: Callable[..., bytes] = getattr(c10d, api)
        self._pickled: Callable[..., bytes] | None = getattr(c10d, PICKLED[api], None)
        self._native = native if native is not None and _agrees(native, self._dump) else None
        self._pace = paced or timeslice.TimeSlice()

    @property
    def native(self) -> bool:
        """Whole-ring reads run without the GIL."""
        return self._native is not None

    def status(self) -> bytes:
        """pg_config + pg_status only: ~250 B, 4-10 us on an H200."""
        return self._dump(includeCollectives=False, onlyActive=False)

    def active(self) -> bytes:
        """The records not yet final, as JSON.  NCCL's dump leaves out completed ones itself;
        gloo's never marks completion and returns the whole ring, sifted here by `retired`, so
        a stuck gloo rank's state file carries its few in-flight records, not ~1 MB."""
        doc = self._read(True, _unfinished)
        return json.dumps(doc, separators=(",", ":"), default=str).encode()

    def full(self) -> bytes:
        """The whole ring as JSON (for dump files): 44-77 ms and ~1 MB for 2000 NCCL entries."""
        return (self._native or self._dump)(includeCollectives=True, onlyActive=False)

    def ring(self, keep: timeslice.Keep) -> dict[str, Any]:
        """The ring's members, `entries` holding only what `keep` makes of each record."""
        return self._read(False, keep)

    def _read(self, only_active: bool, keep: timeslice.Keep) -> dict[str, Any]:
        """Without the GIL and record by record where native; else through the pickle form,
        without stack traces, where this torch has it.  The pickle is torch's own output in
        this process (never a file), so unpickling it trusts nothing it did not already."""
        if self._native is not None:
            blob = self._native(includeCollectives=True, onlyActive=only_active)
            return timeslice.decode(blob, self._pace, keep=keep, seek=getattr(keep, "seek", None))
        if self._pickled is not None:
            doc = pickle.loads(self._pickled(includeCollectives=True, includeStackTraces=False,
                                             onlyActive=only_active))
        else:
            doc = json.loads(self._dump(includeCollectives=True, onlyActive=only_active))
        doc = doc if isinstance(doc, dict) else {}
        entries = doc.get("entries")
        doc["entries"] = timeslice.sift(entries if isinstance(entries, list) else (), keep,
                                   self._pace)
        return doc


def _unfinished(entry: Any) -> dict[str, Any] | None:
    return entrylog.project(entry) if isinstance(entry, dict) and not entrylog.final(entry) \
        else None


def _agrees(native: NativeDump, binding: Callable[..., bytes]) -> bool:
    """The C++ function answers what the binding does (checked once, on the status dump)."""
    try:
        ours = json.loads(native(includeCollectives=False, onlyActive=False))
        theirs = json.loads(binding(includeCollectives=False, onlyActive=False))
    except (ValueError, UnicodeDecodeError, OSError):
        return False
    return isinstance(ours, dict) and isinstance(theirs, dict) and ours.keys() == theirs.keys() \
        and ours.get("version") == theirs.get("version")


def process_groups(c10d_python: Any) -> dict[str, dict[str, Any]]:
    """Name -> description and global ranks of every group this process belongs to.

    Read from torch.distributed's Python bookkeeping: gloo's Flight Recorder leaves
    pg_config empty, and no other source names a group's members without a collective.
    """
    world = c10d_python._world
    groups: dict[str, dict[str, Any]] = {}
    for pg, name in list(world.pg_names.items()):
        ranks = sorted(world.pg_group_ranks.get(pg, {}))
        groups[str(name)] = {"desc": str(getattr(pg, "group_desc", "") or ""),
                             "size": len(ranks), "ranks": ranges(ranks)}
    return groups


def ranges(ranks: list[int]) -> list[list[int]]:
    """[0, 1, 2, 3, 8] -> [[0, 3], [8, 8]]: a 100k-rank group stays a few bytes."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and spans[-1][1] == rank - 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return spans
