"""The nfs collector over a host mountstats file with an NFSv4.1 dataset mount (per-op errors
column) and an NFSv3 checkpoint mount (older 8-column ops, a space in its path)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmmon.collector import Context
from llmmon.collectors.nfs import NfsCollector
from llmmon.config import collector_options
from llmmon.exposition import render
from tests.conftest import FIXTURES, compare_golden
from tests.core.helpers import make_collector, run

DATASETS = (("export", "10.20.0.5:/export/datasets"), ("mountpoint", "/mnt/datasets"))


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    tree = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc" / "1", tree / "1")
    return tree


def collector(procfs: Path = FIXTURES / "proc", **options: object) -> NfsCollector:
    return make_collector(NfsCollector, procfs, FIXTURES / "sys", **options)


def op(name: str, operation: str, labels: tuple = DATASETS) -> tuple[str, tuple]:
    return (name, tuple(sorted(labels + (("operation", operation),))))


def test_opt_in() -> None:
    enabled = {o.key: o.default for o in collector_options(NfsCollector)}["enabled"]
    assert enabled is False


def test_golden_exposition() -> None:
    compare_golden("nfs.prom", render(collector().collect(Context()))[0].decode())


def test_per_operation_statistics() -> None:
    samples, ctx, _ = run(collector())
    assert ctx.error_count == 0
    assert ctx.watched == 2  # rootfs, proc, sysfs and xfs mounts are not NFS
    assert samples[op("llmmon_nfs_operations_total", "READ")] == 2845912
    assert samples[op("llmmon_nfs_operation_transmissions_total", "READ")] == 2845935
    assert samples[op("llmmon_nfs_operation_major_timeouts_total", "READ")] == 7
    assert samples[op("llmmon_nfs_operation_received_bytes_total", "READ")] == 2984210044928
    assert samples[op("llmmon_nfs_operation_execute_seconds_total", "READ")] == 30112.347
    assert samples[op("llmmon_nfs_operation_errors_total", "LOOKUP")] == 1187
    ckpt = (("export", "10.20.0.6:/export/checkpoints"), ("mountpoint", "/mnt/ckpt store"))
    assert samples[op("llmmon_nfs_operation_rtt_seconds_total", "WRITE", ckpt)] == 48821.321
    assert op("llmmon_nfs_operation_errors_total", "WRITE", ckpt) not in samples  # 8 columns
    server_read = ("llmmon_nfs_read_bytes_total", (DATASETS[0], ("kind", "server"), DATASETS[1]))
    assert samples[server_read] == 2984210044928
    assert samples[("llmmon_nfs_mount_info", (("export", "10.20.0.5:/export/datasets"),
                                              ("fstype", "nfs4"), ("mountpoint", "/mnt/datasets"),
                                              ("protocol", "tcp"), ("version", "4.1")))] == 1
    # Only the configured operations: SEQUENCE and NULL are left out by default.
    operations = {dict(l)["operation"] for n, l in samples if n == "llmmon_nfs_operations_total"}
    assert operations == {"READ", "WRITE", "COMMIT", "OPEN", "CLOSE", "GETATTR", "LOOKUP",
                          "ACCESS", "READDIR"}


def test_options() -> None:
    samples, _, _ = run(collector(operations="^SEQUENCE$", mountpoint_exclude="ckpt"))
    assert {(dict(l)["mountpoint"], dict(l)["operation"]) for n, l in samples
            if n == "llmmon_nfs_operations_total"} == {("/mnt/datasets", "SEQUENCE")}


def test_bad_lines_and_wrapped_times(proc: Path) -> None:
    text = (proc / "1" / "mountstats").read_text()
    text = text.replace("ACCESS: 8123 8123 0 1364664 1462140 0 ",  # queue time wrapped
                        "ACCESS: 8123 8123 0 1364664 1462140 18446743919241604546 ")
    text = text.replace("GETATTR: 91234", "GETATTR: x1234")
    text = text.replace("OPEN: 4021 4021 0 1230112 1512021 2 4123 4201 12", "OPEN: 4021 4021")
    (proc / "1" / "mountstats").write_text(text)
    samples, ctx, _ = run(collector(proc))
    assert ctx.error_count == 3
    assert "wrapped negative" in ctx.errors["/mnt/datasets:ACCESS"]
    assert op("llmmon_nfs_operation_queue_seconds_total", "ACCESS") not in samples
    assert samples[op("llmmon_nfs_operation_rtt_seconds_total", "ACCESS")] == 2.93
    assert op("llmmon_nfs_operations_total", "GETATTR") not in samples
    assert op("llmmon_nfs_operations_total", "OPEN") not in samples
    assert samples[op("llmmon_nfs_operations_total", "READ")] == 2845912


def test_duplicate_mounts_keep_the_visible_one(proc: Path) -> None:
    text = (proc / "1" / "mountstats").read_text()
    second = text[text.index("device 10.20.0.5"):text.index("device 10.20.0.6")]
    (proc / "1" / "mountstats").write_text(text + second.replace("READ: 2845912", "READ: 5"))
    samples, ctx, _ = run(collector(proc))
    assert ctx.error_count == 0
    assert samples[op("llmmon_nfs_operations_total", "READ")] == 5


def test_missing_mountstats(tmp_path: Path) -> None:
    samples, ctx, _ = run(collector(tmp_path))
    assert samples == {}
    assert list(ctx.errors) == ["mountstats"]
