"""RDMA devices and ports under /sys/class/infiniband, as the kernel ABI describes them.

Shared by the rdma collector (counters) and the topology collector (which NIC is where), so
both agree on device names, netdevs and the parsing of `state`, `phys_state` and `rate`.
"""

from __future__ import annotations

import re

from llmmon.counters import check_count
from llmmon.sources.fs import RootedFS, SourceError

CLASS = "class/infiniband"
_STATE = re.compile(r"^\s*(\d+)\s*:")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


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
