"""The sampler: cadences, timeouts on hung reads, last good snapshots, errors logged once."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from llmmon.collectors.disk import DiskCollector
from llmmon.sampler import Sampler
from tests.conftest import FIXTURES
from tests.core.helpers import make_collector
from tests.helpers import wait_for


class SecondDisk(DiskCollector):
    """The real disk collector under another name, reading another tree."""

    name = "disk2"


def state(sampler: Sampler, name: str) -> dict:
    return next(s for s in sampler.snapshot_json() if s["name"] == name)


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    good = tmp_path / "good"
    hung = tmp_path / "hung"
    for tree in (good, hung):
        shutil.copytree(FIXTURES / "proc", tree, ignore=shutil.ignore_patterns("[0-9]*", "self"))
    return good, hung


def test_hung_read_fails_one_collector_and_the_others_keep_updating(trees) -> None:
    good, hung = trees
    fifo = hung / "diskstats"
    fifo.unlink()
    os.mkfifo(fifo)  # opening it for reading blocks until a writer appears: a hung read
    blocked = make_collector(DiskCollector, hung, interval=0.2, timeout=0.3)
    healthy = make_collector(SecondDisk, good, interval=0.05, timeout=1.0)
    sampler = Sampler([blocked, healthy], "test", max_staleness=60)
    sampler.start()
    try:
        wait_for(lambda: state(sampler, "disk")["status"] == "failed", 10)
        failed = state(sampler, "disk")
        assert "timed out after 0.3s" in failed["last_error"]
        assert failed["errors_total"] == 1
        body = sampler.body(openmetrics=False, compressed=False).decode()
        assert 'llmmon_exporter_collector_success{collector="disk"} 0.0' in body
        assert 'llmmon_exporter_collector_success{collector="disk2"} 1.0' in body
        before = state(sampler, "disk2")["last_success"]
        wait_for(lambda: state(sampler, "disk2")["last_success"] > before, 10)
        assert 'llmmon_disk_reads_total{device="sda"}' in \
            sampler.body(openmetrics=False, compressed=False).decode()
        # No second run piles up behind the blocked one: still exactly one failure.
        time.sleep(0.5)
        assert state(sampler, "disk")["errors_total"] == 1
    finally:
        sampler.stop()
        # Unblock the worker thread so it does not linger: a writer lets open() return.
        writer = threading.Thread(target=lambda: open(fifo, "w").close(), daemon=True)
        writer.start()
        writer.join(2)


def test_failure_keeps_last_good_snapshot_until_stale(trees) -> None:
    good, _ = trees
    collector = make_collector(DiskCollector, good, interval=0.05, timeout=1.0)
    sampler = Sampler([collector], "test", max_staleness=0.5)
    sampler.start()
    try:
        wait_for(lambda: state(sampler, "disk")["status"] == "ok", 10)
        original = collector.collect

        def broken(ctx):
            raise RuntimeError("driver went away")

        collector.collect = broken  # type: ignore[method-assign]
        # its own error, not a run that read the tree meanwhile: under load a run can start
        # between two statements
        wait_for(lambda: state(sampler, "disk")["last_error"] == "RuntimeError: driver went away",
                 10)
        assert state(sampler, "disk")["status"] == "failed"
        assert b"llmmon_disk_reads_total" in sampler.body(False, False)  # last good snapshot
        wait_for(lambda: b"llmmon_disk_reads_total" not in sampler.body(False, False), 10)
        collector.collect = original  # type: ignore[method-assign]
    finally:
        sampler.stop()


def test_errors_are_counted_every_time_but_logged_once(
        trees, caplog: pytest.LogCaptureFixture) -> None:
    good, _ = trees
    (good / "diskstats").write_text("   8    0 sda 1 2 x\n   8   16 sdb 1 0 8 1 0 0 0 0 0 1 1\n")
    collector = make_collector(DiskCollector, good, interval=0.02, timeout=1.0)
    sampler = Sampler([collector], "test")
    with caplog.at_level(logging.INFO, logger="llmmon"):
        sampler.start()
        try:
            wait_for(lambda: state(sampler, "disk")["errors_total"] >= 5, 10)
            (good / "diskstats").write_text("   8   16 sdb 1 0 8 1 0 0 0 0 0 1 1\n")
            # sda's own recovery: a run that reads diskstats between the rewrite's truncate
            # and its write finds nothing to watch, fails, and logs "problem=collector:
            # recovered" next run (seen once, in CI under a hog)
            wait_for(lambda: any("problem=diskstats:sda: recovered" in r.getMessage()
                                 for r in caplog.records), 10)
        finally:
            sampler.stop()
    problems = [r for r in caplog.records if "problem=diskstats:sda" in r.getMessage()]
    assert len(problems) == 2, [r.getMessage() for r in problems]  # once, then its recovery
    assert "non-numeric" in problems[0].getMessage()


class BusyDisk(DiskCollector):
    """The real disk collector, after spending 0.2 s of CPU."""

    name = "busy"

    def collect(self, ctx):  # type: ignore[no-untyped-def]
        started = time.thread_time()
        while time.thread_time() - started < 0.2:
            pass
        return super().collect(ctx)


class SleepyDisk(DiskCollector):
    """The real disk collector, after 0.2 s asleep (a slow read costs time, not CPU)."""

    name = "sleepy"

    def collect(self, ctx):  # type: ignore[no-untyped-def]
        time.sleep(0.2)
        return super().collect(ctx)


def test_cpu_of_each_collectors_runs_is_counted(trees) -> None:
    """/api/v1/collectors' `cpu_seconds` is CPU time, not wall time, of every run, threaded or
    run once: which collector costs the node its CPU."""
    good, _ = trees
    busy, sleepy = (make_collector(cls, good, interval=3600.0, timeout=10.0)
                    for cls in (BusyDisk, SleepyDisk))
    sampler = Sampler([busy, sleepy], "test")
    sampler.start()
    try:
        wait_for(lambda: all(state(sampler, n)["status"] == "ok" for n in ("busy", "sleepy")), 10)
    finally:
        sampler.stop()
    assert state(sampler, "busy")["cpu_seconds"] >= 0.2
    sampler.run_once(busy)
    assert state(sampler, "busy")["cpu_seconds"] >= 0.4
    assert state(sampler, "sleepy")["last_duration_seconds"] >= 0.2
    assert state(sampler, "sleepy")["cpu_seconds"] < 0.1


def test_a_failing_digest_costs_its_reader_the_run_not_the_scrapes(trees) -> None:
    good, _ = trees
    collector = make_collector(DiskCollector, good)

    def digest(families, previous):  # type: ignore[no-untyped-def]
        raise ValueError("no sense in it")

    sampler = Sampler([collector], "test", digest=digest)
    sampler.run_once(collector)
    disk = state(sampler, "disk")
    assert disk["status"] == "ok" and disk["errors_total"] == 1
    assert "digest for /api/v1/diagnose failed: ValueError: no sense in it" in disk["last_error"]
    assert b"llmmon_disk_reads_total" in sampler.body(openmetrics=False, compressed=False)
    assert sampler.digests() == []


def test_bodies_are_cached_per_generation(trees) -> None:
    good, _ = trees
    collector = make_collector(DiskCollector, good)
    sampler = Sampler([collector], "test")
    sampler.run_once(collector)
    first = sampler.body(openmetrics=True, compressed=True)
    assert sampler.body(openmetrics=True, compressed=True) is first
    sampler.run_once(collector)
    assert sampler.body(openmetrics=True, compressed=True) is not first
    assert sampler.body(openmetrics=True, compressed=False).endswith(b"# EOF\n")


def test_only_the_formats_asked_for_are_rendered_and_one_asked_again_is_filled_in(
        trees, monkeypatch: pytest.MonkeyPatch) -> None:
    """set_formats: a run renders only the formats scraped, its own series included; a format
    dropped is None in the exposition, and one asked for again is rendered from the last good
    run (byte for byte what prometheus_client writes for it), without another run."""
    from prometheus_client.exposition import generate_latest

    from llmmon import sampler as sampler_module
    from llmmon.exposition import OPENMETRICS, TEXT, _Snapshot

    good, _ = trees
    collector = make_collector(DiskCollector, good)
    sampler = Sampler([collector], "test")
    sampler.set_formats(frozenset({OPENMETRICS}))
    rendered: list[str] = []
    real = sampler_module.render_format
    monkeypatch.setattr(sampler_module, "render_format",
                        lambda families, fmt: rendered.append(fmt) or real(families, fmt))
    sampler.run_once(collector)
    assert rendered == [OPENMETRICS, OPENMETRICS]  # the run, then the sampler's own series
    assert state(sampler, "disk")["formats"] == [OPENMETRICS]
    _, text, openmetrics = sampler.exposition()
    assert text is None and openmetrics is not None and b"llmmon_disk_reads_total" in openmetrics
    families = sampler.states["disk"].families
    sampler.set_formats(frozenset({TEXT, OPENMETRICS}))
    _, text, again = sampler.exposition()
    assert again == openmetrics
    assert text is not None and text.startswith(generate_latest(_Snapshot(families)))
    assert b'llmmon_exporter_collector_success{collector="disk"} 1.0' in text
    assert state(sampler, "disk")["formats"] == [TEXT, OPENMETRICS]
    sampler.set_formats(frozenset())
    assert sampler.exposition()[1:] == (None, None)
    assert state(sampler, "disk")["formats"] == []


def test_openmetrics_fragments_are_what_the_default_escaping_writes() -> None:
    # The render skips prometheus_client's per-character name escaping.  That writes the same
    # bytes as the default for classic names (checked on a node's RDMA counters and on label
    # values with odd characters), and MetricSpec refuses any other name, so it stays the same
    # (every spec of the catalogue is built, and so checked, on import)
    from prometheus_client.openmetrics.exposition import generate_latest

    from llmmon.catalog import all_specs
    from llmmon.collector import Context
    from llmmon.collectors.rdma import RdmaCollector
    from llmmon.metrics import Families, MetricSpec
    from llmmon.exposition import OM_EOF, _Snapshot, render

    families = Families()
    odd = MetricSpec("llmmon_test_info", "info", "odd values", ("value",))
    for value in ('a "quoted"\nvalue\\', "ünïcode", "{}=,"):
        families.add(odd, (value,), 1)
    snapshot = [*make_collector(RdmaCollector, FIXTURES / "proc", FIXTURES / "sys").collect(
        Context()), *families]
    assert len(snapshot) > 5
    assert render(snapshot)[1] + OM_EOF == generate_latest(_Snapshot(snapshot))
    with pytest.raises(ValueError, match="classic name characters"):
        MetricSpec("llmmon_bad.name", "gauge", "x")
    with pytest.raises(ValueError, match="classic name characters"):
        MetricSpec("llmmon_ok", "gauge", "x", ("gpu-index",))
    assert all_specs()
