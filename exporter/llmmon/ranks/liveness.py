"""Is each rank's process still there, in what state, and when did it go?

The daemon reads /proc/<pid>/stat (under --path.procfs) of every rank it follows.  A pid is
trusted only once it was seen alive with the start time the reporter wrote: a daemon in
another PID namespace sees other processes (or none) under those numbers and never judges.
A followed process that disappears, becomes a zombie or is replaced by another one has ended;
the time that was first seen orders the ends of a job's ranks (a thread polls every
`interval`, finer than the collector's runs, because torchrun tears the other ranks down
within a fraction of a second of the first one's death).

A process' exit status is readable only while it is a zombie, and torchrun reaps its workers
within its 0.1 s monitor interval: a poll every 0.1 s misses it about half the time, and a
SIGKILLed rank then reads like the ranks torchrun tore down after it.  So the thread also
holds a pidfd (pidfd_open(2), Linux 5.3) of each visible process, which becomes readable the
moment the process exits, before its parent reaps it, and reads its stat then.  On a loaded
node the thread can wake after torchrun has reaped it all the same; from Linux 6.15 the held
pidfd itself keeps the status after the reap (ioctl PIDFD_GET_INFO, PIDFD_INFO_EXIT), and the
thread asks it whenever the zombie was missed.  A pidfd is
kept only if the process under that number in this daemon's own /proc has the start time the
reporter wrote (with --path.procfs of another PID namespace the numbers mean other processes).
While it holds a pidfd of every process it follows (or follows none: a node between jobs), exits
wake it anyway and it polls states and CPU times once a second (HELD_POLL) instead of every
`interval`: ten wakeups a second less on most nodes.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable

from llmmon.sources import procstat
from llmmon.sources.fs import RootedFS

Key = tuple[str, int, int]  # job_id, rank, pid
HELD_POLL = 1.0  # s between polls when no exit can be missed (see the module's docstring)
# linux/pidfd.h: struct pidfd_info (its first version, 64 bytes) and the ioctl that fills it
PIDFD_INFO = struct.Struct("=QQ11Ii")  # mask, cgroupid, pid ... fsgid, exit_code
PIDFD_GET_INFO = 0xC0000000 | PIDFD_INFO.size << 16 | 0xFF << 8 | 11  # _IOWR(0xFF, 11, ...)
PIDFD_INFO_EXIT = 1 << 3


def pidfd_exit_status(fd: int) -> int | None:
    """The exit status the kernel keeps with a pidfd once its process was reaped (Linux 6.15),
    as a shell reports it; None while it runs or is a zombie, or on an older kernel."""
    info = bytearray(PIDFD_INFO.size)
    PIDFD_INFO.pack_into(info, 0, PIDFD_INFO_EXIT, *[0] * 13)
    try:
        fcntl.ioctl(fd, PIDFD_GET_INFO, info, True)
    except OSError:  # ENOTTY/EINVAL before 6.15; ESRCH if it vanished without a record
        return None
    mask, *_, exit_code = PIDFD_INFO.unpack(info)
    return procstat.exit_status(exit_code) if mask & PIDFD_INFO_EXIT else None


@dataclass
class Process:
    start_ticks: int
    visible: bool = False
    state: str = ""  # the kernel's letter while visible
    gone_at: float | None = None
    exit_status: int | None = None  # read while it was a zombie
    cpu_seconds: float = -1.0
    cpu_changed: float = 0.0  # when its CPU time last moved, as this daemon saw it


def seen_alive(procfs: RootedFS) -> Callable[[int, int], bool]:
    """Whether a process is seen running under `procfs` with that pid and start time (a start
    time of 0, unknown, is never seen: a pid alone may be anybody's)."""
    def alive(pid: int, start_ticks: int) -> bool:
        stat = procstat.read(procfs, pid)
        return start_ticks > 0 and stat is not None and not stat.ended \
            and stat.start_ticks == start_ticks
    return alive


class PidWatch:
    def __init__(self, procfs: RootedFS, interval: float = 0.1,
                 clock: Callable[[], float] = time.time) -> None:
        self.procfs = procfs
        self.interval = interval
        self.clock = clock  # the collector's (llmmon.ranks.clock): its thread's times match
        self._processes: dict[Key, Process] = {}
        self._pidfds: dict[Key, int] = {}  # of visible processes not yet seen gone
        self._own = RootedFS("/proc")  # this daemon's PID namespace, for the pidfds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # a new pidfd, stop
        self._thread = threading.Thread(target=self._run, name="llmmon-pidwatch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._wake()
        self._thread.join(2 * self.interval + 1)
        with self._lock:
            for key in list(self._pidfds):
                os.close(self._pidfds.pop(key))
        if not self._thread.is_alive():  # else the thread still polls them: leave them open
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # full: the thread is waking anyway
            pass

    def follow(self, wanted: dict[Key, int]) -> None:
        """Follow exactly these processes (key -> the start time their reporter wrote); a new
        one is looked at now, not after a slow poll's timeout."""
        with self._lock:
            for key in set(self._processes) - set(wanted):
                del self._processes[key]
                if key in self._pidfds:
                    os.close(self._pidfds.pop(key))
            new = [key for key, start in wanted.items()
                   if key not in self._processes and start > 0]
            for key in new:
                self._processes[key] = Process(wanted[key])
        if new and self._thread is not None:
            self._wake()

    def timeout(self) -> float:
        """Seconds until the next poll: `interval` while a followed process that has not ended
        has no pidfd held (its exit would be seen by polling only), else HELD_POLL."""
        with self._lock:
            unheld = any(p.gone_at is None and key not in self._pidfds
                         for key, p in self._processes.items())
        return self.interval if unheld else max(self.interval, HELD_POLL)

    def get(self, key: Key) -> Process | None:
        with self._lock:
            process = self._processes.get(key)
            return None if process is None else Process(**vars(process))

    def poll(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        with self._lock:
            followed = [(key, p) for key, p in self._processes.items() if p.gone_at is None]
        for key, process in followed:
            stat = procstat.read(self.procfs, key[2])
            with self._lock:
                self._observe(process, stat, now)
                if process.gone_at is not None and key in self._pidfds:
                    fd = self._pidfds.pop(key)
                    if process.exit_status is None:  # reaped before this thread woke
                        process.exit_status = pidfd_exit_status(fd)
                    os.close(fd)
                elif process.visible and key not in self._pidfds and self._thread is not None:
                    self._open_pidfd(key, process)

    def _drop(self, ready: set[tuple[Key, int]]) -> None:
        """A pidfd still held after its process exited (procfs did not show the end): polling
        goes on without it, rather than waking at once forever."""
        with self._lock:
            for key, fd in ready:
                if self._pidfds.get(key) == fd:
                    os.close(self._pidfds.pop(key))

    def _open_pidfd(self, key: Key, process: Process) -> None:
        """Hold a pidfd of the process if this daemon's PID namespace names it by that pid."""
        try:
            fd = os.pidfd_open(key[2])
        except (AttributeError, OSError):  # gone already, an old kernel, or not permitted
            return
        mine = procstat.read(self._own, key[2])
        if mine is None or mine.start_ticks != process.start_ticks:
            os.close(fd)  # another process under that number here: poll only
            return
        self._pidfds[key] = fd
        self._wake()  # the thread polls the new pidfd from now on, not after its timeout

    @staticmethod
    def _observe(process: Process, stat: procstat.ProcStat | None, now: float) -> None:
        same = stat is not None and stat.start_ticks == process.start_ticks
        if not process.visible:
            if not same or stat is None or stat.ended:
                return  # not ours to judge (another PID namespace), or gone before we looked
            process.visible = True
        if not same or stat is None or stat.ended:
            process.gone_at = now
            if same and stat is not None:
                process.exit_status = procstat.exit_status(stat.exit_code)
            return
        process.state = stat.state
        if stat.cpu_seconds != process.cpu_seconds:
            process.cpu_seconds, process.cpu_changed = stat.cpu_seconds, now

    def _run(self) -> None:
        """Poll every `timeout()`, at once when a held pidfd says its process exited, and when
        a process to look at is new."""
        poller, registered = select.poll(), set[int]()
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            try:
                with self._lock:
                    held = {fd: key for key, fd in self._pidfds.items()}
                for fd in registered - set(held):
                    poller.unregister(fd)
                for fd in set(held) - registered:
                    poller.register(fd, select.POLLIN)
                registered = set(held)
                events = poller.poll(self.timeout() * 1000)
                ready = {(held[fd], fd) for fd, _ in events if fd in held}
                if any(fd == self._wake_r for fd, _ in events):
                    os.read(self._wake_r, 4096)
                    with self._lock:
                        unseen = any(not p.visible and p.gone_at is None
                                     for p in self._processes.values())
                    if not ready and not unseen:
                        continue  # a new pidfd to register (or stop): no poll for it
                if not self._stop.is_set():
                    self.poll()
                self._drop(ready)
            except Exception:  # never let the watcher thread die; the collector polls too
                registered = set()
                poller = select.poll()
                poller.register(self._wake_r, select.POLLIN)
                self._stop.wait(self.interval)
