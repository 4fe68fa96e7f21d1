"""Simulated nodes read back through the real daemon: `llmmon serve`'s own settings, collectors
and sampler, built in-process over the trees the simulator wrote (no HTTP, no threads)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.config import build_settings
from llmmon.serve.assembly import build
from llmmon.simulate.node import NodeSim

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Exposition:
    samples: Samples
    collectors: dict[str, dict]  # /api/v1/collectors entries by name
    ranks: dict  # /api/v1/ranks

    def value(self, name: str, **labels: str) -> float:
        """The one sample of `name` whose labels include `labels`."""
        found = [v for (n, ls), v in self.samples.items()
                 if n == name and labels.items() <= dict(ls).items()]
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
        return found[0]

    def values(self, name: str) -> list[float]:
        return [v for (n, _), v in self.samples.items() if n == name]


def expose(node: NodeSim, *flags: str, rounds: int = 1) -> Exposition:
    """Run every collector of `llmmon serve` `rounds` times over the node's trees (the
    collectors that work from the ranks collector's verdicts, incidents and nccl, see them
    from the second round on)."""
    args = build_parser().parse_args(["serve", *node.paths.serve_args(), "--collector.topology",
                                      *flags])
    daemon = build(build_settings(args, discover()))
    try:
        for _ in range(rounds):
            for collector in daemon.collectors:
                daemon.sampler.run_once(collector)
        text = daemon.sampler.body(openmetrics=False, compressed=False).decode()
        ranks = next(c for c in daemon.collectors if c.name == "ranks").api()["ranks"]()
        states = {s["name"]: s for s in daemon.sampler.snapshot_json()}
    finally:
        for collector in daemon.collectors:
            collector.close()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return Exposition(samples, states, ranks)


@pytest.fixture
def work() -> Iterator[Path]:
    """A scratch directory on tmpfs where there is one, as the simulator uses by default."""
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="llmmon-simtest-", dir=shm))
    yield path
    shutil.rmtree(path, ignore_errors=True)
