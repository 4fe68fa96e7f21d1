"""Rank spool files, written exactly as the in-process reporter writes them.

The documents are the reporter's (schema, `identity`, `reporter`, `pgs`, `memory` under
torch's own `memory_stats()` keys, `step`), the Flight Recorder blobs are shaped like torch's
JSON dumps (`pg_config`, `pg_status`, `entries`), and the bytes go through the reporter's own
`spoolfile.compose` and `write_atomic` into the paths `layout` derives, so the daemon cannot
tell a simulated rank from a real one.  The state file is rewritten every tick (the reporter's
1 s status cadence), the entries log every `entries_interval`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

from llmmon_reporter import identity as reporter_identity
from llmmon_reporter import layout, spoolfile
from llmmon_reporter.entrylog import EntryLog, of
from llmmon_reporter.flight import GENERIC_API, ranges
from llmmon_reporter.stepstats import STEP_BUCKETS
from llmmon.simulate.job import Job, Rank

FR_VERSION = "2.10"
NCCL_VERSION = "2.28.9"
GPU_NAME = "NVIDIA H200"
ALLOCATOR_CONFIG = "expandable_segments:False"


def pod_name(job: Job, node: str) -> str:
    return f"{job.job_id}-{node}"


def identity(job: Job, rank: Rank, node: str,
             env: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"job_id": job.job_id, "rank": rank.rank, "local_rank": rank.local_rank,
            "world_size": job.world_size, "pod": pod_name(job, node), "namespace": "training",
            "pid": rank.pid, "uuid": rank.uuid, "gpu_name": GPU_NAME,
            "allocator_config": ALLOCATOR_CONFIG,
            "nccl_env": reporter_identity.nccl_env(env or {})}


def _flight(job: Job, rank: Rank, entries: list[dict[str, Any]] | None) -> bytes:
    return json.dumps(_dump(job, rank, entries), separators=(",", ":")).encode()


def _dump(job: Job, rank: Rank, entries: list[dict[str, Any]] | None) -> dict[str, Any]:
    members = list(range(job.world_size))
    dump: dict[str, Any] = {
        "version": FR_VERSION, "comm_lib_version": NCCL_VERSION,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(members)}},
        "pg_status": {"0": {"last_enqueued_collective": rank.enqueued,
                            "last_started_collective": rank.started,
                            "last_completed_collective": rank.completed}}}
    if entries is not None:
        dump["entries"] = entries
    return dump


def _memory(rank: Rank) -> dict[str, int]:
    reserved, allocated, split = rank.memory
    values = {"allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": reserved * 0.95,
              "reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": reserved,
              "active_bytes.all.current": allocated + split * 0.05,
              "inactive_split_bytes.all.current": split,
              "num_alloc_retries": rank.retries, "num_ooms": rank.ooms}
    return {key: int(values[key]) for key in layout.MEMORY_KEYS}


def _step(rank: Rank) -> dict[str, Any] | None:
    if not rank.steps:
        return None
    return {"steps": rank.steps, "tokens": rank.tokens, "model_flops": rank.flops,
            "loss_nonfinite": rank.nonfinite,
            "seconds": {"buckets": list(STEP_BUCKETS), "counts": list(rank.step_counts),
                        "sum": rank.step_seconds}}


def state_document(job: Job, rank: Rank, node: str, started_ns: int, ticks: int,
                   env: Mapping[str, str] | None = None) -> bytes:
    header = {
        "schema": layout.SCHEMA, "kind": "state", "written_ns": time.time_ns(),
        "identity": identity(job, rank, node, env),
        "reporter": {"started_ns": started_ns, "ticks": ticks, "errors_total": 0,
                     "last_error": "", "disabled": False, "disabled_reason": "",
                     "fr_api": GENERIC_API,
                     "cadence": {"status": 1.0, "inflight": 5.0, "entries": 20.0}},
        "pgs": {"0": {"desc": "default_pg", "size": job.world_size,
                      "ranks": ranges(list(range(job.world_size)))}},
        "memory": _memory(rank),
        "step": _step(rank),
    }
    inflight = _flight(job, rank, [rank.pending]) if rank.pending else None
    return spoolfile.compose(header, {"status": _flight(job, rank, None), "inflight": inflight})


def ring(job: Job, rank: Rank) -> dict[str, Any]:
    """The rank's Flight Recorder ring, as the reporter reads it."""
    return _dump(job, rank, list(rank.ring) + ([rank.pending] if rank.pending else []))


class SpoolWriter:
    """Writes the state files and entries logs of the ranks of one node (a log's file stays
    open while its rank lives, as the reporter's does)."""

    def __init__(self, root: str, node: str, entries_interval: float) -> None:
        self.root = root
        self.node = node
        self.entries_interval = entries_interval
        self._next_entries: dict[tuple[str, int, int], float] = {}
        self._started_ns: dict[tuple[str, int, int], int] = {}
        self._ticks: dict[tuple[str, int, int], int] = {}
        self._logs: dict[tuple[str, int, int], EntryLog] = {}

    def write(self, job: Job, ranks: list[Rank], now: float,
              env: Mapping[str, str] | None = None) -> None:
        """The ranks' files as of `now` (`env`: the ranks' environment, whose NCCL variables
        the reporter sends)."""
        directory = layout.job_dir(self.root, job.job_id)
        live = {(job.job_id, rank.rank, rank.pid) for rank in ranks}
        for key in [k for k in self._logs if k[0] == job.job_id and k not in live]:
            self._logs.pop(key).close()  # that process is gone
        for rank in ranks:
            key = (job.job_id, rank.rank, rank.pid)
            started = self._started_ns.setdefault(key, time.time_ns())
            ticks = self._ticks[key] = self._ticks.get(key, 0) + 1
            os.makedirs(directory, exist_ok=True)  # the daemon removes it with the last rank
            if now >= self._next_entries.get(key, 0.0):
                log = self._logs.get(key)
                if log is None:
                    log = self._logs[key] = EntryLog(
                        directory, layout.log_name(rank.rank, rank.pid),
                        {"job_id": job.job_id, "rank": rank.rank, "pid": rank.pid})
                log.write(of(ring(job, rank)), time.time_ns())
                self._next_entries[key] = now + self.entries_interval
            spoolfile.write_atomic(directory, layout.state_name(rank.rank, rank.pid),
                                   state_document(job, rank, self.node, started, ticks, env))

