"""What procfs tells about another user's process: its environment, I/O counters, owner, maps.

Everything here is written by whoever owns the process, so it is hostile input: each read is
bounded, undecodable bytes are replaced, and a file that cannot be read is "unknown", never an
error that stops the scan of the other processes.  Reading another user's `environ`, `io` or
`maps` needs the daemon to run as root or with CAP_SYS_PTRACE in the processes' PID namespace
(docs/deployment.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from llmmon.sources.fs import RootedFS, SourceError

MAX_ENVIRON = 256 * 1024  # a training job's environment is a few kB; Slurm's, tens of kB
MAX_ENTRIES = 4096  # variables kept from one environment
MAX_MAPS = 8 * 1024 * 1024  # /proc/<pid>/maps of a CUDA process runs to a few MB


@dataclass(frozen=True)
class ProcIO:
    read_bytes: int
    written_bytes: int
    voluntary_switches: int
    involuntary_switches: int


def pids(procfs: RootedFS) -> list[int]:
    """The process ids in procfs; [] when it cannot be listed."""
    try:
        return [int(name) for name in procfs.listdir() if name.isdigit()]
    except SourceError:
        return []


def environ(procfs: RootedFS, pid: int) -> dict[str, str] | None:
    """The environment the process started with; None when it cannot be read (gone, another
    user's without the grant, a kernel thread's empty one) or is larger than MAX_ENVIRON."""
    try:
        text = procfs.read_text(str(pid), "environ", max_bytes=MAX_ENVIRON)
    except SourceError:
        return None
    out: dict[str, str] = {}
    for item in text.split("\0")[:MAX_ENTRIES]:
        key, sep, value = item.partition("=")
        if sep and key and key not in out:
            out[key] = value
    return out or None


def owner(procfs: RootedFS, pid: int) -> int:
    """The uid owning the process' procfs directory (its real owner); -1 when unknown."""
    try:
        return os.stat(procfs.path(str(pid))).st_uid
    except OSError:
        return -1


def io(procfs: RootedFS, pid: int) -> ProcIO | None:
    """Bytes the process moved to and from storage, and its context switches; None when
    unreadable."""
    try:
        counters = _fields(procfs.read_text(str(pid), "io", max_bytes=4096))
        status = _fields(procfs.read_text(str(pid), "status", max_bytes=16384))
        return ProcIO(counters["read_bytes"], counters["write_bytes"],
                      status["voluntary_ctxt_switches"], status["nonvoluntary_ctxt_switches"])
    except (SourceError, KeyError):
        return None


def maps_mention(procfs: RootedFS, pid: int, needle: str) -> bool:
    """Whether the process has a file whose path holds `needle` mapped (a loaded library)."""
    try:
        return needle in procfs.read_text(str(pid), "maps", max_bytes=MAX_MAPS)
    except SourceError:
        return False


def _fields(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        words = value.split()
        if words and words[0].isdigit():
            out[key.strip()] = int(words[0])
    return out
