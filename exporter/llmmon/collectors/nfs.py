"""NFS client statistics per mount and operation from mountstats: the data-loader branch of
the triage tree when datasets or checkpoints live on NFS (READ latency = Δexecute / Δops).

Off by default: a node with many mounts and NFSv4's ~60 operations makes many series, so only
the operations in `operations` are exported.  Retransmissions are
`rate(transmissions) - rate(operations)`: their difference is not itself a counter, because
operations in flight are transmitted but not yet counted.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from prometheus_client.core import Metric

from llmmon.collector import Collector, Context, Environment
from llmmon.metrics import Families, MetricSpec
from llmmon.options import Option
from llmmon.sources import mountstats
from llmmon.sources.fs import SourceError

MOUNT = ("mountpoint", "export")
OPERATION = MOUNT + ("operation",)
MS = 1000

INFO = MetricSpec("llmmon_nfs_mount_info", "info", "An NFS mount: protocol version and "
                  "transport from its options.", MOUNT + ("fstype", "version", "protocol"))
READ_BYTES = MetricSpec(
    "llmmon_nfs_read_bytes_total", "counter",
    "Bytes read: kind=normal (through the page cache), direct (O_DIRECT), server (over the "
    "wire).", MOUNT + ("kind",))
WRITTEN_BYTES = MetricSpec(
    "llmmon_nfs_written_bytes_total", "counter",
    "Bytes written: kind=normal, direct, server (over the wire).", MOUNT + ("kind",))
# mountstats `bytes:` line: normal read, normal write, direct read, direct write, server read,
# server write, ...
BYTES = ((READ_BYTES, "normal", 0), (WRITTEN_BYTES, "normal", 1), (READ_BYTES, "direct", 2),
         (WRITTEN_BYTES, "direct", 3), (READ_BYTES, "server", 4), (WRITTEN_BYTES, "server", 5))
OP_SPECS: tuple[tuple[MetricSpec, float], ...] = tuple(
    (MetricSpec(name, "counter", help_text, OPERATION), divisor) for name, help_text, divisor in (
        ("llmmon_nfs_operations_total", "Operations completed.", 1),
        ("llmmon_nfs_operation_transmissions_total",
         "RPC transmissions, retransmissions included.", 1),
        ("llmmon_nfs_operation_major_timeouts_total",
         "Major timeouts: the server did not answer within timeo x retrans.", 1),
        ("llmmon_nfs_operation_sent_bytes_total", "Bytes sent, RPC headers included.", 1),
        ("llmmon_nfs_operation_received_bytes_total",
         "Bytes received, RPC headers included.", 1),
        ("llmmon_nfs_operation_queue_seconds_total",
         "Time requests waited in the client queue before transmission.", MS),
        ("llmmon_nfs_operation_rtt_seconds_total",
         "Time from transmission to the server's reply.", MS),
        ("llmmon_nfs_operation_execute_seconds_total",
         "Time from queueing to completion; its rate over the ops rate is the latency an "
         "application sees.", MS),
        ("llmmon_nfs_operation_errors_total", "Operations that completed with an error "
         "(kernel 5.6+).", 1),
    ))
DEFAULT_OPERATIONS = (r"^(READ|WRITE|COMMIT|GETATTR|LOOKUP|ACCESS|OPEN|CLOSE|READDIR|"
                      r"READDIRPLUS)$")


class NfsCollector(Collector):
    name = "nfs"
    description = ("NFS client statistics per mount and operation from mountstats (opt-in: "
                   "many series).")
    specs = (INFO, READ_BYTES, WRITTEN_BYTES) + tuple(spec for spec, _ in OP_SPECS)
    options = (
        Option("mountstats", "str", "1/mountstats",
               "mountstats file under --path.procfs: 1/mountstats shows the host's mounts "
               "with hostPID; self/mountstats only the exporter's own mount namespace.",
               metavar="PATH"),
        Option("operations", "regex", DEFAULT_OPERATIONS,
               "NFS operations exported per mount (NFSv4 has about 60)."),
        Option("mountpoint_exclude", "regex", "", "Mount points to skip."),
    )
    enabled_by_default = False
    roots = ("procfs",)
    interval = 15.0
    timeout = 5.0

    def __init__(self, env: Environment, config: dict[str, Any]) -> None:
        super().__init__(env, config)
        self._operations = re.compile(config["operations"])
        self._exclude = (re.compile(config["mountpoint_exclude"])
                         if config["mountpoint_exclude"] else None)

    def collect(self, ctx: Context) -> Iterable[Metric]:
        families = Families()
        try:
            text = self.env.procfs.read_text(self.config["mountstats"], max_bytes=16 << 20)
        except SourceError as exc:
            ctx.error("mountstats", str(exc))
            return families
        parsed = mountstats.parse(text, self.env.procfs.path(self.config["mountstats"]))
        for problem in parsed.problems:
            ctx.error("mountstats:parse", problem)
        # A mount point mounted over keeps its entry; the last one listed is the visible one.
        mounts = {(m.mountpoint, m.export): m for m in parsed.mounts
                  if not (self._exclude and self._exclude.search(m.mountpoint))}
        for (mountpoint, export), mount in sorted(mounts.items()):
            labels = (mountpoint, export)
            families.add(INFO, labels + (mount.fstype, mount.options.get("vers", ""),
                                         mount.options.get("proto", "")), 1)
            for spec, kind, index in BYTES:
                if index < len(mount.bytes):
                    families.add(spec, labels + (kind,), mount.bytes[index])
            for operation, values in mount.operations.items():
                if self._operations.search(operation):
                    self._operation(ctx, families, labels + (operation,), values)
        ctx.watching(len(mounts), "NFS mounts")
        return families

    def _operation(self, ctx: Context, families: Families, labels: tuple[str, ...],
                   values: list[int]) -> None:
        for (spec, divisor), value in zip(OP_SPECS, values):
            if value >= mountstats.U63:
                ctx.error(f"{labels[0]}:{labels[2]}",
                          f"{labels[0]} {labels[2]}: {spec.name} is a wrapped negative "
                          f"({value}); skipped")
                continue
            families.add(spec, labels, value / divisor)
