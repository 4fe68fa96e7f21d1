"""Reads the PyTorch Flight Recorder through whichever JSON dump function this torch has.

torch 2.5-2.11 CUDA builds keep NCCL entries in `_dump_nccl_trace_json`; the generic
`_dump_fr_trace_json` (2.8+) holds gloo's (and, from 2.12 on, everyone's).  Dumps are returned
as raw bytes: the reporter splices them into its spool file without parsing them.  The whole
ring, which the reporter sifts for new records, is read through the pickle form of the same
dump without stack traces where this torch has it: half the JSON dump's time and a quarter of
its bytes for 2,000 gloo records on torch 2.13 (both hold the GIL; see docs/reporter.md).
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Callable

from llmmon_reporter import entrylog

NCCL_API = "_dump_nccl_trace_json"
GENERIC_API = "_dump_fr_trace_json"
PICKLED = {NCCL_API: "_dump_nccl_trace", GENERIC_API: "_dump_fr_trace"}  # same ring, pickled


def choose_api(c10d: Any, nccl: bool) -> str | None:
    """The dump function's name: the NCCL one for NCCL jobs where it exists, else generic."""
    order = (NCCL_API, GENERIC_API) if nccl else (GENERIC_API, NCCL_API)
    return next((name for name in order if hasattr(c10d, name)), None)


class FlightRecorder:
    """The three reads the reporter makes, on the cadences the caller decides."""

    def __init__(self, c10d: Any, api: str) -> None:
        self.api = api
        self._dump: Callable[..., bytes] = getattr(c10d, api)
        self._pickled: Callable[..., bytes] | None = getattr(c10d, PICKLED[api], None)

    def status(self) -> bytes:
        """pg_config + pg_status only: ~250 B, 4-10 us on an H200."""
        return self._dump(includeCollectives=False, onlyActive=False)

    def active(self) -> bytes:
        """The records not yet final, as JSON.  NCCL's dump leaves out completed ones itself;
        gloo's never marks completion and returns the whole ring, sifted here by `retired`, so
        a stuck gloo rank's state file carries its few in-flight records, not ~1 MB."""
        if self._pickled is None:
            return self._dump(includeCollectives=True, onlyActive=True)
        doc = self._unpickled(only_active=True)
        doc["entries"] = [entrylog.project(e) for e in doc.get("entries") or ()
                          if isinstance(e, dict) and not entrylog.final(e)]
        return json.dumps(doc, separators=(",", ":"), default=str).encode()

    def full(self) -> bytes:
        """The whole ring as JSON (for dump files): 44-77 ms and ~1 MB for 2000 NCCL entries."""
        return self._dump(includeCollectives=True, onlyActive=False)

    def ring(self) -> dict[str, Any]:
        """The whole ring decoded, without stack traces.  The pickle is torch's own output in
        this process (never a file), so unpickling it trusts nothing it did not already."""
        if self._pickled is None:
            return json.loads(self.full())
        return self._unpickled(only_active=False)

    def _unpickled(self, only_active: bool) -> dict[str, Any]:
        assert self._pickled is not None
        doc = pickle.loads(self._pickled(includeCollectives=True, includeStackTraces=False,
                                         onlyActive=only_active))
        return doc if isinstance(doc, dict) else {}


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
