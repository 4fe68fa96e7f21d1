"""The disk collector over real diskstats/pressure files, including every kernel format."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from llmmon.collectors.disk import EXTENDED, DiskCollector
from tests.conftest import FIXTURES
from tests.core.helpers import make_collector, run


def dev(name: str, device: str) -> tuple[str, tuple]:
    return (name, (("device", device),))


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    tree = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", tree, symlinks=True,
                    ignore=shutil.ignore_patterns("[0-9]*", "self"))
    return tree


def test_units_and_kernel_formats(proc: Path) -> None:
    samples, ctx, _ = run(make_collector(DiskCollector, proc, extended=True))
    assert ctx.error_count == 0
    # 11-value line (pre-4.18): sectors x 512, milliseconds -> seconds.
    assert samples[dev("llmmon_disk_reads_total", "sda")] == 25354637
    assert samples[dev("llmmon_disk_read_bytes_total", "sda")] == 1003346126 * 512
    assert samples[dev("llmmon_disk_read_seconds_total", "sda")] == pytest.approx(18492.372)
    assert samples[dev("llmmon_disk_io_weighted_seconds_total", "sda")] == pytest.approx(82621.804)
    assert dev("llmmon_disk_discards_total", "sda") not in samples
    # 15 values (4.18+): discards; 17 values (5.5+): flushes; 20 values: extra fields ignored.
    assert samples[dev("llmmon_disk_discards_total", "md127")] == 0
    assert dev("llmmon_disk_flushes_total", "md127") not in samples
    assert samples[dev("llmmon_disk_discarded_bytes_total", "sdc")] == 56 * 512
    assert samples[dev("llmmon_disk_flushes_total", "sdc")] == 11
    assert samples[dev("llmmon_disk_flush_seconds_total", "sdc")] == pytest.approx(0.009)
    assert samples[dev("llmmon_disk_io_in_progress", "nvme0n1")] == 3
    assert samples[dev("llmmon_disk_reads_total", "dm-0")] == 6574
    assert samples[dev("llmmon_disk_flushes_total", "dm-0")] == 0
    # IO pressure: microseconds -> seconds.
    assert samples[("llmmon_pressure_io_stalled_seconds_total", (("kind", "full"),))] == \
        pytest.approx(159.229614)


def test_extended_fields_are_off_by_default(proc: Path) -> None:
    """Merged, discard, flush and weighted-IO series only with --collector.disk.extended."""
    samples, _, _ = run(make_collector(DiskCollector, proc))
    names = {name for name, _ in samples}
    assert not names & EXTENDED
    assert {"llmmon_disk_reads_total", "llmmon_disk_read_seconds_total",
            "llmmon_disk_io_in_progress", "llmmon_disk_io_seconds_total"} <= names
    extended, _, _ = run(make_collector(DiskCollector, proc, extended=True))
    assert EXTENDED <= {name for name, _ in extended}


def test_default_exclusions(proc: Path) -> None:
    samples, ctx, _ = run(make_collector(DiskCollector, proc))
    devices = {dict(labels).get("device") for _, labels in samples} - {None}
    assert devices == {"sda", "sdb", "sdc", "nvme0n1", "dm-0", "md127"}
    assert ctx.watched == 6


def test_exclusion_regex_is_configurable(proc: Path) -> None:
    samples, _, _ = run(make_collector(DiskCollector, proc, device_exclude="^(dm-|md)"))
    devices = {dict(labels).get("device") for _, labels in samples} - {None}
    assert {"loop0", "ram0", "sda1", "nvme0n1p1"} <= devices
    assert not devices & {"dm-0", "md127"}


def test_old_partition_format(proc: Path) -> None:
    (proc / "diskstats").write_text("   3    1 hda1 35486 38030 24000 4000\n")
    samples, ctx, _ = run(make_collector(DiskCollector, proc, device_exclude="^$"))
    assert ctx.error_count == 0
    assert samples[dev("llmmon_disk_reads_total", "hda1")] == 35486
    assert samples[dev("llmmon_disk_read_bytes_total", "hda1")] == 38030 * 512
    assert samples[dev("llmmon_disk_writes_total", "hda1")] == 24000
    assert samples[dev("llmmon_disk_written_bytes_total", "hda1")] == 4000 * 512
    assert dev("llmmon_disk_read_seconds_total", "hda1") not in samples


def test_bad_lines_are_skipped_counted_and_the_rest_exported(
        proc: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = (proc / "diskstats").read_text()
    (proc / "diskstats").write_text(
        good
        + "   8   48 sdd 1 2 3\n"                                   # truncated
        + "   8   64 sde 1 2 x 4 5 6 7 8 9 10 11\n"                 # non-numeric
        + "   8    0 sda 9 9 9 9 9 9 9 9 9 9 9\n"                   # duplicate device
        + "   8\n")                                                  # cut mid-line
    (proc / "pressure" / "io").write_text("some avg10=0.18 total=12\nfull garbage\n")
    collector = make_collector(DiskCollector, proc)
    with caplog.at_level(logging.WARNING):
        samples, ctx, _ = run(collector)
    assert ctx.error_count == 5
    assert set(ctx.errors) == {"diskstats:sdd", "diskstats:sde", "diskstats:sda",
                               "diskstats:14", "pressure"}
    assert samples[dev("llmmon_disk_reads_total", "sda")] == 25354637  # first row kept
    assert samples[dev("llmmon_disk_reads_total", "sdb")] == 326552
    assert dev("llmmon_disk_reads_total", "sde") not in samples
    assert samples[("llmmon_pressure_io_stalled_seconds_total", (("kind", "some"),))] == 12e-6


def test_missing_and_unreadable_sources(proc: Path) -> None:
    (proc / "diskstats").unlink()
    shutil.rmtree(proc / "pressure")
    samples, ctx, _ = run(make_collector(DiskCollector, proc))
    assert samples == {}
    assert list(ctx.errors) == ["diskstats"]  # no PSI in the kernel is not an error
    assert ctx.watched == 0
    (proc / "diskstats").mkdir()  # unreadable even for root
    (proc / "pressure").mkdir()
    (proc / "pressure" / "io").mkdir()
    _, ctx, _ = run(make_collector(DiskCollector, proc))
    assert set(ctx.errors) == {"diskstats", "pressure"}
    assert "Is a directory" in ctx.errors["diskstats"]


def test_devices_appearing_and_disappearing(proc: Path) -> None:
    collector = make_collector(DiskCollector, proc)
    first, _, _ = run(collector)
    lines = (proc / "diskstats").read_text().splitlines()
    (proc / "diskstats").write_text(
        "\n".join(l for l in lines if " sdb " not in l)
        + "\n   8   80 sdf 1 0 8 1 0 0 0 0 0 1 1\n")
    second, ctx, _ = run(collector)
    assert ctx.error_count == 0
    assert dev("llmmon_disk_reads_total", "sdb") in first
    assert dev("llmmon_disk_reads_total", "sdb") not in second
    assert second[dev("llmmon_disk_reads_total", "sdf")] == 1
