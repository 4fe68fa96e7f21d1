"""Incident directories as the daemon writes them (format v1), built in a test's tmp_path.

The default incident is a realistic hang of a 4-rank job on one node: rank 3 sleeps in
load_next_batch (data.py:41) and never enqueues all_reduce #42, ranks 0-2 wait in it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from llmmon.incidents import layout

ONSET = 1796000000.0  # 2026-11-30 00:53:20 UTC
JOB = "team-a.llama"
VERDICT = ("job team-a.llama: rank 3 (world group 0 {0-3}) is in load_next_batch (data.py:41), "
           "sleeping, no CPU for 35 s; ranks 0–2 wait in world all_reduce #42 (group 0) for "
           "rank 3")


def frame(function: str, file: str, line: int, module: str = "") -> dict[str, Any]:
    return {"file": file, "line": line, "function": function, "module": module}


WAITING = [frame("wait", "torch/distributed/distributed_c10d.py", 2501, "torch.distributed"),
           frame("all_reduce", "torch/distributed/distributed_c10d.py", 2440,
                 "torch.distributed"),
           frame("step", "train.py", 88, "train"), frame("main", "train.py", 120, "train")]
LOADING = [frame("sleep", "time", 0), frame("load_next_batch", "data.py", 41, "data"),
           frame("step", "train.py", 85, "train"), frame("main", "train.py", 120, "train")]


def incident_id(job_id: str = JOB, when: float = ONSET, suffix: str = "3f2a9c") -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    return f"{stamp}-{layout.slug(job_id)}-{suffix}"


def _rank(rank: int) -> dict[str, Any]:
    behind = rank == 3
    doing = {"where": "load_next_batch (data.py:41)" if behind else
             "all_reduce #42 (group 0, world)",
             "state": "S (sleeping)", "cpu_idle_seconds": 35.0 if behind else 0.4,
             "io_idle_seconds": 35.0 if behind else 0.4, "read_bytes": 0.0, "written_bytes": 0.0,
             "busy": False, "stopped": False}
    return {"rank": rank, "local_rank": rank, "world_size": 4, "pod": f"llama-worker-{rank}",
            "namespace": "team-a", "pid": 4100 + rank, "uuid": f"GPU-{rank:08x}-aaaa",
            "gpu_name": "NVIDIA H200", "allocator_config": "", "up": True, "alive": True,
            "exit": None, "report_age_seconds": 1.2, "memory": {}, "steps": 1200,
            "doing": doing, "stack": LOADING if behind else WAITING, "blocked": [],
            "groups": {"0": {"enqueued": 41 if behind else 42, "started": 41 if behind else 42,
                             "completed": 41, "last_progress": ONSET - 1,
                             "oldest_inflight_age_seconds": 0.0 if behind else 17.0}}}


def ranks_document(job_id: str = JOB) -> dict[str, Any]:
    """The job's entry of /api/v1/ranks as JobEvidence.json() writes it."""
    group = {"job_id": job_id, "pg": "0", "pg_desc": "default_pg", "dimension": "world",
             "size": 4, "ranks": "0-3", "local_ranks": [0, 1, 2, 3], "waiting": [0, 1, 2],
             "behind": [3], "stalled": True, "stalled_seconds": 17.2,
             "summary": f"job {job_id}, group 0 (default_pg): ranks 0–2 wait in all_reduce #42 "
                        "for 17 s; rank 3 never enqueued it (last enqueued #41)"}
    return {"job_id": job_id, "ranks": [_rank(r) for r in range(4)], "groups": [group],
            "end": None, "enqueue_lag": {}, "slowdown": None, "stalled_groups": ["0"],
            "stacks": None,
            "verdict": {"stalled": True, "roots": [3], "cycle": [], "remote": False, "waits": [],
                        "summary": VERDICT.replace(JOB, job_id)}}


def stacks_document() -> dict[str, Any]:
    return {"ranks": {str(r): {"source": "reporter", "state": "S (sleeping)",
                               "where": _rank(r)["doing"]["where"],
                               "frames": LOADING if r == 3 else WAITING, "blocked": []}
                      for r in range(4)}}


SPANS = {"before": [ONSET - 60, ONSET], "during": [ONSET, ONSET + 15]}


def gpus_document() -> dict[str, Any]:
    def gpu(index: int) -> dict[str, Any]:
        return {"gpu": str(index), "uuid": f"GPU-{index:08x}-aaaa", "name": "NVIDIA H200",
                "values": {
                    "llmmon_gpu_utilization_ratio": {"before": 0.97, "during": 0.0},
                    "llmmon_gpu_power_watts": {"before": 640.0, "during": 95.0},
                    "llmmon_gpu_memory_used_bytes": {"before": 1.2e11, "during": 1.2e11},
                    "llmmon_gpu_temperature_celsius": {"before": 71.0, "during": 48.0},
                    "llmmon_gpu_xid_errors_total": {"before": 0.0, "during": 0.0}},
                "xids": []}
    return {"gpus": [gpu(i) for i in range(4)], "spans": SPANS}


def network_document() -> dict[str, Any]:
    def port(device: str, netdev: str) -> dict[str, Any]:
        return {"kind": "rdma", "device": device, "port": "1", "netdev": netdev, "counters": {
            "llmmon_rdma_port_transmit_bytes_total": {"before": 4.1e11, "during": 2.0e6},
            "llmmon_rdma_port_receive_bytes_total": {"before": 4.0e11, "during": 1.9e6},
            "llmmon_rdma_port_symbol_errors_total": {"before": 0.0, "during": 0.0}}}
    return {"spans": SPANS, "ports": [port("mlx5_0", "ib0"), port("mlx5_1", "ib1")]}


KMSG = ("[812345.120001] nfs: server storage-1 not responding, still trying\n"
        "[812349.871002] nfs: server storage-1 not responding, still trying\n")


def fr_document(rank: int) -> dict[str, Any]:
    """A torch Flight Recorder JSON dump with the rank's last collectives."""
    last = 41 if rank == 3 else 42
    entries = [{"record_id": seq, "pg_id": 0, "process_group": ["0", "default_pg"],
                "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": int((ONSET - 42 + seq) * 1e9),
                "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
                "output_dtypes": ["Float"], "state": "completed" if seq < 42 else "started",
                "frames": [], "is_p2p": False, "retired": seq < 41, "timeout_ms": 600000}
               for seq in range(last - 2, last + 1)]
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                    "ranks": "[0, 1, 2, 3]"}},
            "pg_status": {"0": {"last_enqueued_collective": last,
                                "last_started_collective": last, "last_completed_collective": 41}},
            "entries": entries}


def summary_document(incident: str, job_id: str = JOB, onset: float = ONSET) -> dict[str, Any]:
    return {"schema": layout.SCHEMA, "id": incident, "job_id": job_id, "node": "node-a",
            "trigger": "stalled", "onset": onset, "declared": onset + 15.0,
            "completed": onset + 23.0, "verdict": VERDICT.replace(JOB, job_id),
            "culprit": {"ranks": [3], "cause": "rank_not_enqueued",
                        "text": "rank 3 never enqueued all_reduce #42: it is in "
                                "load_next_batch (data.py:41), sleeping, no CPU for 35 s"},
            "local_ranks": [0, 1, 2, 3],
            "stalled_groups": [{"pg": "0", "pg_desc": "default_pg", "dimension": "world",
                                "stalled_seconds": 17.2}],
            "end": None,
            "dumps": {"0": "collected", "1": "collected", "2": "collected", "3": "collected"},
            "files": {}, "bytes": 0, "left_out": [], "errors": []}


def write_incident(root: Path, job_id: str = JOB, onset: float = ONSET, suffix: str = "3f2a9c",
                   files: dict[str, Any] | None = None) -> Path:
    """Write an incident as the recorder does (MARKER first, under `.tmp-<id>`, renamed into
    place once whole) and return its directory. `files`: name -> content (a dict or list is
    written as JSON, bytes or str as they are, None leaves the file out), over the defaults;
    summary.json's `files` and `bytes` count what was written."""
    incident = incident_id(job_id, onset, suffix)
    contents: dict[str, Any] = {
        layout.RANKS: ranks_document(job_id), layout.STACKS: stacks_document(),
        layout.GPUS: gpus_document(), layout.NETWORK: network_document(),
        layout.ENV: {"ranks": {str(r): {"NCCL_IB_HCA": "mlx5_0", "WANDB_API_KEY": "<redacted>"}
                               for r in range(4)}, "redacted": ["WANDB_API_KEY"], "error": {}},
        layout.KMSG: KMSG, **{f"fr/rank_{r}.json": fr_document(r) for r in range(4)}}
    contents.update(files or {})
    summary = contents.pop(layout.SUMMARY, None) or summary_document(incident, job_id, onset)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{layout.TMP_PREFIX}{incident}"
    tmp.mkdir(mode=0o750)
    (tmp / layout.MARKER).touch(mode=0o640)
    sizes = {}
    for name, content in contents.items():
        if content is None:
            continue
        data = content if isinstance(content, bytes) else content.encode() \
            if isinstance(content, str) else json.dumps(content).encode()
        (tmp / name).parent.mkdir(exist_ok=True)
        (tmp / name).write_bytes(data)
        sizes[name] = len(data)
    if isinstance(summary, dict):
        if isinstance(summary.get("files"), dict):  # a test may put garbage there
            summary["files"].update(sizes)
            summary["bytes"] = sum(sizes.values())
        summary = json.dumps(summary)
    (tmp / layout.SUMMARY).write_bytes(summary if isinstance(summary, bytes) else summary.encode())
    os.rename(tmp, root / incident)
    return root / incident
