"""Instant GPU power sampled at 20 Hz and summarised per collector cycle.

`nvmlDeviceGetPowerUsage` is a 1 s running average: while a starved training job swings one
H200 between ~125 W and ~750 W several times a second, it reads a steady ~380 W (see
fixtures/h200/README.md).  This sampler reads `NVML_FI_DEV_POWER_INSTANT` (~2 µs a call) of
every GPU in one thread and keeps, per GPU:

- a dip counter: a dip is instant power falling below the *low* level after having been at or
  above the *busy* level (both fractions of the enforced power limit); the next dip needs the
  GPU to be busy again, so a GPU idling low counts no dips;
- the time spent below the low level (an idle GPU accrues it at 1 s/s);
- min, mean and max since the collector last took the window.

The 20 Hz loop only updates numbers under a lock; the collector renders them on its cadence.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from llmmon.sources.nvml import NvmlError, NvmlSource

POWER_INSTANT = "NVML_FI_DEV_POWER_INSTANT"
MAX_GAP_PERIODS = 3  # a late sample accrues at most this many periods of low time

log = logging.getLogger("llmmon.gpu.power")


@dataclass(frozen=True)
class PowerWindow:
    """One GPU's samples since the previous `take`; min/mean/max are None when there were none."""

    last_watts: float
    min_watts: float | None
    mean_watts: float | None
    max_watts: float | None
    samples_total: int
    dips_total: int | None  # None while the enforced power limit (hence the levels) is unknown
    low_seconds_total: float | None
    limit_watts: float | None = None  # the enforced power limit the levels follow

    @property
    def min_ratio(self) -> float | None:
        """The lowest sample as a share of the power limit (None while either is unknown)."""
        return self.min_watts / self.limit_watts \
            if self.min_watts is not None and self.limit_watts else None


class _Track:
    def __init__(self, limit_watts: float | None) -> None:
        self.limit_watts = limit_watts
        self.armed = False
        self.dips = 0
        self.low_seconds = 0.0
        self.samples = 0
        self.last_watts: float | None = None
        self.last_time: float | None = None
        self.window: list[float] = []


class PowerSampler:
    def __init__(self, source: NvmlSource, rate_hz: float = 20.0, busy_fraction: float = 0.5,
                 low_fraction: float = 0.3) -> None:
        if not 0 < low_fraction < busy_fraction <= 1:
            raise ValueError(f"power levels: need 0 < low ({low_fraction}) < busy "
                             f"({busy_fraction}) <= 1, as fractions of the power limit")
        self.source = source
        self.period = 1.0 / rate_hz
        self.busy_fraction = busy_fraction
        self.low_fraction = low_fraction
        self.last_tick: float | None = None  # time.monotonic() of the last finished tick
        self._tracks: dict[int, _Track] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged: str | None = None

    def track(self, gpu: int, limit_watts: float | None) -> None:
        """Sample `gpu` from now on; levels follow its enforced power limit."""
        with self._lock:
            if gpu in self._tracks:
                self._tracks[gpu].limit_watts = limit_watts
            else:
                self._tracks[gpu] = _Track(limit_watts)

    def tick(self, now: float) -> None:
        """Read every tracked GPU once (the thread's loop body; tests drive it directly)."""
        with self._lock:
            gpus = list(self._tracks)
        for gpu in gpus:
            try:
                watts = self.source.field_values(gpu, [POWER_INSTANT])[POWER_INSTANT].get() / 1000
            except NvmlError:
                with self._lock:
                    self._tracks[gpu].last_time = None  # do not bridge the gap with low time
                continue
            with self._lock:
                self._add(self._tracks[gpu], watts, now)
        self.last_tick = time.monotonic()

    def _add(self, track: _Track, watts: float, now: float) -> None:
        track.samples += 1
        track.window.append(watts)
        track.last_watts = watts
        if track.limit_watts:
            low = self.low_fraction * track.limit_watts
            if watts >= self.busy_fraction * track.limit_watts:
                track.armed = True
            elif watts < low:
                if track.armed:
                    track.dips += 1
                    track.armed = False
                if track.last_time is not None:
                    track.low_seconds += min(now - track.last_time, MAX_GAP_PERIODS * self.period)
        track.last_time = now

    def take(self, gpu: int) -> PowerWindow | None:
        """The window since the last call (then reset), or None if never sampled."""
        with self._lock:
            track = self._tracks.get(gpu)
            if track is None or track.last_watts is None:
                return None
            window, track.window = track.window, []
            known = bool(track.limit_watts)
            return PowerWindow(
                track.last_watts,
                min(window) if window else None,
                sum(window) / len(window) if window else None,
                max(window) if window else None,
                track.samples,
                track.dips if known else None,
                track.low_seconds if known else None,
                track.limit_watts)

    # the thread ----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpu-power", daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick(time.monotonic())
            except Exception as exc:  # the sampler must outlive any one bad read
                message = f"{type(exc).__name__}: {exc}"
                if message != self._logged:
                    log.warning("instant power sampling failed: %s", message)
                    self._logged = message
            next_at += self.period
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (slow reads): skip the missed ticks
                next_at, delay = time.monotonic(), 0.0
            # A plain sleep, not Event.wait, which makes and takes a lock per call: on this
            # 2-core VM a thread waking 20 times a second cost 0.25 % of a core with the wait,
            # 0.15 % with a sleep. close() waits out at most one period for the loop to stop.
            time.sleep(delay)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # a hung NVML read keeps a daemon thread; let it be
            self._thread.join(timeout=self.period + 1.0)
