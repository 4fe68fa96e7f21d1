"""The hardware of a simulated node: GPUs and RDMA NICs behind PCIe switches, disks, netdevs.

The shape is an HGX H200 board: every PCIe switch holds two GPUs and two ConnectX-7 NICs (so
each GPU has a NIC on its own switch, PIX), two switches per CPU socket.  Bus numbers follow
the HGX fixture (`tests/fixtures/topology/hgx`), netdev names follow the kernel's predictable
naming for a RoCE function (`enp<bus>s0np0`), and identities derive from the node name so a
node keeps its UUIDs across restarts of the simulator.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

GPUS_PER_SWITCH = 2
NICS_PER_SWITCH = 2
ROOT_BUS_FIRST, ROOT_BUS_STEP = 0x15, 0x22  # root complexes 15, 37, 59, 7b, ...
GIB = 1 << 30


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


@dataclass(frozen=True)
class Switch:
    """One PCIe switch under its own root complex: root port, upstream and downstream ports."""

    index: int
    numa: int

    @property
    def root_bus(self) -> int:
        return ROOT_BUS_FIRST + ROOT_BUS_STEP * self.index

    @property
    def chain(self) -> tuple[str, str]:
        """Root port and switch upstream port, as PCI addresses."""
        return (f"0000:{self.root_bus:02x}:01.0", f"0000:{self.root_bus + 1:02x}:00.0")

    def downstream(self, slot: int) -> str:
        return f"0000:{self.root_bus + 2:02x}:{slot:02x}.0"

    def endpoint_bus(self, slot: int) -> int:
        return self.root_bus + 3 + slot


@dataclass(frozen=True)
class Endpoint:
    """A PCI function on a downstream port of a switch."""

    index: int
    switch: Switch
    slot: int

    @property
    def bus(self) -> int:
        return self.switch.endpoint_bus(self.slot)

    @property
    def address(self) -> str:
        return f"0000:{self.bus:02x}:00.0"


@dataclass(frozen=True)
class Gpu(Endpoint):
    uuid: str = ""
    serial: str = ""

    @property
    def nvml_bus_id(self) -> str:
        """As NVML reports it: eight-digit domain, upper-case hex."""
        return f"00000000:{self.bus:02X}:00.0"


@dataclass(frozen=True)
class Nic(Endpoint):
    @property
    def device(self) -> str:
        return f"mlx5_{self.index}"

    @property
    def netdev(self) -> str:
        return f"enp{self.bus}s0np0"


@dataclass(frozen=True)
class Disk:
    name: str
    major: int
    minor: int
    partitions: tuple[str, ...] = ()
    data: bool = False  # serves the training data set (the RAID members and the array)


@dataclass(frozen=True)
class NodeLayout:
    name: str
    index: int
    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...]
    disks: tuple[Disk, ...]
    management_netdev: str = "eno1"

    @property
    def switches(self) -> tuple[Switch, ...]:
        return tuple(dict.fromkeys([g.switch for g in self.gpus] + [n.switch for n in self.nics]))


def _uuid(node: str, gpu: int) -> str:
    h = _digest("gpu", node, gpu)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _disks(count: int) -> tuple[Disk, ...]:
    """An OS NVMe with partitions, data NVMe drives, and the md RAID-0 the data set lives on."""
    if count < 1:
        raise ValueError("a node needs at least one disk")
    disks = [Disk("nvme0n1", 259, 0, ("nvme0n1p1", "nvme0n1p2"))]
    members = max(count - 2, 0)
    disks += [Disk(f"nvme{n}n1", 259, 3 + n, data=True) for n in range(1, members + 1)]
    if count > 1:
        disks.append(Disk("md0", 9, 0, data=True))
    return tuple(disks)


def build(name: str, index: int, gpus: int = 8, nics: int = 8, disks: int = 6) -> NodeLayout:
    """A node with `gpus` GPUs and `nics` RDMA NICs, two of each per PCIe switch."""
    if not 0 < gpus <= 16 or not 0 <= nics <= 16:
        raise ValueError("simulated nodes have 1-16 GPUs and 0-16 RDMA NICs")
    switch_count = max(-(-gpus // GPUS_PER_SWITCH), -(-nics // NICS_PER_SWITCH))
    switches = [Switch(s, 2 * s // switch_count) for s in range(switch_count)]  # two sockets
    gpu_list = tuple(
        Gpu(g, switches[g // GPUS_PER_SWITCH], g % GPUS_PER_SWITCH, _uuid(name, g),
            str(1650000000000 + int(_digest("serial", name, g)[:8], 16) % 10**9))
        for g in range(gpus))
    nic_list = tuple(Nic(n, switches[n // NICS_PER_SWITCH], GPUS_PER_SWITCH + n % NICS_PER_SWITCH)
                     for n in range(nics))
    return NodeLayout(name, index, gpu_list, nic_list, _disks(disks))
