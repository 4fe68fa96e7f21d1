"""Is each rank's process still there, in what state, and when did it go?

The daemon reads /proc/<pid>/stat (under --path.procfs) of every rank it follows.  A pid is
trusted only once it was seen alive with the start time the reporter wrote: a daemon in
another PID namespace sees other processes (or none) under those numbers and never judges.
A followed process that disappears, becomes a zombie or is replaced by another one has ended;
the time that was first seen orders the ends of a job's ranks (a thread polls every
`interval`, finer than the collector's runs, because torchrun tears the other ranks down
within a fraction of a second of the first one's death).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from llmmon.sources import procstat
from llmmon.sources.fs import RootedFS

Key = tuple[str, int, int]  # job_id, rank, pid


@dataclass
class Process:
    start_ticks: int
    visible: bool = False
    state: str = ""  # the kernel's letter while visible
    gone_at: float | None = None
    exit_status: int | None = None  # read while it was a zombie
    cpu_seconds: float = -1.0
    cpu_changed: float = 0.0  # when its CPU time last moved, as this daemon saw it


class PidWatch:
    def __init__(self, procfs: RootedFS, interval: float = 0.1) -> None:
        self.procfs = procfs
        self.interval = interval
        self._processes: dict[Key, Process] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="llmmon-pidwatch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * self.interval + 1)

    def follow(self, wanted: dict[Key, int]) -> None:
        """Follow exactly these processes (key -> the start time their reporter wrote)."""
        with self._lock:
            for key in set(self._processes) - set(wanted):
                del self._processes[key]
            for key, start in wanted.items():
                if key not in self._processes and start > 0:
                    self._processes[key] = Process(start)

    def get(self, key: Key) -> Process | None:
        with self._lock:
            process = self._processes.get(key)
            return None if process is None else Process(**vars(process))

    def poll(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            followed = [(key, p) for key, p in self._processes.items() if p.gone_at is None]
        for key, process in followed:
            stat = procstat.read(self.procfs, key[2])
            with self._lock:
                self._observe(process, stat, now)

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
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception:  # never let the watcher thread die; the collector polls too
                pass
