"""Every metric the exporter can emit, for docs, rule linting and tests."""

from __future__ import annotations

from llmmon import sampler
from llmmon.collectors import discover
from llmmon.metrics import MetricSpec


def all_specs() -> list[MetricSpec]:
    specs = list(sampler.SPECS)
    for cls in discover():
        specs.extend(cls.specs)
    return specs


def exported_names() -> set[str]:
    """Sample names as they appear in the exposition (histograms expand to three)."""
    return {name for spec in all_specs() for name in spec.sample_names()}
