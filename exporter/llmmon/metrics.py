"""Metric specifications: immutable descriptions that collectors fill per snapshot.

Collectors never keep module-level mutable metric objects; they declare `MetricSpec`s and
build fresh prometheus_client families from them on every run.  The same specs generate
docs/metrics.md, so the reference cannot drift from what is exported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from llmmon.counters import COUNTER_MAX
from llmmon.textsafe import printable

KINDS = ("gauge", "counter", "histogram", "info")
# Prometheus' classic character sets: every scraper and store reads them unquoted, and the
# exposition can skip prometheus_client's per-character escaping of names (llmmon.sampler).
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# The widest counter a kernel or a device keeps is 64-bit; anything beyond is not a count.
# Samples that are counts (never negative, at most COUNTER_MAX), by their name's suffix.
_COUNT_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count")}


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
        # "__" is reserved for label names only (Prometheus' own, like __name__)
        odd = ([] if _NAME.fullmatch(self.name) else [self.name]) + \
            [n for n in self.labels if not _LABEL.fullmatch(n) or n.startswith("__")]
        if odd:
            raise ValueError(f"{self.name}: {odd} outside Prometheus' classic name characters")
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


def _problem(value: object, is_count: bool) -> str:
    """Why `value` cannot be exported (the renderer calls float() on it), or ''."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:
        return "a number beyond any float; series skipped"
    except (TypeError, ValueError):
        return f"not a number ({type(value).__name__}); series skipped"
    if is_count and not (0 <= number <= COUNTER_MAX):  # NaN fails this too
        return "outside a counter's range (0 to 2^64); series skipped"
    return ""


def _series(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """A histogram's samples are one series: its bucket bound is not part of the identity."""
    return tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


def checked(families: Iterable[Metric], error: Callable[[str, str], None]) -> list[Metric]:
    """`families` ready to render: a series with a value no renderer can write, or a count
    out of a counter's range, is dropped and reported through `error(key, message)` (as any
    bad input is); label values UTF-8 cannot encode are escaped (`textsafe.printable`).
    What collectors read from files cannot make the renderer raise."""
    result = []
    for family in families:
        counts = _COUNT_SUFFIXES.get(family.type, ())
        bad: set[tuple[tuple[str, str], ...]] = set()
        for sample in family.samples:
            problem = _problem(sample.value, sample.name.endswith(counts) if counts else False)
            if problem:
                series = _series(sample.labels)
                if series not in bad:
                    bad.add(series)
                    name = printable(sample.name + "{" + ",".join(
                        f'{k}="{v}"' for k, v in series) + "}")
                    error(name, f"{name}: {problem}")
        samples = []
        for sample in family.samples:
            if bad and _series(sample.labels) in bad:
                continue
            labels = sample.labels
            if not all(v.isascii() for v in labels.values()):
                labels = {k: printable(v) for k, v in labels.items()}
                sample = sample._replace(labels=labels)
            samples.append(sample)
        family.samples = samples
        result.append(family)
    return result
