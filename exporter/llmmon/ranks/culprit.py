"""What a rank is doing while its group waits: where its training thread is, and whether it works.

From the reporter: the training thread's Python stack (taken while nothing of the rank
completes) and its CPU and I/O counters; from the daemon: the process state in procfs.  A rank
behind its peers that uses CPU or moves bytes is busy (a checkpoint, a long step, evaluation)
and is given until the ceiling; one that sleeps without CPU is hung; one in state T is frozen
(SIGSTOP, a debugger), its reporter with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from llmmon.ranks.ledger import RankTrack
from llmmon.ranks.liveness import Process
from llmmon.ranks.validate import Frame
from llmmon.sources.procstat import STATES

BUSY_WITHIN = 10.0  # seconds: CPU or I/O this recent makes a rank busy
MAX_WHERE = 120  # characters of the `where` label
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")


def library(frame: Frame) -> bool:
    return any(part in frame.file for part in _LIBRARY) or frame.module.startswith(
        ("torch.", "llmmon_reporter"))


def outside_torch(stack: tuple[Frame, ...] | None) -> bool:
    """The training thread's innermost Python frame is not torch's (the job's own code, or
    the standard library it called: a sleep, a lock): it waits on no collective, whatever the
    Flight Recorder has in flight for it (an asynchronous one it has not waited on yet).  A
    wait in C++ under torch (a Work, autograd's engine waiting on DDP's reductions) leaves a
    torch frame innermost."""
    return bool(stack) and not stack[0].module.startswith("torch")  # type: ignore[index]


def where(stack: tuple[Frame, ...] | None) -> str:
    """`load_next_batch (data.py:41)`, or `save (torch.serialization) from save_ckpt (ckpt.py:12)`:
    the innermost frame of the job's own code, and the library call it is in."""
    if not stack:
        return ""
    index = next((i for i, f in enumerate(stack) if not library(f)), 0)
    own = stack[index]
    text = f"{own.function} ({os.path.basename(own.file)}:{own.line})"
    if index > 0:
        call = stack[index - 1]
        text = f"{call.function} ({call.module}) from {text}"
    return text[:MAX_WHERE]


def _size(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


@dataclass(frozen=True)
class Doing:
    where: str
    state: str  # the process state in words; empty when procfs cannot see it
    cpu_idle: float | None  # seconds since the training thread last used CPU
    io_idle: float | None
    read_bytes: float  # over the window
    written_bytes: float
    busy: bool
    stopped: bool

    def json(self) -> dict[str, Any]:
        return {"where": self.where, "state": self.state,
                "cpu_idle_seconds": _round(self.cpu_idle), "io_idle_seconds": _round(self.io_idle),
                "read_bytes": self.read_bytes, "written_bytes": self.written_bytes,
                "busy": self.busy, "stopped": self.stopped}

    def text(self, window: float, report_age: float) -> str:
        """`it is in load_next_batch (data.py:41), sleeping, no CPU for 35 s`; empty when
        nothing is known (no reporter activity, no stack, no procfs)."""
        if not (self.where or self.state or self.cpu_idle is not None):
            return ""
        if self.stopped:
            return (f"it is stopped (state T: SIGSTOP or a debugger), its reporter silent for "
                    f"{report_age:.0f} s" + (f"; last seen in {self.where}" if self.where else ""))
        parts = [f"in {self.where}" if self.where else "outside any collective"]
        if self.state:
            parts.append(self.state)
        if self.busy and self.written_bytes + self.read_bytes >= 1e6:
            both = (("writing", self.written_bytes), ("reading", self.read_bytes))
            big = [(verb, n) for verb, n in both if n >= 1e6] or [max(both, key=lambda v: v[1])]
            moved = " and ".join(f"{verb} {_size(n)}" for verb, n in big)
            parts.append(f"{moved} in {window:.0f} s: busy (a checkpoint or a long step), "
                         "not a hang")
        elif self.busy:
            parts.append("using CPU: busy (a long step, compilation or evaluation), not a hang")
        elif self.cpu_idle is not None:
            parts.append(f"no CPU for {self.cpu_idle:.0f} s")
        return "it is " + ", ".join(parts)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _since_running(track: RankTrack, cpu_idle: float | None, now: float) -> float | None:
    """`cpu_idle`, but no longer than since the daemon saw the rank enqueue a collective: a
    light rank (under CPU_ACTIVE) that did was running then.  Not since a completion: the
    first sight of one (a fresh ledger, `diagnose --spool.dir`) is noted as now."""
    enqueued = max((n for pg in track.state.progress if (n := track.last_enqueue(pg))),
                   default=None)
    if cpu_idle is None or enqueued is None:
        return cpu_idle
    return min(cpu_idle, max(0.0, now - enqueued))


def doing(track: RankTrack, process: Process | None, now: float, window: float,
          stale_after: float) -> Doing:
    """What `track`'s rank did over the last `window` seconds."""
    activity = track.state.activity
    state = STATES.get(process.state, process.state) if process and process.visible else ""
    stopped = bool(process and process.visible and process.state in ("T", "t"))
    cpu_idle = io_idle = None
    read = written = 0.0
    if activity is not None:
        cpu_active = activity.cpu_active
        if process is not None and process.visible and process.cpu_changed and stopped:
            cpu_active = min(cpu_active, process.cpu_changed)
        cpu_idle = max(0.0, now - cpu_active)
        io_idle = max(0.0, now - activity.io_active)
        since = now - window
        base = next((a for at, a in reversed(track.activity) if at <= since),
                    track.activity[0][1] if track.activity else activity)
        read = float(activity.read_bytes - base.read_bytes)
        written = float(activity.written_bytes - base.written_bytes)
    cpu_idle = _since_running(track, cpu_idle, now)
    fresh = track.age(now) <= stale_after and not stopped
    busy = fresh and min(v for v in (cpu_idle, io_idle, float("inf")) if v is not None) \
        < BUSY_WITHIN
    return Doing(where(track.state.stack), state, cpu_idle, io_idle, read, written, busy,
                 stopped)
