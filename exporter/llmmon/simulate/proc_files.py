"""The procfs of a simulated node: /proc/diskstats, /proc/pressure/io and rank cgroups.

diskstats carries the 17 fields of kernel 5.5+ (sectors of 512 bytes, times in ms); its
counters follow the disk condition by Little's law (time reading = reads x latency, weighted
IO time = queue x time).  pressure/io keeps the kernel's 10/60/300 s running averages and
its total in microseconds.  Each rank's /proc/<pid>/cgroup names its Kubernetes pod, as a
cgroup v2 systemd node does, so the GPU collector attributes GPU processes to pods.
"""

from __future__ import annotations

import math

from llmmon.simulate.conditions import Counters, DiskCondition
from llmmon.simulate.hardware import Disk
from llmmon.simulate.filewriter import Tree

SECTOR = 512
FIELDS = ("reads", "reads_merged", "sectors_read", "read_ms", "writes", "writes_merged",
          "sectors_written", "write_ms", "in_progress", "io_ms", "weighted_ms", "discards",
          "discards_merged", "sectors_discarded", "discard_ms", "flushes", "flush_ms")
OS_DISK = DiskCondition(reads=2.0, read_bytes=64e3, read_latency=0.0002, writes=40.0,
                        write_bytes=1.5e6, write_latency=0.00003, busy=0.01, queue=0.01)
PRESSURE_WINDOWS = (10, 60, 300)


def _advance(counters: Counters, disk: str, cond: DiskCondition, share: float,
             seconds: float) -> None:
    key = f"disk/{disk}/"
    reads, writes = cond.reads * share, cond.writes * share
    for name, rate in (("reads", reads), ("sectors_read", cond.read_bytes * share / SECTOR),
                       ("read_ms", reads * cond.read_latency * 1000), ("writes", writes),
                       ("sectors_written", cond.write_bytes * share / SECTOR),
                       ("write_ms", writes * cond.write_latency * 1000),
                       ("io_ms", min(cond.busy, 1.0) * 1000),
                       ("weighted_ms", cond.queue * share * 1000),
                       ("flushes", writes / 20), ("flush_ms", writes / 20 * 0.05)):
        counters.advance(key + name, rate, seconds)


def diskstats(disks: tuple[Disk, ...], data: DiskCondition, counters: Counters,
              seconds: float) -> str:
    """Advance every disk and render /proc/diskstats (partitions mirror their disk's IO)."""
    members = [d for d in disks if d.data and not d.name.startswith("md")]
    lines = []
    for disk in disks:
        if disk.data:
            share = 1.0 if disk.name.startswith("md") else 1.0 / max(len(members), 1)
            _advance(counters, disk.name, data, share, seconds)
            queue = data.queue * share
        else:
            _advance(counters, disk.name, OS_DISK, 1.0, seconds)
            queue = OS_DISK.queue
        values = [counters[f"disk/{disk.name}/{name}"] for name in FIELDS]
        values[FIELDS.index("in_progress")] = round(queue)
        lines.append(f"{disk.major:4d} {disk.minor:7d} {disk.name} " + " ".join(map(str, values)))
        for number, partition in enumerate(disk.partitions, 1):
            part = [v // (2 * number) for v in values]
            lines.append(f"{disk.major:4d} {disk.minor + number:7d} {partition} "
                         + " ".join(map(str, part)))
    return "\n".join(lines) + "\n"


class Pressure:
    """/proc/pressure/io: running averages of stalled time, and the total in microseconds."""

    def __init__(self) -> None:
        self.averages = {kind: [0.0] * len(PRESSURE_WINDOWS) for kind in ("some", "full")}

    def render(self, some: float, full: float, counters: Counters, seconds: float) -> str:
        lines = []
        for kind, fraction in (("some", some), ("full", min(full, some))):
            counters.advance(f"psi/{kind}", fraction * 1e6, seconds)
            averages = self.averages[kind]
            for index, window in enumerate(PRESSURE_WINDOWS):
                decay = math.exp(-seconds / window)
                averages[index] = averages[index] * decay + fraction * 100 * (1 - decay)
            lines.append(f"{kind} avg10={averages[0]:.2f} avg60={averages[1]:.2f} "
                         f"avg300={averages[2]:.2f} total={counters[f'psi/{kind}']}")
        return "\n".join(lines) + "\n"


def cgroup(pod_uid: str, container_id: str) -> str:
    """A cgroup v2 line of a container of a burstable pod under the systemd driver."""
    return (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{pod_uid.replace('-', '_')}.slice/cri-containerd-{container_id}.scope\n")


def write_cgroup(tree: Tree, pid: int, pod_uid: str, container_id: str) -> None:
    tree.write(f"{pid}/cgroup", cgroup(pod_uid, container_id))
