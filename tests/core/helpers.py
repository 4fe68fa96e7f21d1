"""Build collectors over fixture trees exactly as the daemon does."""

from __future__ import annotations

import argparse
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from llmmon.collector import Collector, Context, Environment
from llmmon.config import build_settings
from llmmon.exposition import render
from llmmon.sources.fs import RootedFS


def make_collector(cls: type[Collector], procfs: Path, sysfs: Path | None = None,
                   settings: dict[str, object] | None = None, **options: object) -> Collector:
    """The collector with its defaults, overridden by `options` (its own) and `settings`
    (global ones such as `nvml.replay`), over the given trees."""
    defaults = build_settings(argparse.Namespace(), [cls])
    config = dict(defaults.collectors[cls.name])
    config.update(options)
    env = Environment(RootedFS(str(sysfs or procfs)), RootedFS(str(procfs)),
                      {**defaults.values, **(settings or {})})
    return cls(env, config)


def run(collector: Collector) -> tuple[dict[tuple[str, tuple], float], Context, str]:
    """Collect once: samples keyed by (name, sorted labels), the context, and the text."""
    ctx = Context()
    text = render(collector.collect(ctx))[0].decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, ctx, text
