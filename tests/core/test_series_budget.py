"""The cardinality guard through a real `llmmon serve`: series per collector, the whole
exposition's count, and the budget-exceeded gauge with its warning."""

from __future__ import annotations

import time

from tests.conftest import FIXTURES
from tests.core.served import consistent_scrape

NODE = ("--collector.disable-defaults", "--collector.disk", "--collector.gpu", "--collector.rdma",
        f"--path.procfs={FIXTURES / 'proc'}", f"--path.sysfs={FIXTURES / 'sys'}",
        f"--fake-nvml={FIXTURES / 'nvml' / 'h200x8'}")


def test_over_budget_is_visible_and_names_the_collector(serve) -> None:
    server = serve(*NODE, "--sampler.series-budget=300")
    states = server.wait_collected()
    samples, count = consistent_scrape(server)
    assert count > 300
    assert samples[("llmmon_exporter_series_budget", ())] == 300
    assert samples[("llmmon_exporter_series_budget_exceeded", ())] == 1
    per_collector = {dict(labels)["collector"]: value for (name, labels), value in samples.items()
                     if name == "llmmon_exporter_collector_series"}
    assert set(per_collector) == {"disk", "gpu", "rdma"}
    prefixes = {"disk": ("llmmon_disk_", "llmmon_pressure_"), "gpu": ("llmmon_gpu_",),
                "rdma": ("llmmon_rdma_",)}
    for collector, prefix in prefixes.items():
        assert per_collector[collector] == sum(
            1 for name, _ in samples if name.startswith(prefix)), collector
    # /api/v1/collectors reports the same counts (taken a moment earlier: the slow GPU
    # calls may have added their series since, never removed any).
    assert {s["name"] for s in states} == set(per_collector)
    deadline = time.monotonic() + 20
    while "series budget exceeded" not in server.log():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    assert "--sampler.series-budget=300 (largest: collector=" in server.log()


def test_within_the_default_budget(serve) -> None:
    server = serve(*NODE)
    server.wait_collected()
    samples, count = consistent_scrape(server)
    assert samples[("llmmon_exporter_series_budget", ())] == 2000
    assert count <= 2000
    assert samples[("llmmon_exporter_series_budget_exceeded", ())] == 0
    assert "series budget exceeded" not in server.log()
