"""RDMA devices and ports under /sys/class/infiniband, as the kernel ABI describes them.

Shared by the rdma collector (counters) and the topology collector (which NIC is where), so
both agree on device names, netdevs and the parsing of `state`, `phys_state` and `rate`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmmon.counters import check_count
from llmmon.sources.fs import RootedFS, SourceError

CLASS = "class/infiniband"
_STATE = re.compile(r"^\s*(\d+)\s*:")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
ACTIVE = 4  # the `state` id of an ACTIVE port, the only state NCCL uses a port in
# mlx5 RoCE tables hold 255 entries, InfiniBand ones 128: the cap only bounds a broken sysfs.
MAX_GIDS = 512
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
ROCE_V2 = "RoCE v2"


def devices(sysfs: RootedFS) -> list[str]:
    """RDMA device names (mlx5_0, irdma0, ...); none on a node without RDMA."""
    return sysfs.listdir(CLASS)


def ports(sysfs: RootedFS, device: str) -> list[str]:
    """Port numbers of a device, in numeric order."""
    return sorted((p for p in sysfs.listdir(CLASS, device, "ports") if p.isdigit()), key=int)


def parse_state(text: str) -> int:
    """`4: ACTIVE` -> 4 (state and phys_state share the `id: name` shape)."""
    match = _STATE.match(text)
    if not match:
        raise ValueError(f"not an 'id: name' state: {text[:40]!r}")
    return int(match.group(1))


def parse_rate(text: str) -> float:
    """`400 Gb/sec (4X NDR)` -> bytes per second (the kernel's Gb are 10^9 bits)."""
    match = _RATE.match(text)
    if not match:
        raise ValueError(f"not a rate: {text[:40]!r}")
    return float(match.group(1)) * 1e9 / 8


def parse_counter(text: str) -> int | None:
    """A counter file's value; None for `N/A (no PMA)` (iWARP devices and VFs have no PMA)."""
    if text.startswith("N/A"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not a counter: {text[:40]!r}") from None
    try:
        return check_count(value)
    except ValueError as exc:
        raise ValueError(f"{text[:40]!r}...: {exc}") from None


def port_netdev(sysfs: RootedFS, device: str, port: str) -> str:
    """The netdev behind a port: `gid_attrs/ndevs/0` (RoCE), else the PCI function's only
    net interface (IPoIB on InfiniBand, whose GID table has no netdev); '' when unknown."""
    try:
        name = sysfs.read_value(CLASS, device, "ports", port, "gid_attrs", "ndevs", "0")
    except SourceError:  # EINVAL on InfiniBand ports, absent on old kernels
        name = ""
    if name:
        return name
    try:
        names = sysfs.listdir(CLASS, device, "device", "net")
    except SourceError:
        return ""
    return names[0] if len(names) == 1 else ""


def link_layer(sysfs: RootedFS, device: str, port: str) -> str:
    """`InfiniBand` or `Ethernet` (RoCE); '' when the attribute is missing (old kernels)."""
    try:
        return sysfs.read_value(CLASS, device, "ports", port, "link_layer")
    except SourceError:
        return ""


def port_state(sysfs: RootedFS, device: str, port: str) -> int:
    """The logical state id (4 ACTIVE); raises SourceError when unreadable or malformed."""
    text = sysfs.read_value(CLASS, device, "ports", port, "state")
    try:
        return parse_state(text)
    except ValueError as exc:
        raise SourceError(f"{sysfs.path(CLASS, device, 'ports', port, 'state')}: {exc}") from None


@dataclass(frozen=True)
class Gid:
    """One used entry of a port's GID table, as the kernel shows it.

    `address` is the kernel's text (eight groups of four hex digits, `%pI6`); `type` is
    `RoCE v2`, `IB/RoCE v1`, or '' when the kernel would not say (EINVAL, empty read).
    """

    index: int
    address: str
    type: str

    @property
    def ipv4_mapped(self) -> bool:
        """`::ffff:a.b.c.d`: the entry RoCE v2 routes over IPv4 (NCCL's default family)."""
        return self.address.startswith("0000:0000:0000:0000:0000:ffff:")

    @property
    def link_local(self) -> bool:
        """fe80::/64, the entry every RoCE netdev has: not routable beyond one L2 segment."""
        return self.address.startswith("fe80:0000:0000:0000:")


def gids(sysfs: RootedFS, device: str, port: str) -> list[Gid]:
    """The port's used GID entries in index order, at most MAX_GIDS of them.

    The kernel lists every slot of the table: an unused one reads as the all-zero GID in
    `gids/<i>` and fails with EINVAL in `gid_attrs/types/<i>`; both mean "no entry" here.
    A slot whose type cannot be read keeps its address with type ''.
    """
    base = (CLASS, device, "ports", port)
    indexes = sorted((int(i) for i in sysfs.listdir(*base, "gids") if i.isdigit()))
    table = []
    for index in indexes[:MAX_GIDS]:
        try:
            address = sysfs.read_value(*base, "gids", str(index)).lower()
        except SourceError:
            continue
        if not address or address == ZERO_GID:
            continue
        try:
            kind = sysfs.read_value(*base, "gid_attrs", "types", str(index))
        except SourceError:
            kind = ""
        table.append(Gid(index, address[:64], kind[:32]))
    return table
