"""One simulated node: its file trees, its counters, and the flags that point a daemon at them."""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from llmmon.simulate import nccl_files, nic_files, proc_files, sysfs_files
from llmmon.simulate.conditions import (
    Counters,
    DiskCondition,
    GpuCondition,
    NodeCondition,
    PortCondition,
)
from llmmon.simulate.job import Job
from llmmon.simulate.hardware import NodeLayout
from llmmon.simulate.nvml_files import GpuFiles, Process
from llmmon.simulate.spool_files import SpoolWriter, pod_name
from llmmon.simulate.filewriter import Tree

DATA_LOADING = 60e6  # bytes/s a running job streams from the storage fabric per NIC
BACKGROUND = 2e3  # RDMA bytes/s of an idle port (connection management)
HEALTHY_CNP = 12.0  # per second: DCQCN doing its job on a tuned fabric
HEALTHY_DISK = DiskCondition(reads=1200.0, read_bytes=1200 * 256e3, read_latency=0.00025,
                             busy=0.3, queue=0.35)
IDLE_DISK = DiskCondition(reads=0.2, read_bytes=50e3, busy=0.001, queue=0.0)
KMSG_BOOT = "6,0,0,-;Linux version 6.8.0-llmmon-sim (simulated node)\n"


@dataclass(frozen=True)
class NodePaths:
    """Where a node's inputs live, and the `llmmon serve` flags that read them."""

    root: Path

    @property
    def sysfs(self) -> Path:
        return self.root / "sys"

    @property
    def procfs(self) -> Path:
        return self.root / "proc"

    @property
    def nvml(self) -> Path:
        return self.root / "nvml"

    @property
    def ethtool(self) -> Path:
        return self.root / "ethtool"

    @property
    def netlink(self) -> Path:
        return self.root / "netlink.json"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def kmsg(self) -> Path:
        return self.root / "kmsg"

    def serve_args(self) -> list[str]:
        return [f"--path.sysfs={self.sysfs}", f"--path.procfs={self.procfs}",
                f"--fake-nvml={self.nvml}", f"--ethtool.dumps={self.ethtool}",
                f"--netlink.dump={self.netlink}", f"--spool.dir={self.spool}",
                f"--collector.ranks.fr-dir={self.root / 'fr'}",
                f"--collector.ranks.pipe-dir={self.root / 'frpipe'}",
                f"--collector.gpu.kmsg-path={self.kmsg}",
                f"--collector.incidents.dir={self.root / 'incidents'}",
                f"--collector.incidents.kmsg-path={self.kmsg}"]


def _hex(*parts: object, length: int) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:length]


class NodeSim:
    def __init__(self, root: Path, layout: NodeLayout, entries_interval: float) -> None:
        self.paths = NodePaths(root)
        self.layout = layout
        self.counters = Counters()
        self.sysfs = Tree(self.paths.sysfs)
        self.procfs = Tree(self.paths.procfs)
        self.nvml = Tree(self.paths.nvml)
        self.ethtool = Tree(self.paths.ethtool)
        self.top = Tree(root)
        self.gpus = [GpuFiles(gpu, self.counters) for gpu in layout.gpus]
        self.pressure = proc_files.Pressure()
        self.spool = SpoolWriter(str(self.paths.spool), layout.name, entries_interval)
        sysfs_files.build(self.sysfs, layout)
        self.top.write("kmsg", KMSG_BOOT)  # the node's kernel log: no XID before the start
        # procfs's self/ (the simulated proc has no processes of its own to point it at)
        for directory in (self.paths.spool, root / "fr", root / "frpipe",
                          self.paths.procfs / "self"):
            directory.mkdir(parents=True, exist_ok=True)

    @property
    def name(self) -> str:
        return self.layout.name

    def baseline(self, job: Job) -> NodeCondition:
        """The node as the job leaves it, before scenarios."""
        running = job.state in ("running", "starved")
        spans_nodes = len({rank.node for rank in job.ranks}) > 1
        collective = job.bus_bytes_per_second() if spans_nodes else 0.0
        hosted = {rank.local_rank for rank in job.ranks if rank.node == self.layout.index}
        gpus = [GpuCondition(load=job.load() if gpu.index in hosted else "off")
                for gpu in self.layout.gpus]
        ports = [PortCondition(
            tx_bytes=BACKGROUND + collective,
            rx_bytes=BACKGROUND + collective + (DATA_LOADING if running else 0.0),
            rates=Counter({"np_cnp_sent": HEALTHY_CNP, "rp_cnp_handled": HEALTHY_CNP,
                           "np_ecn_marked_roce_packets": HEALTHY_CNP} if running else {}),
            rx_pause=0.001 if running else 0.0) for _ in self.layout.nics]
        disk = HEALTHY_DISK if running else IDLE_DISK
        return NodeCondition(gpus, ports, dataclasses.replace(disk),
                             io_pressure_some=0.004 if running else 0.0)

    def write(self, now: float, seconds: float, cond: NodeCondition, job: Job,
              window: float) -> None:
        """Advance every counter by `seconds` of `cond` and rewrite what changed."""
        ranks = {rank.local_rank: rank for rank in job.ranks
                 if rank.node == self.layout.index and job.alive}
        for gpu, files, gpu_cond in zip(self.layout.gpus, self.gpus, cond.gpus):
            rank = ranks.get(gpu.index)
            process = Process(rank.pid, rank.memory[0]) if rank else None
            self.nvml.write(f"gpu{gpu.index:02d}.json",
                            files.render(gpu_cond, process, now, seconds, window))
        sysfs_files.update(self.sysfs, self.layout, cond.ports, self.counters, seconds,
                           cond.gpudirect, cond.unbound_nics)
        for nic, port in zip(self.layout.nics, cond.ports):
            self.ethtool.write(nic.netdev, nic_files.dump(nic.netdev, port, self.counters,
                                                          seconds))
        self.top.write("netlink.json", nic_files.link_dump(self.layout, cond, self.counters,
                                                           seconds))
        self.procfs.write("diskstats", proc_files.diskstats(self.layout.disks, cond.disk,
                                                            self.counters, seconds))
        self.procfs.write("pressure/io", self.pressure.render(
            cond.io_pressure_some, cond.io_pressure_full, self.counters, seconds))
        pod = pod_name(job, self.name)
        env = nccl_files.environment(self.layout, pod, cond.nccl)
        nodes = len({r.node for r in job.ranks})
        for rank in ranks.values():
            proc_files.write_cgroup(self.procfs, rank.pid, self.pod_uid(pod),
                                    _hex("container", pod, rank.rank, rank.pid, length=64))
            self.procfs.write(f"{rank.pid}/environ", nccl_files.environ_bytes(env))
            self.procfs.write(f"{rank.pid}/root{nccl_files.log_path(pod, rank.pid)}",
                              nccl_files.log(self.layout, pod, rank.pid, rank.local_rank,
                                             rank.rank, job.world_size, nodes, cond.nccl,
                                             cond.unbound_nics))
        self.spool.write(job, list(ranks.values()), now, env)  # none: the job's logs are closed

    @staticmethod
    def pod_uid(pod: str) -> str:
        h = _hex("pod", pod, length=32)
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
