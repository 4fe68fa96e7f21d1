"""XID critical errors, counted event by event in their own thread.

dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS` is the *last* XID seen, so a repeat of the same code
is invisible; here every event adds one to `llmmon_gpu_xid_errors_total{xid}` and stamps the
wall-clock time it arrived (NVML events carry none).  The thread waits on an NVML event set
outside the collection cycle, so XIDs are counted even while collections fail, which is when
they happen; it re-registers with backoff when the event set breaks.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

from llmmon.sources.nvml import EventSet, NvmlError, NvmlSource, XID_CRITICAL_EVENT

WAIT_S = 0.5
BACKOFF_S = (1.0, 30.0)

log = logging.getLogger("llmmon.gpu.xid")


class XidWatcher:
    def __init__(self, source: NvmlSource, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.clock = clock
        self._wanted: tuple[int, ...] = ()
        self._watched: tuple[int, ...] = ()
        self._registered_for: tuple[int, ...] | None = None
        self._events: EventSet | None = None
        self._counts: dict[tuple[int, int], tuple[int, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, gpus: Sequence[int]) -> None:
        """The GPUs to register; a change re-registers on the next poll."""
        self._wanted = tuple(gpus)

    @property
    def watched(self) -> tuple[int, ...]:
        """GPUs registered for XID events (those whose driver supports them)."""
        return self._watched

    def seed(self, gpu: int, xid: int, count: int, last: float) -> None:
        """Add `count` events that happened before the event set existed (the kernel log)."""
        with self._lock:
            seen, latest = self._counts.get((gpu, xid), (0, 0.0))
            self._counts[(gpu, xid)] = (seen + count, max(latest, last))

    def counts(self) -> dict[tuple[int, int], tuple[int, float]]:
        """(gpu, xid) -> (events so far, wall-clock time of the last one)."""
        with self._lock:
            return dict(self._counts)

    def _register(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None
        wanted = self._wanted
        supported = []
        for gpu in wanted:
            try:
                if self.source.call(gpu, "supported_event_types") & XID_CRITICAL_EVENT:
                    supported.append(gpu)
            except NvmlError:  # unsupported, or lost: the other GPUs are still watched
                continue
        self._events = self.source.xid_event_set(supported) if supported else None
        self._watched = tuple(supported)
        self._registered_for = wanted

    def poll(self, timeout: float) -> bool:
        """Register if needed, wait up to `timeout` for one event and count it."""
        if self._registered_for != self._wanted:
            self._register()
        if self._events is None:
            self._stop.wait(timeout)
            return False
        event = self._events.wait(timeout)
        if event is None:
            return False
        with self._lock:
            count, _ = self._counts.get((event.gpu, event.xid), (0, 0.0))
            self._counts[(event.gpu, event.xid)] = (count + 1, self.clock())
        log.warning("XID %d on GPU %d", event.xid, event.gpu)
        return True

    # the thread ----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpu-xid", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        backoff = BACKOFF_S[0]
        while not self._stop.is_set():
            try:
                self.poll(WAIT_S)
                backoff = BACKOFF_S[0]
            except Exception as exc:  # a broken event set is re-created, never fatal
                log.warning("XID event wait failed (retrying in %.0fs): %s", backoff, exc)
                self._watched, self._registered_for = (), None  # re-register on the next poll
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_S[1])
        if self._events is not None:
            self._events.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=WAIT_S + 1.0)
