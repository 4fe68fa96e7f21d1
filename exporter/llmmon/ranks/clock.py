"""The ranks collector's clock: Unix time that advances at the monotonic clock's rate.

Stall ages, rank staleness and spool sweeps are differences of times. Measured on the wall clock,
a step (NTP correcting a bad clock, an operator's `date -s`) reads as one: an hour back and a
hung group looked healthy for an hour; fifteen minutes forward and every live rank was dropped
and its spool files deleted. This clock starts at the wall time and then follows
`time.monotonic()`, so a step changes none of its differences; the step is measured (the wall
time minus this clock, `offset`) and logged once, and file times written after it are read
back onto this clock with it (`llmmon.ranks.ingest`).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger("llmmon.ranks.clock")
STEP = 2.0  # seconds the wall clock may drift from the monotonic one before it is a step


class DaemonClock:
    def __init__(self, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._wall, self._monotonic = wall, monotonic
        self._start = wall() - monotonic()
        self._offset = 0.0

    def now(self) -> float:
        """Unix time as of the start, advanced by the monotonic clock since."""
        return self._start + self._monotonic()

    def offset(self) -> float:
        """The wall clock minus this one (0 until the wall clock steps), logged when it moves
        by more than STEP: a file time written on the wall clock minus it is on this one."""
        offset = self._wall() - self.now()
        if abs(offset - self._offset) > STEP:
            log.warning("the wall clock stepped %+.1f s; rank ages, stalls and spool sweeps "
                        "keep to the monotonic clock (offset now %+.1f s)",
                        offset - self._offset, offset)
            self._offset = offset
        return self._offset
