"""Metric specifications: immutable descriptions that collectors fill per snapshot.

Collectors never keep module-level mutable metric objects; they declare `MetricSpec`s and
build fresh prometheus_client families from them on every run.  The same specs generate
docs/metrics.md, so the reference cannot drift from what is exported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

KINDS = ("gauge", "counter", "histogram", "info")


@dataclass(frozen=True)
class MetricSpec:
    """Name, type, help text and label names of one exported metric family."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: unknown metric kind {self.kind!r}")
        if self.kind == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counter names end in _total")
        if self.kind == "info" and not self.name.endswith("_info"):
            raise ValueError(f"{self.name}: info names end in _info")
        if "job" in self.labels or "instance" in self.labels:
            raise ValueError(f"{self.name}: 'job' and 'instance' labels belong to Prometheus")

    def family(self) -> Metric:
        """A new, empty prometheus_client family for this spec."""
        labels = list(self.labels)
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.help, labels=labels)
        if self.kind == "histogram":
            return HistogramMetricFamily(self.name, self.help, labels=labels)
        # Info metrics are exposed as gauges of value 1 (text format has no info type).
        return GaugeMetricFamily(self.name, self.help, labels=labels)

    def sample_names(self) -> tuple[str, ...]:
        """Names of the samples this family can produce in the text exposition."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


class Families:
    """Families keyed by spec, created on first use, so empty families are not exported."""

    def __init__(self) -> None:
        self._families: dict[MetricSpec, Metric] = {}

    def add(self, spec: MetricSpec, labels: Sequence[str], value: float) -> None:
        family = self._families.get(spec)
        if family is None:
            family = self._families[spec] = spec.family()
        family.add_metric(list(labels), value)

    def add_histogram(
        self,
        spec: MetricSpec,
        labels: Sequence[str],
        buckets: Sequence[tuple[str, float]],
        sum_value: float,
    ) -> None:
        family = self._families.get(spec)
        if family is None:
            family = self._families[spec] = spec.family()
        family.add_metric(list(labels), list(buckets), sum_value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())

    def __len__(self) -> int:
        return len(self._families)
