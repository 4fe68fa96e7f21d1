"""Spool trees other users could write: the documents the reporter writes, and hostile ones.

Shared by the spool bound tests (tests/ranks/test_spool_bounds.py) and the adversarial soak
(bench/adversarial_spool.py), so both feed the daemon the same cases, at their own scale.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from llmmon_reporter import layout, spoolfile
from llmmon_reporter.flight import ranges


def entry(record: int, pg: str = "0", created_ns: int = 0) -> dict[str, Any]:
    """One Flight Recorder entry as torch writes it: a BFloat16 all-reduce of 1 MiB, retired."""
    return {"record_id": record, "pg_id": 0, "process_group": [pg, "default_pg"],
            "collective_seq_id": record + 1, "p2p_seq_id": 0, "op_id": record + 1,
            "profiling_name": "nccl:all_reduce", "time_created_ns": created_ns or time.time_ns(),
            "input_sizes": [[524288]], "input_dtypes": ["BFloat16"],
            "output_sizes": [[524288]], "output_dtypes": ["BFloat16"], "state": "completed",
            "retired": True, "is_p2p": False, "duration_ms": 0.5}


def _status(pgs: list[str], completed: int) -> bytes:
    return json.dumps({"pg_status": {pg: {"last_enqueued_collective": completed,
                                          "last_started_collective": completed,
                                          "last_completed_collective": completed}
                                     for pg in pgs}}).encode()


def state(job: str, rank: int, pid: int, world: int = 8, pgs: list[str] | None = None,
          inflight: list[dict[str, Any]] | None = None, spans: list[list[int]] | None = None,
          completed: int = 10, start_ticks: int = 0) -> bytes:
    """A state document; `pgs` named groups (default "0"), an in-flight dump, group spans, the
    process' start time (0: not said, as an old reporter)."""
    names = pgs or ["0"]
    members = spans or ranges(list(range(world)))
    header = {"schema": layout.SCHEMA, "kind": "state", "written_ns": time.time_ns(),
              "identity": {"job_id": job, "rank": rank, "local_rank": rank % 8,
                           "world_size": world, "pod": "node-1", "namespace": "ml", "pid": pid,
                           "uuid": f"GPU-{rank:08d}", "gpu_name": "NVIDIA H200",
                           "allocator_config": "",
                           **({"start_ticks": start_ticks} if start_ticks else {})},
              "reporter": {"errors_total": 0, "disabled": False},
              "pgs": {pg: {"desc": "default_pg", "size": world, "ranks": members}
                      for pg in names},
              "memory": None, "step": None}
    flight = None if inflight is None else json.dumps({"entries": inflight}).encode()
    return spoolfile.compose(header, {"status": _status(names, completed), "inflight": flight})


def entries(job: str, rank: int, pid: int, items: list[dict[str, Any]]) -> bytes:
    header = {"schema": layout.SCHEMA, "kind": "entries", "written_ns": time.time_ns(),
              "identity": {"job_id": job, "rank": rank, "pid": pid}}
    last = max((e["collective_seq_id"] for e in items), default=0)
    pgs = sorted({e["process_group"][0] for e in items})
    dump = json.dumps({"pg_config": {}, "pg_status": json.loads(_status(pgs, last))["pg_status"],
                       "entries": items}).encode()
    return spoolfile.compose(header, {"dump": dump})


def write(spool: Path, job: str, name: str, data: bytes) -> Path:
    """Write a spool file as the reporter does (atomically); returns its path."""
    directory = spool / job
    directory.mkdir(parents=True, exist_ok=True)
    spoolfile.write_atomic(str(directory), name, data)
    return directory / name


def real_job(spool: Path, job: str = "real-job", ranks: int = 4, completed: int = 10,
             processes: list[tuple[int, int]] | None = None) -> None:
    """(Re)write a healthy job's state files: what must stay fresh whatever else the spool holds.
    `processes`: each rank's (pid, start ticks), for ranks of processes that really run."""
    for rank in range(ranks):
        pid, ticks = processes[rank] if processes else (5000 + rank, 0)
        write(spool, job, layout.state_name(rank, pid),
              state(job, rank, pid, world=ranks, completed=completed, start_ticks=ticks))


def fake_ranks(spool: Path, jobs: int, ranks: int, job: str = "aaa-fake") -> None:
    """State files of ranks whose processes do not exist, in job directories that sort first."""
    for j in range(jobs):
        for rank in range(ranks):
            pid = 4_000_000 + 1000 * j + rank
            write(spool, f"{job}-{j}", layout.state_name(rank, pid),
                  state(f"{job}-{j}", rank, pid, world=ranks, start_ticks=4242))


def junk_dir(spool: Path, count: int, job: str = "aaa-junk") -> None:
    """`count` files named like rank files, holding junk, in a directory that sorts first."""
    directory = spool / job
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        (directory / layout.state_name(n, 100 + n)).write_bytes(b"junk " * 20)


def inflight_flood(spool: Path, files: int, count: int, job: str = "flood") -> None:
    """`files` ranks whose state files each hold `count` in-flight entries."""
    items = [entry(n) for n in range(count)]
    for rank in range(files):
        write(spool, job, layout.state_name(rank, 7000 + rank),
              state(job, rank, 7000 + rank, world=files, inflight=items))


def group_churn(spool: Path, rewrite: int, count: int, job: str = "churn") -> None:
    """One rank rewriting its files with `count` process-group names never seen before."""
    names = [f"pg-{rewrite}-{n}" for n in range(count)]
    items = [entry(rewrite * count + n, pg) for n, pg in enumerate(names)]
    write(spool, job, layout.entries_name(0, 8000), entries(job, 0, 8000, items))
    write(spool, job, layout.state_name(0, 8000), state(job, 0, 8000, world=1, pgs=names))


def wide_group(spool: Path, spans: int, job: str = "wide") -> None:
    """A group listing `spans` rank spans (every other rank of a 2 x spans world)."""
    write(spool, job, layout.state_name(0, 9000),
          state(job, 0, 9000, world=2 * spans, spans=[[2 * n, 2 * n] for n in range(spans)]))


def fake_dump_sets(fr: Path, count: int, job: str = "other-job") -> None:
    """Empty directories named like dump sets, newer-looking than any real one."""
    for n in range(count):
        (fr / job / f"dump-9999999{n}").mkdir(parents=True, exist_ok=True)


def dump_files(fr: Path, job: str, ranks: int, written: float) -> None:
    """Flight Recorder dump files as torch writes them, dated `written`."""
    directory = fr / job
    directory.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        path = directory / f"rank_{rank}"
        path.write_text("{}")
        os.utime(path, (written, written))
