"""A bounded ring of parsed exposition snapshots, and the `View` it offers the checks.

Rates need two observations: the daemon adds a snapshot of its own rendered /metrics every few
seconds and keeps those of the last couple of minutes; the CLI without a daemon endpoint scrapes
/metrics twice.  Only series the diagnosis reads (`WANTED` prefixes) are kept, so the ring of a
3,000-series node stays small.  Counter resets are handled as `rate()` does: a drop counts the
new value as the increase since the reset.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from statistics import fmean
from typing import Iterator

from prometheus_client.parser import text_string_to_metric_families

from llmmon.diagnose import matchers
from llmmon.diagnose.recording import RULES
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.view import Sample

LabelKey = tuple[tuple[str, str], ...]
Snapshot = dict[str, dict[LabelKey, float]]  # sample name -> label set -> value
# Families the checks and the local recording rules read.
WANTED = ("llmmon_gpu_", "llmmon_gpudirect_", "llmmon_rank_", "llmmon_torch_", "llmmon_nccl_",
          "llmmon_training_", "llmmon_rdma_", "llmmon_nic_", "llmmon_netdev_", "llmmon_disk_",
          "llmmon_pressure_", "llmmon_tcp_")


def parse(text: str, keys: dict[LabelKey, LabelKey] | None = None) -> Snapshot:
    """The wanted samples of a text exposition; comments and other families are skipped.

    `keys` holds the label sets of an earlier snapshot: an equal set reuses that object, so
    a window of snapshots stores each series' labels once, not once per snapshot (12
    snapshots of the fat simulated node: 1.7 MiB instead of 6.3)."""
    lines = [line for line in text.splitlines() if line.startswith(WANTED)]
    snapshot: Snapshot = {}
    keys = {} if keys is None else keys
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            labels = keys.setdefault(labels, labels)
            snapshot.setdefault(sys.intern(sample.name), {})[labels] = sample.value
    return snapshot


@dataclass(frozen=True)
class Observation:
    time: float
    snapshot: Snapshot


class Window:
    """The last `span` seconds of observations (at least the newest two), thread-safe."""

    def __init__(self, span: float) -> None:
        self.span = span
        self._ring: deque[Observation] = deque()
        self._lock = threading.Lock()

    def add(self, text: str, at: float | None = None) -> None:
        with self._lock:
            newest = self._ring[-1].snapshot if self._ring else {}
        keys = {labels: labels for series in newest.values() for labels in series}
        observation = Observation(time.time() if at is None else at, parse(text, keys))
        with self._lock:
            self._ring.append(observation)
            while len(self._ring) > 2 and observation.time - self._ring[0].time > self.span:
                self._ring.popleft()

    def observations(self) -> tuple[Observation, ...]:
        with self._lock:
            return tuple(self._ring)


class LocalView:
    """`View` over a window's observations (oldest first)."""

    scope = "node"

    def __init__(self, observations: tuple[Observation, ...], kind: str, url: str,
                 thresholds: Thresholds) -> None:
        if not observations:
            raise ValueError("a local view needs at least one observation")
        self.thresholds = thresholds
        self.kind = kind
        self.url = url
        self._obs = observations
        self.now = observations[-1].time
        self.observations = len(observations)
        self.window_seconds = observations[-1].time - observations[0].time

    def _series(self, name: str, selector: str,
                snapshot: Snapshot) -> Iterator[tuple[LabelKey, float]]:
        test = matchers.parse(selector)
        for labels, value in snapshot.get(name, {}).items():
            if test(dict(labels)):
                yield labels, value

    def instant(self, name: str, selector: str = "") -> list[Sample]:
        return [Sample(dict(labels), value)
                for labels, value in self._series(name, selector, self._obs[-1].snapshot)]

    def _history(self, name: str, selector: str) -> dict[LabelKey, list[tuple[float, float]]]:
        history: dict[LabelKey, list[tuple[float, float]]] = {}
        for observation in self._obs:
            for labels, value in self._series(name, selector, observation.snapshot):
                history.setdefault(labels, []).append((observation.time, value))
        return history

    def _increases(self, name: str, selector: str) -> list[tuple[LabelKey, float, float]] | None:
        """(labels, increase, seconds) of every series seen at least twice."""
        if len(self._obs) < 2:
            return None
        found = []
        for labels, points in self._history(name, selector).items():
            if len(points) < 2:
                continue
            grown = sum(b - a if b >= a else b for (_, a), (_, b) in zip(points, points[1:]))
            found.append((labels, grown, points[-1][0] - points[0][0]))
        return found

    def increase(self, name: str, window: str, selector: str = "") -> list[Sample] | None:
        found = self._increases(name, selector)
        if found is None:
            return None
        return [Sample(dict(labels), grown) for labels, grown, _ in found]

    def rate(self, name: str, window: str, selector: str = "") -> list[Sample] | None:
        found = self._increases(name, selector)
        if found is None:
            return None
        return [Sample(dict(labels), grown / seconds) for labels, grown, seconds in found
                if seconds > 0]

    def mean_over_time(self, name: str, window: str, selector: str = "") -> list[Sample]:
        return [Sample(dict(labels), fmean(value for _, value in points))
                for labels, points in self._history(name, selector).items()]

    def rule(self, record: str) -> list[Sample] | None:
        return RULES[record](self, self.thresholds)
