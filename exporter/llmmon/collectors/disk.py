"""Block-device IO from /proc/diskstats and IO pressure from /proc/pressure/io.

These feed the data-loader starvation branch: read IOPS, read bytes/s, read latency
(Δread_seconds / Δreads), utilisation, queue depth and host-wide IO stall time.  Sectors are
always 512 bytes in diskstats, whatever the device's block size, and times are milliseconds.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

from prometheus_client.core import Metric

from llmmon.collector import Collector, Context
from llmmon.counters import check_count
from llmmon.metrics import Families, MetricSpec
from llmmon.options import Option
from llmmon.sources.fs import SourceError

SECTOR = 512


def _count(value: int) -> float:
    return value


def _sectors(value: int) -> float:
    return value * SECTOR


def _milliseconds(value: int) -> float:
    return value / 1000  # division, not * 0.001, so 21650 ms is exactly 21.65 s

DEFAULT_EXCLUDE = r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$"


def _spec(name: str, kind: str, help_text: str) -> MetricSpec:
    return MetricSpec(name, kind, help_text, ("device",))


# (spec, diskstats value index after "major minor name", unit conversion)
FIELDS: tuple[tuple[MetricSpec, int, Callable[[int], float]], ...] = (
    (_spec("llmmon_disk_reads_total", "counter", "Reads completed."), 0, _count),
    (_spec("llmmon_disk_reads_merged_total", "counter", "Adjacent reads merged."), 1, _count),
    (_spec("llmmon_disk_read_bytes_total", "counter", "Bytes read (sectors x 512)."), 2, _sectors),
    (_spec("llmmon_disk_read_seconds_total", "counter",
           "Time spent on reads; divide its rate by the reads rate for read latency."), 3, _milliseconds),
    (_spec("llmmon_disk_writes_total", "counter", "Writes completed."), 4, _count),
    (_spec("llmmon_disk_writes_merged_total", "counter", "Adjacent writes merged."), 5, _count),
    (_spec("llmmon_disk_written_bytes_total", "counter",
           "Bytes written (sectors x 512)."), 6, _sectors),
    (_spec("llmmon_disk_write_seconds_total", "counter", "Time spent on writes."), 7, _milliseconds),
    (_spec("llmmon_disk_io_in_progress", "gauge",
           "IOs issued to the device and not yet completed (queue depth now)."), 8, _count),
    (_spec("llmmon_disk_io_seconds_total", "counter",
           "Time the device had IO in flight; its rate is utilisation."), 9, _milliseconds),
    (_spec("llmmon_disk_io_weighted_seconds_total", "counter",
           "IO time weighted by IOs in flight; its rate is the average queue depth."), 10, _milliseconds),
    (_spec("llmmon_disk_discards_total", "counter", "Discards completed (kernel 4.18+)."), 11, _count),
    (_spec("llmmon_disk_discards_merged_total", "counter",
           "Adjacent discards merged (kernel 4.18+)."), 12, _count),
    (_spec("llmmon_disk_discarded_bytes_total", "counter",
           "Bytes discarded (sectors x 512; kernel 4.18+)."), 13, _sectors),
    (_spec("llmmon_disk_discard_seconds_total", "counter",
           "Time spent on discards (kernel 4.18+)."), 14, _milliseconds),
    (_spec("llmmon_disk_flushes_total", "counter", "Flush requests completed (kernel 5.5+)."),
     15, _count),
    (_spec("llmmon_disk_flush_seconds_total", "counter",
           "Time spent on flush requests (kernel 5.5+)."), 16, _milliseconds),
)
# Fields exported only with --collector.disk.extended: none of the rules, dashboards or
# diagnose branches reads them, and with 16 disks they are 144 of a node's series.
EXTENDED = {"llmmon_disk_reads_merged_total", "llmmon_disk_writes_merged_total",
            "llmmon_disk_io_weighted_seconds_total", "llmmon_disk_discards_total",
            "llmmon_disk_discards_merged_total", "llmmon_disk_discarded_bytes_total",
            "llmmon_disk_discard_seconds_total", "llmmon_disk_flushes_total",
            "llmmon_disk_flush_seconds_total"}
# Partition lines of 2.6-era kernels carry only: reads, sectors read, writes, sectors written.
OLD_PARTITION_FIELDS = ((0, 0), (2, 1), (4, 2), (6, 3))

PRESSURE = MetricSpec(
    "llmmon_pressure_io_stalled_seconds_total", "counter",
    "Time some (kind=some) or all (kind=full) non-idle tasks were stalled on IO, host-wide.",
    ("kind",))
_PRESSURE_LINE = re.compile(r"^(some|full)\s.*\btotal=(\d+)\s*$")


class DiskCollector(Collector):
    name = "disk"
    description = "Block-device IO (/proc/diskstats) and IO pressure (/proc/pressure/io)."
    specs = tuple(spec for spec, _, _ in FIELDS) + (PRESSURE,)
    options = (
        Option("device_exclude", "regex", DEFAULT_EXCLUDE,
               "Devices to skip: partitions, loop, ram and floppy devices by default."),
        Option("extended", "bool", False,
               "Also export merged reads/writes, discards, flushes and weighted IO time "
               "(9 series per disk that no shipped rule or dashboard reads)."),
    )
    roots = ("procfs",)
    interval = 5.0
    timeout = 3.0

    def __init__(self, env, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__(env, config)
        self._exclude = re.compile(config["device_exclude"])
        self._fields = tuple(f for f in FIELDS
                             if config["extended"] or f[0].name not in EXTENDED)

    def collect(self, ctx: Context) -> Iterable[Metric]:
        families = Families()
        devices = self._diskstats(ctx, families)
        self._pressure(ctx, families)
        ctx.watching(devices, "block devices in /proc/diskstats")
        return families

    def _diskstats(self, ctx: Context, families: Families) -> int:
        try:
            text = self.env.procfs.read_text("diskstats")
        except SourceError as exc:
            ctx.error("diskstats", str(exc))
            return 0
        seen: set[str] = set()
        for number, line in enumerate(text.splitlines(), 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) < 3:
                ctx.error(f"diskstats:{number}", f"line {number}: truncated: {line[:80]!r}")
                continue
            device = parts[2]
            if self._exclude.search(device):
                continue
            try:
                values = [int(v) for v in parts[3:]]
            except ValueError:
                ctx.error(f"diskstats:{device}", f"{device}: non-numeric value in {line[:120]!r}")
                continue
            try:  # every diskstats field is an unsigned kernel counter or gauge
                for value in values:
                    check_count(value)
            except ValueError as exc:
                ctx.error(f"diskstats:{device}", f"{device}: a value {exc} in {line[:120]!r}")
                continue
            if device in seen:
                ctx.error(f"diskstats:{device}", f"{device}: listed twice; kept the first")
                continue
            if len(values) == 4:
                mapping = [(FIELDS[i], values[j]) for i, j in OLD_PARTITION_FIELDS]
            elif len(values) >= 11:
                mapping = [(field, values[field[1]]) for field in self._fields
                           if field[1] < len(values)]
            else:
                ctx.error(f"diskstats:{device}",
                          f"{device}: {len(values)} values, expected 4, 11, 15, 17 or more")
                continue
            seen.add(device)
            for (spec, _, convert), value in mapping:
                families.add(spec, [device], convert(value))
        return len(seen)

    def _pressure(self, ctx: Context, families: Families) -> None:
        if not self.env.procfs.exists("pressure", "io"):
            return  # kernel built without PSI (or psi=0): nothing to export, not an error
        try:
            text = self.env.procfs.read_text("pressure", "io")
        except SourceError as exc:
            ctx.error("pressure", str(exc))
            return
        for line in text.splitlines():
            match = _PRESSURE_LINE.match(line.strip())
            if match:
                families.add(PRESSURE, [match.group(1)], int(match.group(2)) / 1e6)
            elif line.strip():
                ctx.error("pressure", f"pressure/io: unexpected line {line[:80]!r}")
