"""Stacks of the ranks that run without the reporter, taken with py-spy at a bounded cost.

Each rank is sampled every `interval` seconds all the time, and every `quick_interval` while
its job is suspect (llmmon.ranks.stacks); a thread does it, so a slow dump never delays a
collector run.  The daemon's CPU for it is a budget, not a rate: each dump's CPU time (py-spy
is a child process: RUSAGE_CHILDREN) is paid from a bucket that fills at `budget` CPU seconds
per second up to BURST seconds, and a dump the bucket cannot pay for waits; the samples it
skipped are counted.  `py-spy dump --nonblocking` does not pause the process it reads.
"""

from __future__ import annotations

import copy
import logging
import resource
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping

from llmmon.ranks.stacks import History
from llmmon.sources import pyspy

log = logging.getLogger(__name__)

Key = tuple[int, int]  # pid, start ticks
BURST = 2.0  # CPU seconds the bucket holds: a suspect job's first quick round
TICK = 0.2  # seconds between the thread's looks at what is due
DUMP_TIMEOUT = 5.0


def _children_cpu() -> float:
    """CPU time of the reaped children (py-spy): getrusage's microseconds, not os.times()'s
    10 ms ticks, which are coarser than a dump (~13 ms)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class _Want:
    quick: bool
    last: float = float("-inf")


class StackSampler:
    def __init__(self, binary: str, interval: float, quick_interval: float, budget: float,
                 clock: Callable[[], float]) -> None:
        self.binary, self.interval, self.quick_interval = binary, interval, quick_interval
        self.budget, self.clock = budget, clock
        self._wanted: dict[Key, _Want] = {}
        self._histories: dict[Key, History] = {}
        self._tokens = BURST
        self._filled = clock()
        self.counts: Counter[str] = Counter()  # taken, failed, over_budget
        self.cpu_seconds = 0.0
        self.errors: dict[Key, str] = {}  # the last failure of each process, for the log
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def want(self, wanted: Mapping[Key, bool]) -> None:
        """The processes to sample (key -> quickly); the others are forgotten."""
        with self._lock:
            self._wanted = {k: self._wanted.get(k, _Want(quick)) for k, quick in wanted.items()}
            for key, quick in wanted.items():
                self._wanted[key].quick = quick
            self._histories = {k: h for k, h in self._histories.items() if k in wanted}
            self.errors = {k: e for k, e in self.errors.items() if k in wanted}

    def histories(self) -> dict[Key, History]:
        """A copy of each process' samples."""
        with self._lock:
            return copy.deepcopy(self._histories)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="llmmon-stacks", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(DUMP_TIMEOUT + 1)

    def _run(self) -> None:
        while not self._stop.wait(TICK):
            try:
                self.sample_due()
            except Exception:  # never let one bad process end the sampling of the others
                log.exception("stack sampling failed")

    def sample_due(self) -> int:
        """Sample every process that is due and that the budget pays for; how many were."""
        now = self.clock()
        with self._lock:
            due = [(key, want) for key, want in self._wanted.items()
                   if now - want.last >= (self.quick_interval if want.quick else self.interval)]
        # a suspect job's ranks first (what the budget pays for decides a verdict), then the
        # longest unsampled
        due.sort(key=lambda item: (not item[1].quick, item[1].last))
        taken = 0
        for key, want in due:
            if not self._pay():
                with self._lock:
                    self.counts["over_budget"] += len(due) - taken
                break
            before = _children_cpu()
            at = self.clock()
            try:
                frames = pyspy.dump(self.binary, key[0], DUMP_TIMEOUT)
            except pyspy.StackError as exc:
                frames, error = None, str(exc)
            else:
                error = ""
            used = max(0.0, _children_cpu() - before)
            with self._lock:
                self._tokens -= used
                self.cpu_seconds += used
                want.last = at
                if frames is None:
                    self.counts["failed"] += 1
                    self.errors[key] = error
                    continue
                self.counts["taken"] += 1
                self.errors.pop(key, None)
                if key in self._wanted:
                    self._histories.setdefault(key, History()).add(at, frames)
            taken += 1
        return taken

    def _pay(self) -> bool:
        """Whether the bucket holds CPU time for one more dump (it may go below zero by that
        dump's cost; the next waits until it refills)."""
        now = self.clock()
        with self._lock:
            self._tokens = min(BURST, self._tokens + (now - self._filled) * self.budget)
            self._filled = now
            return self._tokens > 0
