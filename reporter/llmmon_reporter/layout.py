"""Where reporter files live, shared by the reporter, the launcher and the node daemon.

The spool holds one directory per job and, in it, files named after rank and pid.  The daemon
derives every path it touches (spool files, dump pipes, dump files) from these rules and a
sanitised job id; it never follows a path written inside a spool file.
"""

from __future__ import annotations

import os
import re

SCHEMA = 1
DEFAULT_SPOOL = "/run/llmmon/ranks"
DEFAULT_FR_DIR = "/var/lib/llmmon/fr"
DEFAULT_PIPE_DIR = "/run/llmmon/frpipe"
RANK_PREFIX = "rank_"
MAX_JOB_CHARS = 128

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@-]")
SPOOL_FILE = re.compile(r"^rank_(\d{1,7})\.(\d{1,10})\.(json|entries\.json|entries\.jsonl)$")
# torch.cuda.memory_stats() keys a state file carries, under torch's own names.
MEMORY_KEYS = (
    "allocated_bytes.all.current", "allocated_bytes.all.peak",
    "reserved_bytes.all.current", "reserved_bytes.all.peak",
    "active_bytes.all.current", "inactive_split_bytes.all.current",
    "num_alloc_retries", "num_ooms",
)


def safe_job(job_id: str) -> str:
    """The job id as a label value and a directory name: no separators, no leading dots."""
    cleaned = _UNSAFE.sub("_", job_id)[:MAX_JOB_CHARS].lstrip(".")
    return cleaned or "_"


def state_name(rank: int, pid: int) -> str:
    return f"{RANK_PREFIX}{rank}.{pid}.json"


def entries_name(rank: int, pid: int) -> str:
    """The whole-ring entries document written by reporters before the entries log (read
    for one more release)."""
    return f"{RANK_PREFIX}{rank}.{pid}.entries.json"


def log_name(rank: int, pid: int) -> str:
    """The entries log (llmmon_reporter/entrylog.py)."""
    return f"{RANK_PREFIX}{rank}.{pid}.entries.jsonl"


def job_dir(root: str, job_id: str) -> str:
    return os.path.join(root, safe_job(job_id))


def file_prefix(root: str, job_id: str) -> str:
    """A Flight Recorder path prefix (dump file or pipe); torch appends the rank."""
    return os.path.join(job_dir(root, job_id), RANK_PREFIX)


def pipe_path(pipe_root: str, job_id: str, rank: int) -> str:
    """The FIFO ProcessGroupNCCL (or the reporter, for other backends) listens on."""
    return f"{file_prefix(pipe_root, job_id)}{rank}.pipe"
