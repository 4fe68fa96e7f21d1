"""What the training thread is doing, seen from the reporter thread without stopping it.

- Its Python stack from `sys._current_frames()`: a snapshot of frame pointers taken under the
  GIL, no signal, no ptrace, nothing the trainer notices (tens of microseconds).
- Its activity since the previous tick: the main thread's CPU time
  (`/proc/self/task/<tid>/stat`), the process' bytes read and written (`/proc/self/io` rchar
  and wchar, less what the reporter itself wrote) and the main thread's voluntary and
  involuntary context switches (`/proc/self/status` is the thread-group leader's).

The reporter keeps the wall-clock time of the last tick in which the thread used CPU or moved
bytes, so the daemon can say "no CPU for 35 s" from one file.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

MAX_FRAMES = 24  # innermost first; the outer frames (main, the launcher) say little
MAX_TEXT = 200
CPU_ACTIVE = 0.02  # seconds of main-thread CPU per second of wall clock that count as busy
IO_ACTIVE = 256 << 10  # bytes per tick that count as I/O (a state file is a few kB)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def start_ticks() -> int:
    """Field 22 of /proc/self/stat: with the pid, it names this process (the daemon checks);
    0 where there is no procfs."""
    try:
        return int(_stat_fields("/proc/self/stat")[19])
    except (OSError, ValueError, IndexError):
        return 0


def _stat_fields(path: str) -> list[str]:
    """The fields after `(comm)`, which may itself hold spaces and parentheses."""
    with open(path, "rb") as handle:
        data = handle.read(4096)
    return data[data.rindex(b")") + 2:].decode().split()


def stack(thread_id: int) -> list[dict[str, Any]]:
    """Frames of thread `thread_id`, innermost first: file, line, function, module."""
    frame = sys._current_frames().get(thread_id)
    frames = []
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        frames.append({"file": code.co_filename[-MAX_TEXT:], "line": frame.f_lineno or 0,
                       "function": code.co_name[:MAX_TEXT],
                       "module": str(frame.f_globals.get("__name__", ""))[:MAX_TEXT]})
        frame = frame.f_back
    return frames


class Meter:
    """Cumulative counters of the main thread and process, and when they last moved."""

    def __init__(self) -> None:
        main = threading.main_thread()
        self.thread_id = main.ident or 0
        self.tid = _main_tid(main.native_id or os.getpid())
        self.own_written = 0  # bytes the reporter wrote (its files): not the trainer's I/O
        self._last: tuple[float, int] | None = None
        self._last_ns = 0
        self.cpu_active_ns = 0
        self.io_active_ns = 0

    def read(self) -> dict[str, Any] | None:
        """This tick's counters; None where there is no procfs to read them from."""
        now = time.time_ns()
        try:
            fields = _stat_fields(f"/proc/self/task/{self.tid}/stat")
            io = _keyed("/proc/self/io")
            status = _keyed("/proc/self/status")
        except (OSError, ValueError, IndexError):
            return None
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        moved = io.get("rchar", 0) + max(0, io.get("wchar", 0) - self.own_written)
        if self._last is None:
            self.cpu_active_ns = self.io_active_ns = now
        else:
            wall = max((now - self._last_ns) / 1e9, 1e-3)
            if cpu - self._last[0] >= CPU_ACTIVE * wall:
                self.cpu_active_ns = now
            if moved - self._last[1] >= IO_ACTIVE:
                self.io_active_ns = now
        self._last, self._last_ns = (cpu, moved), now
        return {"cpu_seconds": cpu, "read_bytes": io.get("rchar", 0),
                "written_bytes": max(0, io.get("wchar", 0) - self.own_written),
                "voluntary_switches": status.get("voluntary_ctxt_switches", 0),
                "involuntary_switches": status.get("nonvoluntary_ctxt_switches", 0),
                "cpu_active_ns": self.cpu_active_ns, "io_active_ns": self.io_active_ns}


def _main_tid(native: int) -> int:
    """The main thread's number in /proc's own PID namespace: the process's, as /proc/self
    names it. A process in a PID namespace that kept its parent's /proc (`unshare --pid`
    without `--mount-proc`, `nsenter --pid` alone) has another number there than gettid()."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return native


def _keyed(path: str) -> dict[str, int]:
    """`key: value` lines with an integer value (others are skipped)."""
    values = {}
    with open(path, "rb") as handle:
        for line in handle.read(16384).decode(errors="replace").splitlines():
            key, _, value = line.partition(":")
            value = value.strip()
            if value.isdigit():
                values[key] = int(value)
    return values
