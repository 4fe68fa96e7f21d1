"""A rank's NCCL settings from its environment, read the way NCCL reads them.

Values are hostile input (any process can set anything): each is cut to MAX_VALUE characters
and every parser here is bounded and never raises.  Only the environment is seen: settings
in /etc/nccl.conf or NCCL_CONF_FILE are not, and the environment overrides them anyway.

The grammars follow NCCL's source (src/misc/utils.cc `parseStringList`/`matchIfList`,
src/transport/net_ib/init.cc for NCCL_IB_HCA, src/os/linux.cc for NCCL_SOCKET_IFNAME,
src/misc/param.cc for integer parameters, src/graph/paths.cc `ncclGetLevel` for levels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Mapping

MAX_VALUE = 1024
MAX_IB_DEVS = 32  # NCCL's MAX_IB_DEVS: entries of NCCL_IB_HCA past it are ignored
MAX_IFS = 16  # NCCL's MAX_IFS for NCCL_SOCKET_IFNAME
MAX_PREFIX = 63  # netIf.prefix is char[64]
ANY_PORT = -1

# NCCL's path types, nearest first (src/graph/topo.cc topoPathTypeStr); a level allows every
# path whose rank is at most its own.
PATH_TYPES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
# The numeric forms NCCL still accepts: 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and above SYS.
_OLD_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")
_INTEGER = re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_ATOI = re.compile(r"\s*([+-]?[0-9]{1,18})")


def variable(field: str) -> str:
    """The environment variable behind a field of NcclSettings (ib_hca -> NCCL_IB_HCA)."""
    return "NCCL_" + field.upper()


@dataclass(frozen=True)
class NcclSettings:
    """The NCCL variables that decide transport and performance; '' means unset."""

    ib_hca: str = ""
    ib_gid_index: str = ""
    socket_ifname: str = ""
    net_gdr_level: str = ""
    ib_qps_per_connection: str = ""
    ib_split_data_on_qps: str = ""
    ib_disable: str = ""
    p2p_disable: str = ""
    shm_disable: str = ""
    net: str = ""
    algo: str = ""
    proto: str = ""
    cross_nic: str = ""
    topo_file: str = ""
    debug: str = ""
    debug_subsys: str = ""
    debug_file: str = ""
    # What the GID auto-selection (NCCL 2.21 and newer) and the P2P level depend on.
    p2p_level: str = ""
    ib_addr_family: str = ""
    ib_addr_range: str = ""
    ib_roce_version_num: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NcclSettings:
        """The settings in `env` (NCCL_IB_HCA -> ib_hca, ...), each cut to MAX_VALUE."""
        values = {}
        for field in fields(cls):
            value = env.get(variable(field.name), "")
            values[field.name] = value[:MAX_VALUE] if isinstance(value, str) else ""
        return cls(**values)


# The settings llmmon_job_nccl_settings_info carries as labels: those that decide the
# transport and its performance (the rest are read for the checks only).
EXPORTED = ("ib_hca", "ib_gid_index", "socket_ifname", "net_gdr_level", "ib_qps_per_connection",
            "ib_disable", "p2p_disable", "shm_disable", "net", "algo", "proto")


def nccl_int(text: str) -> int | None:
    """An integer parameter as NCCL's `strtoll(str, NULL, 0)` reads it: leading digits in
    decimal, 0x hex or 0 octal, trailing junk ignored, no digits = 0.  None when unset, or
    out of range (NCCL then keeps its default)."""
    if not text:
        return None
    match = _INTEGER.match(text[:MAX_VALUE])
    if not match:
        return 0
    sign, digits = match.groups()
    base = 16 if digits[:2] in ("0x", "0X") else 8 if digits.startswith("0") else 10
    value = int(digits[:40], base) if len(digits) <= 40 else 2**64
    value = -value if sign == "-" else value
    return value if -2**63 <= value < 2**63 else None


def _atoi(text: str) -> int:
    match = _ATOI.match(text)
    return int(match.group(1)) if match else 0


def path_level(text: str) -> str | None:
    """The path type a level variable (NCCL_NET_GDR_LEVEL, NCCL_P2P_LEVEL) names, or None
    when NCCL would ignore it: an exact name (`PHB`) or an old number (`2` is PXB)."""
    if text in PATH_TYPES:
        return text
    if text[:1].isdigit():
        old = nccl_int(text)  # None: past LONG_MAX, which strtol clamps to it
        return _OLD_LEVELS[-1 if old is None else min(old, len(_OLD_LEVELS) - 1)]
    return None


def path_rank(path: str) -> int | None:
    """How far a path type is, for comparing with a level; topology's NODE is NCCL's PHB
    (host bridges of one NUMA node), None for an unknown name."""
    path = "PHB" if path == "NODE" else path
    return PATH_TYPES.index(path) if path in PATH_TYPES else None


@dataclass(frozen=True)
class Entry:
    """One item of a device list: a name or prefix and, for NCCL_IB_HCA, a port."""

    prefix: str
    port: int = ANY_PORT

    def __str__(self) -> str:
        return self.prefix if self.port == ANY_PORT else f"{self.prefix}:{self.port}"


@dataclass(frozen=True)
class DeviceList:
    """NCCL's device-list filter: `exclude` (a leading `^`) inverts the match, `exact` (a
    leading `=`, after any `^`) compares whole names instead of prefixes.  No entries
    matches every device, except with `^` alone, which matches none (NCCL's XOR)."""

    entries: tuple[Entry, ...] = ()
    exclude: bool = False
    exact: bool = False

    def entry_matches(self, entry: Entry, name: str, port: int = ANY_PORT) -> bool:
        """Whether `entry` names this device and port, before any exclusion."""
        named = name == entry.prefix if self.exact else name.startswith(entry.prefix)
        return named and (port == ANY_PORT or entry.port == ANY_PORT or port == entry.port)

    def matches(self, name: str, port: int = ANY_PORT) -> bool:
        """Whether NCCL would use this device (and port; ANY_PORT for interfaces)."""
        listed = not self.entries or any(self.entry_matches(e, name, port)
                                         for e in self.entries)
        return listed != self.exclude

    def __str__(self) -> str:
        return ("^" if self.exclude else "") + ("=" if self.exact else "") + ",".join(
            str(e) for e in self.entries)


def parse_device_list(text: str, max_entries: int = MAX_IB_DEVS) -> DeviceList:
    """`mlx5_0:1,mlx5_1:1`, `=mlx5_0`, `^mlx5_3`, `^=docker0`, `mlx5` (a prefix) as NCCL
    parses them: empty items are skipped, an item's text after `:` is its port (atoi, so
    `mlx5_0:x` and `mlx5_0:` are port 0, which no port has), later `:rail:plane` fields are
    ignored."""
    text = text[:MAX_VALUE]
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    entries = []
    for item in text.split(","):
        if len(entries) >= max_entries:
            break
        name, colon, rest = item.partition(":")
        if not name:
            continue
        # a `:` with nothing after it is port 0 to NCCL's atoi too, which no port has
        port = _atoi(rest.partition(":")[0]) if colon else ANY_PORT
        entries.append(Entry(name[:MAX_PREFIX], port))
    return DeviceList(tuple(entries), exclude, exact)
