"""The daemon side: a ring of the sampler's own snapshots and the report /api/v1/diagnose serves.

Every `interval` seconds a thread adds the sampler's digests of its collectors' last runs (the
series the tree reads, taken as each run was rendered: never a collector call, never on the
scrape path) to the window; a request evaluates the tree over the window, so rates cover the last
`span` seconds without a second scrape.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from llmmon.diagnose.branches import TREE
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.tree import evaluate
from llmmon.diagnose.window import LocalView, Window, merge
from llmmon.sampler import Sampler

log = logging.getLogger("llmmon.diagnose")
PATH = "/api/v1/diagnose"
FRESH = 1.0  # seconds: requests more often than this share one observation


class Diagnoser:
    def __init__(self, sampler: Sampler, interval: float = 10.0, span: float = 120.0,
                 thresholds: Thresholds | None = None) -> None:
        self.sampler = sampler
        self.interval = interval
        self.window = Window(span)
        self.thresholds = thresholds or Thresholds()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def observe(self) -> None:
        """Add the sampler's current snapshot to the window."""
        self.window.append(merge(self.sampler.digests()))

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="diagnose", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _loop(self) -> None:
        # An observation before every collector has run once would judge a half-empty node.
        while not self.sampler.wait_first_cycle(1.0):
            if self._stop.is_set():
                return
        while not self._stop.is_set():
            try:
                self.observe()
            except Exception:  # a bad snapshot costs one observation, not the thread
                log.exception("diagnose: could not observe the collectors' snapshots")
            self._stop.wait(self.interval)

    def result(self) -> dict[str, Any]:
        """The report as JSON over the window, brought up to the sampler's latest snapshot:
        a request adds an observation unless the newest is under FRESH seconds old."""
        observations = self.window.observations()
        if not observations or time.time() - observations[-1].time > FRESH:
            self.observe()
            observations = self.window.observations()
        view = LocalView(observations, "daemon", PATH, self.thresholds)
        return evaluate(view, self.thresholds, TREE).as_json()
