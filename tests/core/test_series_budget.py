"""The cardinality guard through a real `llmmon serve`: series per collector, the whole
exposition's count, and the budget-exceeded gauge with its warning."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import FIXTURES, ROOT

NODE = ("--collector.disable-defaults", "--collector.disk", "--collector.gpu", "--collector.rdma",
        f"--path.procfs={FIXTURES / 'proc'}", f"--path.sysfs={FIXTURES / 'sys'}",
        f"--fake-nvml={FIXTURES / 'nvml' / 'h200x8'}")


def consistent_scrape(server, deadline_s: float = 60.0) -> tuple[dict, int]:
    """One scrape whose llmmon_exporter_series equals its own sample count (the self-metrics
    are re-rendered just after each collector run, so poll for a settled one)."""
    deadline = time.monotonic() + deadline_s
    while True:
        text = requests.get(server.url + "/metrics", timeout=5).text
        samples = {}
        count = 0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                count += 1
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        if samples.get(("llmmon_exporter_series", ())) == count:
            return samples, count
        assert time.monotonic() < deadline, "llmmon_exporter_series never matched the scrape"
        time.sleep(0.2)


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


# Series a real node's reporters add per rank that the simulator does not write: the training
# thread's CPU time, read and written bytes, two context-switch kinds, CPU and IO idle.
ACTIVITY_SERIES_PER_RANK = 7


@pytest.mark.slow  # a simulated node served until every collector has shown all it will
def test_the_budget_node_fits_the_default_budget_with_room_for_its_reporters(
        tmp_path: Path) -> None:
    """docs/capacity.md's budget node (8 GPUs, 8 RDMA ports, 16 disks, an 8-rank job), served
    by `llmmon simulate --disks 16` at the default flags, stays within the default series
    budget with room for its reporters' activity series: the node-health and hang work once
    took it to 2,020 unnoticed."""
    work = tmp_path / "sim"
    log = open(tmp_path / "simulate.log", "wb")
    sim = subprocess.Popen([sys.executable, "-m", "llmmon", "simulate", f"--dir={work}",
                            "--nodes=1", "--disks=16", "--port=0"], cwd=ROOT,
                           stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        targets = work / "targets.json"
        deadline = time.monotonic() + 120
        while not targets.exists():
            assert sim.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "simulate.log").read_text()
            time.sleep(0.2)
        url = "http://" + json.loads(targets.read_text())[0]["targets"][0]

        def complete(samples: dict) -> bool:
            """The slow GPU calls have run and every rank's collective durations are in."""
            names = [name for name, _ in samples]
            return names.count("llmmon_gpu_energy_joules_total") == 8 and \
                names.count("llmmon_nccl_collective_duration_seconds_count") >= 8

        def ranks_run(samples: dict) -> float:
            return next(value for (name, labels), value in samples.items()
                        if name == "llmmon_exporter_collector_last_success_timestamp_seconds"
                        and dict(labels)["collector"] == "ranks")

        # Complete, and the same count after a later ranks run: the first runs see the job's
        # groups and collectives appear (a scrape of 1,624 series passed `complete` alone).
        steady = None
        while True:
            samples = consistent_scrape(SimpleNamespace(url=url))[0]
            now = (ranks_run(samples), samples[("llmmon_exporter_series", ())])
            if complete(samples) and steady and now[0] > steady[0] and now[1] == steady[1]:
                break
            if complete(samples) and (steady is None or now[0] > steady[0]):
                steady = now
            assert time.monotonic() < deadline, "the node never showed every series"
            time.sleep(0.5)
    finally:
        sim.terminate()
        sim.wait(30)
    series = samples[("llmmon_exporter_series", ())]
    per_collector = {dict(labels)["collector"]: value for (name, labels), value in samples.items()
                     if name == "llmmon_exporter_collector_series"}
    assert samples[("llmmon_exporter_series_budget_exceeded", ())] == 0, per_collector
    assert series + ACTIVITY_SERIES_PER_RANK * 8 <= \
        samples[("llmmon_exporter_series_budget", ())] == 2000, per_collector
