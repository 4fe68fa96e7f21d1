"""GPU-to-NIC placement on the PCIe tree, classified as `nvidia-smi topo -m` does, the nearest
RDMA NIC of each GPU, and whether GPUDirect RDMA is possible (peer-memory module loaded).

Collective bandwidth depends on each GPU reaching its NIC without crossing the CPU: PIX (one
PCIe switch) is best, SYS (across sockets) worst.  GPUs are found in sysfs (NVIDIA VGA/3D
controllers) and named by NVML (`gpu` index and `uuid`, joining llmmon_gpu_*); without NVML
`gpu` is the index in PCI bus order, which is NVML's default order (and CUDA's with
CUDA_DEVICE_ORDER=PCI_BUS_ID), and `uuid` is empty.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from prometheus_client.core import Metric

from llmmon.collector import Collector, Context, Environment
from llmmon.metrics import Families, MetricSpec
from llmmon.network import dmabuf
from llmmon.options import Option
from llmmon.sources import infiniband, pci
from llmmon.sources.nvml import NvmlError, NvmlUnavailable, list_gpus
from llmmon.sources.nvml_open import open_nvml
from llmmon.sources.pci import PciPath

PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first
PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")

AFFINITY = MetricSpec(
    "llmmon_gpu_nic_affinity", "gauge",
    "1 for each GPU and RDMA device; path is the PCIe path between them: PIX (one switch), "
    "PXB (several switches), PHB (host bridge), NODE (host bridges of one NUMA node), SYS "
    "(across sockets). Only with --collector.topology.affinity-matrix.",
    ("gpu", "uuid", "device", "path"))
NEAREST = MetricSpec(
    "llmmon_gpu_nearest_nic_info", "info",
    "The RDMA device nearest each GPU (ties spread over the GPUs that share them, as NCCL "
    "does); path PHB, NODE or SYS means GPU traffic goes through the CPU.",
    ("gpu", "uuid", "device", "netdev", "path"))
GPUDIRECT = MetricSpec(
    "llmmon_gpudirect_rdma_enabled", "gauge",
    "1 if a GPUDirect RDMA peer-memory module (nvidia_peermem, legacy nv_peer_mem) is loaded; "
    "exported when the node has both NVIDIA GPUs and RDMA devices.")
DMABUF = MetricSpec(
    "llmmon_gpudirect_dmabuf_supported", "gauge",
    "1 if GPUDirect RDMA can go through DMA-BUF without a peer-memory module: Linux 5.12 or "
    "newer and NVIDIA's open GPU kernel module (procfs sys/kernel/osrelease, "
    "driver/nvidia/version); exported with llmmon_gpudirect_rdma_enabled.")


def classify(gpu: PciPath, gpu_numa: int, nic: PciPath, nic_numa: int) -> tuple[str, int]:
    """The `nvidia-smi topo -m` class of the path between two devices, and its hop count."""
    if gpu.root != nic.root:
        return ("NODE" if gpu_numa == nic_numa else "SYS"), 0
    common = len(os.path.commonprefix([gpu.chain, nic.chain]))
    hops = len(gpu.chain) + len(nic.chain) - 2 * common
    if common == 0:
        return "PHB", hops
    # Bridges below the shared one: one downstream port per side means one switch.
    return ("PIX" if hops - 2 <= 2 else "PXB"), hops


def nearest(distances: dict[str, dict[str, tuple[str, int]]]) -> dict[str, str]:
    """GPU -> nearest NIC.  GPUs with the same set of equally near NICs take them in turn,
    in PCI order, so two GPUs behind one switch with two NICs get one NIC each."""
    best: dict[str, tuple[str, ...]] = {}
    for gpu, nics in distances.items():
        rank = {nic: (PATHS.index(path), hops) for nic, (path, hops) in nics.items()}
        top = min(rank.values())
        best[gpu] = tuple(sorted(nic for nic, r in rank.items() if r == top))
    chosen = {}
    for gpu, candidates in best.items():
        peers = sorted(g for g, c in best.items() if c == candidates)
        chosen[gpu] = candidates[peers.index(gpu) % len(candidates)]
    return chosen


class TopologyCollector(Collector):
    name = "topology"
    description = ("GPU-to-RDMA-NIC PCIe placement (PIX/PXB/PHB/NODE/SYS), nearest NIC per "
                   "GPU and GPUDirect RDMA (nvidia_peermem).")
    specs = (AFFINITY, NEAREST, GPUDIRECT, DMABUF)
    options = (
        Option("nvml", "bool", True,
               "Name GPUs through NVML (index and uuid); off: PCI bus order and no uuid."),
        Option("affinity_matrix", "bool", False,
               "Export llmmon_gpu_nic_affinity, the path of every GPU-NIC pair (64 series on "
               "an HGX node). llmmon_gpu_nearest_nic_info, what the dashboards and diagnose "
               "read, is always exported."),
    )
    roots = ("sysfs",)
    interval = 60.0
    timeout = 5.0

    def __init__(self, env: Environment, config: dict[str, Any]) -> None:
        super().__init__(env, config)
        self.nvml = open_nvml(env.settings["nvml.replay"]) if config["nvml"] else None

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()

    def collect(self, ctx: Context) -> Iterable[Metric]:
        families = Families()
        sysfs = self.env.sysfs
        gpus = self._place(ctx, [("bus/pci/devices", a) for a in pci.nvidia_gpus(sysfs)])
        nics = self._place(ctx, [(infiniband.CLASS, d, "device")
                                 for d in infiniband.devices(sysfs)])
        names = self._gpu_names(ctx, sorted(gpus))
        ctx.watching(len(names) * len(nics), "GPU-NIC pairs")
        if not names or not nics:
            return families
        distances = {g: {n: classify(*gpus[g], *nics[n]) for n in nics} for g in names}
        chosen = nearest(distances)
        for gpu, gpu_labels in names.items():
            for nic, (path, _) in sorted(distances[gpu].items()):
                if self.config["affinity_matrix"]:
                    families.add(AFFINITY, gpu_labels + (nic, path), 1)
            nic = chosen[gpu]
            ports = infiniband.ports(sysfs, nic)
            netdev = infiniband.port_netdev(sysfs, nic, ports[0]) if ports else ""
            families.add(NEAREST, gpu_labels + (nic, netdev, distances[gpu][nic][0]), 1)
        loaded = any(sysfs.exists("module", m) for m in PEER_MEMORY_MODULES)
        families.add(GPUDIRECT, (), int(loaded))
        families.add(DMABUF, (), int(dmabuf.supported(self.env.procfs)))
        return families

    def _gpu_names(self, ctx: Context, addresses: list[str]) -> dict[str, tuple[str, str]]:
        """sysfs address -> (gpu index, uuid) from NVML; PCI order and no uuid without it."""
        in_pci_order = {address: (str(i), "") for i, address in enumerate(addresses)}
        if self.nvml is None:
            return in_pci_order
        try:
            identities = {g.sysfs_pci_address: g for g in list_gpus(self.nvml)}
        except NvmlUnavailable:
            return in_pci_order
        except NvmlError as exc:
            ctx.error("nvml", f"NVML: {exc}")
            return in_pci_order
        for address in identities.keys() - set(addresses):
            ctx.error(address, f"NVML GPU {address} is not in {self.env.sysfs.path('devices')} "
                      "(is --path.sysfs the host's?)")
        # GPUs NVML does not list are lost; the gpu collector reports them.
        return {a: (str(identities[a].index), identities[a].uuid)
                for a in addresses if a in identities}

    def _place(self, ctx: Context, links: list[tuple[str, ...]]) -> dict[str, tuple[PciPath, int]]:
        """name -> (PCI place, NUMA node) for each sysfs device link; virtual ones skipped."""
        placed = {}
        for link in links:
            where = pci.locate(self.env.sysfs, *link)
            name = link[1]
            if where is None:
                if link[0] == "bus/pci/devices":
                    ctx.error(name, f"{name}: not under {self.env.sysfs.path('devices')}")
                continue  # soft RDMA devices (rxe, siw) have no PCI place
            placed[name] = (where, pci.numa_node(self.env.sysfs, *link))
        return placed
