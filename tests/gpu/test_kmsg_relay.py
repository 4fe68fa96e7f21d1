"""`llmmon kmsg-relay` (the Kubernetes kernel-log sidecar) as a real process: it copies only
the driver's records, appends new ones, survives its own restart without losing what the ring
has overwritten, forgets a previous boot, and the exporter reads its file as it reads
/dev/kmsg: the same XID counts as from the log itself, or the relay's error."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import FIXTURES, ROOT
from tests.core.helpers import run
from tests.gpu.conftest import edit
from tests.gpu.test_xid_history import _series
from tests.helpers import wait_for

KMSG = FIXTURES / "gpu" / "kmsg" / "xid_before_start"
NEW_79 = ("4,70001,500000000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', "
          "name=<unknown>, GPU has fallen off the bus.\n")


def relay(source: Path, out: Path, boot: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "llmmon", "kmsg-relay", "--source",
                             str(source), "--out", str(out), "--boot-id", str(boot), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def check(out: Path, boot: Path) -> int:
    return subprocess.run([sys.executable, "-m", "llmmon", "kmsg-relay", "--check", "--out",
                           str(out), "--boot-id", str(boot)], cwd=ROOT,
                          capture_output=True, timeout=60).returncode


def stop(process: subprocess.Popen[bytes]) -> str:
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=60)[0].decode()
    assert process.returncode == 0, output
    return output


def lines(out: Path) -> list[str]:
    return out.read_text().splitlines()


def xid_counts(gpu_collector, h200x8: Path, kmsg: Path) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    for n in range(8):  # no NVML events: the counts come from the kernel log alone
        edit(h200x8 / f"gpu{n}.json", lambda doc: doc.update(xid_events=[]))
    samples, ctx, _ = run(gpu_collector(h200x8, kmsg_path=str(kmsg)))
    return _series(samples, "llmmon_gpu_xid_errors_total"), ctx.errors


def test_the_relay_copies_the_driver_records_and_the_exporter_counts_them_as_from_the_log(
        gpu_collector, h200x8: Path, tmp_path: Path) -> None:
    source, out, boot = Path(shutil.copy(KMSG, tmp_path / "kmsg")), tmp_path / "nvrm", \
        tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    assert check(out, boot) == 1  # not written yet: the exporter waits for the probe
    process = relay(source, out, boot)
    try:
        wait_for(lambda: out.exists() or None, 60, "the relay's file")
        assert check(out, boot) == 0
        relayed = lines(out)
        kernel = [line for line in source.read_text().splitlines() if "NVRM:" in line]
        assert relayed == ["# llmmon kmsg-relay boot_id=boot-1", *kernel]
        assert len(kernel) < len(source.read_text().splitlines())  # the rest stays behind
        with source.open("a") as log:
            log.write(NEW_79)
        wait_for(lambda: len(lines(out)) == len(relayed) + 1 or None, 60, "the new record")
        assert lines(out)[-1] == NEW_79.rstrip("\n")
    finally:
        stop(process)
    from_relay, errors = xid_counts(gpu_collector, h200x8, out)
    from_log, _ = xid_counts(gpu_collector, h200x8, source)
    assert errors == {}
    assert from_relay == from_log and from_relay[("0", "79")] == 1


def test_a_restarted_relay_keeps_what_the_ring_overwrote_and_forgets_a_previous_boot(
        tmp_path: Path) -> None:
    source, out, boot = tmp_path / "kmsg", tmp_path / "nvrm", tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    records = KMSG.read_text().splitlines()
    nvrm = [line for line in records if "NVRM:" in line]
    source.write_text("\n".join(records) + "\n")
    stop(wait_until(relay(source, out, boot), out, ["# llmmon kmsg-relay boot_id=boot-1",
                                                    *nvrm]))
    # The ring overwrote its older half; the relay restarts (a new sidecar container).
    source.write_text("\n".join(records[len(records) // 2:]) + "\n" + NEW_79)
    stop(wait_until(relay(source, out, boot), out, ["# llmmon kmsg-relay boot_id=boot-1",
                                                    *nvrm, NEW_79.rstrip("\n")]))
    boot.write_text("boot-2\n")  # a reboot: the old boot's records are not this boot's
    source.write_text(NEW_79)
    assert check(out, boot) == 1
    stop(wait_until(relay(source, out, boot), out, ["# llmmon kmsg-relay boot_id=boot-2",
                                                    NEW_79.rstrip("\n")]))


def test_a_relay_that_cannot_read_the_log_says_so_to_the_exporter(gpu_collector, h200x8: Path,
                                                                  tmp_path: Path) -> None:
    out, boot = tmp_path / "nvrm", tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    process = relay(tmp_path / "no-kmsg", out, boot)
    output = process.communicate(timeout=60)[0].decode()
    assert process.returncode == 1 and "no-kmsg: No such file or directory" in output
    assert check(out, boot) == 0  # the exporter starts, and reports the relay's error
    samples, ctx, _ = run(gpu_collector(h200x8, kmsg_path=str(out)))
    assert "relayed: " in ctx.errors["kmsg"] and "no-kmsg" in ctx.errors["kmsg"], ctx.errors
    assert _series(samples, "llmmon_gpu_xid_kernel_log_read") == {(): 0}
    assert _series(samples, "llmmon_gpu_power_watts")  # the rest of the GPU series stand


def wait_until(process: subprocess.Popen[bytes], out: Path, expected: list[str]
               ) -> subprocess.Popen[bytes]:
    """The relay's file holds exactly `expected` (a relay that lost or kept the wrong records
    never gets there)."""
    def holds() -> bool | None:
        return (out.exists() and lines(out) == expected) or None
    try:
        wait_for(holds, 60, f"the relay's file to hold {len(expected)} lines")
    except BaseException:
        process.kill()
        raise
    return process
