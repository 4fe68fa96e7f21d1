"""One process' /proc/<pid>/stat: its state, start time, CPU time and (as a zombie) exit status.

The fields after `(comm)` are split on spaces (comm itself may hold spaces and parentheses);
numbering follows proc(5): 3 state, 4 ppid, 14 utime, 15 stime, 22 starttime, 52 exit_code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from llmmon.sources.fs import RootedFS, SourceError

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
STATES = {"R": "running", "S": "sleeping", "D": "disk sleep", "T": "stopped",
          "t": "tracing stop", "Z": "zombie", "X": "dead", "I": "idle", "P": "parked",
          "W": "waking"}


@dataclass(frozen=True)
class ProcStat:
    state: str  # one letter, as the kernel writes it
    start_ticks: int
    cpu_seconds: float
    exit_code: int | None  # waitpid(2) form; only meaningful for a zombie
    ppid: int = 0

    @property
    def ended(self) -> bool:
        return self.state in ("Z", "X")

    @property
    def word(self) -> str:
        return STATES.get(self.state, self.state)


def read(procfs: RootedFS, pid: int, tid: int | None = None) -> ProcStat | None:
    """The process' stat (with `tid`: that thread's), or None when there is no such process
    (or it cannot be read)."""
    parts = (str(pid), "stat") if tid is None else (str(pid), "task", str(tid), "stat")
    try:
        text = procfs.read_text(*parts, max_bytes=4096)
    except SourceError:
        return None
    end = text.rfind(")")
    fields = text[end + 2:].split() if end > 0 else []
    if len(fields) < 20 or not all(f.lstrip("-").isdigit()
                                   for f in fields[1:2] + fields[11:13] + fields[19:20]):
        return None
    exit_code = int(fields[49]) if len(fields) > 49 and fields[49].lstrip("-").isdigit() else None
    return ProcStat(fields[0], int(fields[19]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
                    exit_code, int(fields[1]))


def exit_status(raw: int | None) -> int | None:
    """waitpid's status as a shell reports it: the exit code, or minus the signal."""
    if raw is None:
        return None
    return -(raw & 0x7F) if raw & 0x7F else (raw >> 8) & 0xFF
