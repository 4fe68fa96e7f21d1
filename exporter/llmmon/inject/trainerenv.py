"""The environment a training rank needs for the reporter and the Flight Recorder.

One function for both ways in: `llmmon launch` applies it to the launcher's environment, the
admission webhook to what a pod's container spec shows, so the two never disagree.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

from llmmon_reporter import layout


# NCCL's log, for the transport it chose (`NET/IB : Using ...`, `via NET/IB/0/GDRDMA`): INIT
# covers those lines and ENV the settings NCCL applied (nccl.conf's included), a few hundred
# lines per communicator. %p keeps ranks apart; %h keeps nodes apart on a shared directory.
NCCL_LOG_NAME = "nccl.%h.%p.log"
NCCL_LOG_SUBSYS = "INIT,ENV"


def environment(env: Mapping[str, str], job: str, spool: str, fr_dir: str, pipe_dir: str,
                fr_buffer: int, timing: bool, dump_on_timeout: bool,
                boot_dir: str, nccl_log: bool) -> dict[str, str]:
    """`env` with ours added; the user's own settings are kept, and `boot_dir` (the reporter's
    start-up hook) goes first on PYTHONPATH, once.  With `nccl_log`, a job that sets neither
    NCCL_DEBUG nor NCCL_DEBUG_FILE (so NCCL prints nothing) writes NCCL's INFO log to a file in
    its dump directory, for the daemon's nccl collector; a job's own NCCL_DEBUG is never
    changed."""
    out = dict(env)
    out["LLMMON_JOB"] = job
    out["LLMMON_SPOOL"] = spool
    buffer = out.get("TORCH_FR_BUFFER_SIZE") or out.get("TORCH_NCCL_TRACE_BUFFER_SIZE") \
        or str(fr_buffer)
    # Both names: torch >= 2.8 reads TORCH_FR_*, but the dump pipe checks only the old one.
    out.setdefault("TORCH_FR_BUFFER_SIZE", buffer)
    out.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", buffer)
    dump_prefix = out.get("TORCH_FR_DUMP_TEMP_FILE") or out.get(
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or layout.file_prefix(fr_dir, job)
    out.setdefault("TORCH_FR_DUMP_TEMP_FILE", dump_prefix)
    out.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", dump_prefix)
    out.setdefault("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", layout.file_prefix(pipe_dir, job))
    out.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1" if dump_on_timeout else "0")
    if timing:
        out["TORCH_NCCL_ENABLE_TIMING"] = "1"
    if nccl_log and not out.get("NCCL_DEBUG") and not out.get("NCCL_DEBUG_FILE"):
        out["NCCL_DEBUG"] = "INFO"
        out.setdefault("NCCL_DEBUG_SUBSYS", NCCL_LOG_SUBSYS)
        out["NCCL_DEBUG_FILE"] = os.path.join(os.path.dirname(dump_prefix), NCCL_LOG_NAME)
    out["PYTHONPATH"] = first_on_path(boot_dir, out.get("PYTHONPATH", ""))
    return out


def first_on_path(directory: str, path: str) -> str:
    """`directory` first on a PYTHONPATH-style `path`, the other entries kept in order."""
    wanted = os.path.normpath(directory)
    rest = [p for p in path.split(os.pathsep) if p and os.path.normpath(p) != wanted]
    return os.pathsep.join([directory, *rest])


# The variables whose directories must exist before torch writes a dump or makes its pipe.
JOB_DIR_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")


def job_dirs(env: Mapping[str, str]) -> list[str]:
    """The job's dump and pipe directories, as `environment` names them."""
    return [os.path.dirname(env[key]) for key in JOB_DIR_VARIABLES if env.get(key)]


def prepare_job_dirs(directories: Iterable[str]) -> list[str]:
    """Create them open to all (the daemon, another user, moves dumps and opens pipes); the
    problems, in words: a job must start even when this is not possible."""
    problems = []
    for directory in directories:
        try:
            os.makedirs(directory, exist_ok=True)
            os.chmod(directory, 0o777)
        except OSError as exc:
            problems.append(f"cannot prepare {directory}: {exc.strerror}; Flight Recorder "
                            "dumps on request will not work")
    return problems
