"""XIDs from before the daemon started: the kernel log read once at start, through the real
collector, with each code's action; nothing counted twice with the NVML event set."""

from __future__ import annotations

import csv
import shutil
import time
from pathlib import Path

from llmmon.gpu import xid_catalog
from llmmon.gpu.xid_catalog import ACTIONS, PAGED
from tests.conftest import FIXTURES
from tests.core.helpers import run
from tests.gpu.conftest import edit
from tests.gpu.test_xid import wait_for_counts

KMSG = FIXTURES / "gpu" / "kmsg" / "xid_before_start"
LOST_79 = ("4,70001,500000000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', "
           "name=<unknown>, GPU has fallen off the bus.\n")


def _series(samples: dict, name: str) -> dict[tuple, float]:
    return {tuple(v for k, v in labels if k not in ("uuid",)): value
            for (metric, labels), value in samples.items() if metric == name}


def test_kernel_log_xids_are_counted_with_their_time_and_action(gpu_collector, h200x8: Path,
                                                                 tmp_path: Path) -> None:
    kmsg = Path(shutil.copy(KMSG, tmp_path / "kmsg"))
    for n in range(8):  # no NVML events: what is counted comes from the kernel log alone
        edit(h200x8 / f"gpu{n}.json", lambda doc: doc.update(xid_events=[]))
    collector = gpu_collector(h200x8, kmsg_path=str(kmsg))
    boot = time.time() - time.monotonic()
    samples, ctx, _ = run(collector)
    assert ctx.errors == {}
    # GPU 5 is 0000:ab:00, GPU 1 0000:2a:00, GPU 3 0000:5d:00 (old form without "PCI:").
    assert _series(samples, "llmmon_gpu_xid_errors_total") == {
        ("1", "13"): 2, ("3", "119"): 1, ("5", "48"): 2, ("5", "63"): 1, ("5", "94"): 1}
    last = _series(samples, "llmmon_gpu_xid_last_timestamp_seconds")
    assert abs(last[("5", "48")] - (boot + 172811.400122)) < 1.0  # the later of the two
    # 0000:c3:00 is no GPU NVML answers for (fallen off the bus): kept, by PCI address.
    assert _series(samples, "llmmon_gpu_xid_unattributed_errors") == {("0000:c3:00", "79"): 1}
    assert _series(samples, "llmmon_gpu_xid_kernel_log_read") == {(): 1}
    assert _series(samples, "llmmon_gpu_xid_action_info") == {
        ("reset_gpu", "119"): 1, ("check_application", "13"): 1, ("reset_gpu", "48"): 1,
        ("none", "63"): 1, ("reboot_node", "79"): 1, ("check_application", "94"): 1}


def test_an_xid_after_the_start_is_counted_once(gpu_collector, h200x8: Path,
                                                tmp_path: Path) -> None:
    """The kernel logs every XID NVML delivers; the log is read only before registration."""
    kmsg = Path(shutil.copy(KMSG, tmp_path / "kmsg"))
    collector = gpu_collector(h200x8, kmsg_path=str(kmsg))
    collector.start()
    run(collector)
    # NVML delivers GPU 5's replayed events (48, 48, 94) on top of the log's 48, 48, 63, 94.
    before = {(5, 48): 4, (5, 63): 1, (5, 94): 2, (1, 13): 2, (3, 119): 1}
    wait_for_counts(collector, before)
    with kmsg.open("a") as log:  # the driver logs the new XID as NVML delivers it
        log.write(LOST_79)
    edit(h200x8 / "gpu0.json", lambda doc: doc.update(xid_events=[{"xid": 79}]))
    wait_for_counts(collector, {**before, (0, 79): 1})
    samples, _, _ = run(collector)
    assert _series(samples, "llmmon_gpu_xid_errors_total")[("0", "79")] == 1


def test_the_real_kernel_log_device_is_read(gpu_collector, h200x8: Path) -> None:
    """/dev/kmsg itself: one record per read until EAGAIN, without blocking."""
    collector = gpu_collector(h200x8, kmsg_path="/dev/kmsg")
    samples, ctx, _ = run(collector)
    assert "kmsg" not in ctx.errors
    assert _series(samples, "llmmon_gpu_xid_kernel_log_read") == {(): 1}


def test_an_unreadable_kernel_log_is_an_error_and_loses_nothing(gpu_collector, h200x8: Path,
                                                                tmp_path: Path) -> None:
    collector = gpu_collector(h200x8, kmsg_path=str(tmp_path / "missing"))
    samples, ctx, _ = run(collector)
    assert "kmsg" in ctx.errors and "missing" in ctx.errors["kmsg"]
    assert _series(samples, "llmmon_gpu_xid_kernel_log_read") == {(): 0}
    assert len(_series(samples, "llmmon_gpu_up")) == 8


BUCKETS = {"RESTART_APP": "check_application", "RESET_GPU": "reset_gpu",
           "RESTART_BM": "reboot_node", "CONTACT_SUPPORT": "rma", "IGNORE": "none",
           "WORKFLOW_XID_48": "reset_gpu", "WORKFLOW_NVLINK_ERR": "reset_gpu",
           "WORKFLOW_NVLINK5_ERR": "reset_gpu", "WORKFLOW_XID_45": "none", "XID_154": "none"}


def test_every_action_is_the_catalogues_and_every_h100_code_needing_a_human_is_mapped() -> None:
    """Against NVIDIA's catalogue rows (tests/fixtures/gpu/xid_catalog.csv): each code's action
    is its immediate-action bucket's; each H100 code with a bucket we have an action for is in
    the table; buckets with no action here are left unknown."""
    lines = (FIXTURES / "gpu" / "xid_catalog.csv").read_text().splitlines()
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    catalogue = {int(row["code"]): row for row in rows}
    for code, action in ACTIONS.items():
        assert BUCKETS[catalogue[code]["immediate"]] == action, (code, catalogue[code])
    for code, row in catalogue.items():
        if row["h100"] == "YES" and row["immediate"] in BUCKETS:
            assert code in ACTIONS, row
        if row["immediate"] not in BUCKETS:
            assert xid_catalog.action(code) == "unknown", row
    assert set(PAGED) == {"reset_gpu", "reboot_node", "rma"}
