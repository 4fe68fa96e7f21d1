"""A bounded ring of exposition snapshots, and the `View` it offers the checks.

Rates need two observations: the daemon adds a snapshot of its collectors' latest runs every few
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
from typing import Iterable, Iterator

from prometheus_client.core import Metric
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
          "llmmon_pressure_", "llmmon_tcp_", "llmmon_job_nccl_")


def parse(text: str, previous: Snapshot | None = None) -> Snapshot:
    """The wanted samples of a text exposition (a scrape); comments and other families are
    skipped."""
    lines = [line for line in text.splitlines() if line.startswith(WANTED)]
    return digest(text_string_to_metric_families("\n".join(lines) + "\n"), previous)


def digest(families: Iterable[Metric], previous: Snapshot | None = None) -> Snapshot:
    """The wanted samples of `families`: the daemon takes them from each collector run as it
    renders it, a fat node's in ~1 ms instead of parsing its 200 KB exposition back (34 ms).

    A label set equal to one in `previous` reuses that object, so a window of snapshots stores
    each series' labels once, not once per snapshot (12 snapshots of the fat simulated node:
    1.7 MiB instead of 6.3)."""
    keys = {labels: labels for series in (previous or {}).values() for labels in series}
    snapshot: Snapshot = {}
    for family in families:
        if not family.name.startswith(WANTED):
            continue
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            labels = keys.setdefault(labels, labels)
            snapshot.setdefault(sys.intern(sample.name), {})[labels] = float(sample.value)
    return snapshot


def merge(snapshots: Iterable[Snapshot]) -> Snapshot:
    """One snapshot of several (the collectors'); their series dicts are shared, not copied."""
    merged: Snapshot = {}
    for snapshot in snapshots:
        for name, series in snapshot.items():
            merged[name] = {**merged[name], **series} if name in merged else series
    return merged


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
        """Observe a scraped text exposition."""
        with self._lock:
            newest = self._ring[-1].snapshot if self._ring else None
        self.append(parse(text, newest), at)

    def append(self, snapshot: Snapshot, at: float | None = None) -> None:
        """Observe a snapshot (never changed afterwards: observations share series dicts)."""
        observation = Observation(time.time() if at is None else at, snapshot)
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
