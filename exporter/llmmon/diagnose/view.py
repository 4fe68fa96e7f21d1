"""What the checks read: samples of one moment, and rates over a window, from any source.

Checks are written once against `View`.  The local window (the daemon's ring of snapshots, or
two scrapes of /metrics) and a Prometheus server implement it; recording rules are read by their
shipped names, computed in Python locally and queried as recorded series from Prometheus.
`window` arguments are PromQL ranges as the alerts use them; the local window uses its own span.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol


class QueryError(Exception):
    """The samples could not be read (server down, refused query); no verdict is possible."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float

    def get(self, label: str) -> str:
        return self.labels.get(label, "")


class View(Protocol):
    kind: str  # "daemon", "scrape" or "prometheus"
    url: str
    scope: str  # "node" or "cluster"
    now: float  # unix time the samples describe
    window_seconds: float
    observations: int

    def instant(self, name: str, selector: str = "") -> list[Sample]:
        """The latest value of every series of `name` matching the selector."""

    def rate(self, name: str, window: str, selector: str = "") -> list[Sample] | None:
        """Per-second increase of a counter; None when the source has a single observation."""

    def increase(self, name: str, window: str, selector: str = "") -> list[Sample] | None:
        """Increase of a counter over the window; None with a single observation."""

    def mean_over_time(self, name: str, window: str, selector: str = "") -> list[Sample]:
        """Mean of a gauge over the window (over the observations there are)."""

    def rule(self, record: str) -> list[Sample] | None:
        """A shipped recording rule's series; None when it needs rates the source lacks."""


# -- helpers shared by the checks and the local recording rules ------------------------------
def key(sample: Sample, labels: Iterable[str]) -> tuple[str, ...]:
    return tuple(sample.get(label) for label in labels)


def group(samples: Iterable[Sample], *labels: str) -> dict[tuple[str, ...], list[Sample]]:
    grouped: dict[tuple[str, ...], list[Sample]] = defaultdict(list)
    for sample in samples:
        grouped[key(sample, labels)].append(sample)
    return dict(grouped)


def index(samples: Iterable[Sample], *labels: str) -> dict[tuple[str, ...], Sample]:
    """One sample per key (the last one met when several share it)."""
    return {key(sample, labels): sample for sample in samples}


def where(samples: Iterable[Sample], test: Callable[[Sample], bool]) -> list[Sample]:
    return [sample for sample in samples if test(sample)]


def only(samples: Iterable[Sample], **labels: str) -> list[Sample]:
    return [s for s in samples if all(s.get(k) == v for k, v in labels.items())]


def total(samples: Iterable[Sample]) -> float:
    return sum(sample.value for sample in samples)
