"""A job's NCCL settings judged against the node it runs on: the checklist for "all-reduce is
slower than it should be" (right network, every rail, the RoCE v2 GID, a live socket
interface, GPUDirect RDMA, P2P and SHM, several QPs, GPU-NIC placement), one finding each.

Each check says what NCCL itself would do with the settings (the grammars and defaults are
NCCL's, see nccl_settings), so a finding names the values seen and one fix.  Which checks
apply depends on the node and the job: the network ones only on a job spanning nodes, the
RDMA ones only where the node has RDMA ports, P2P and SHM on any job with several GPUs here.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from llmmon.network import dmabuf
from llmmon.network.nccl_log import NcclLog
from llmmon.network.nccl_settings import (
    MAX_IFS, NcclSettings, nccl_int, parse_device_list, path_level, path_rank)
from llmmon.sources import infiniband, netclass
from llmmon.sources.fs import RootedFS, SourceError
from llmmon.sources.infiniband import ROCE_V2, Gid

__all__ = ("CHECKS", "Finding", "Gid", "NodeFacts", "RdmaPort", "check", "read_node")

CHECKS = ("transport_socket", "ib_disabled", "ib_hca_unknown", "ib_hca_missing_rail",
          "gid_index_unset", "gid_index_not_rocev2", "socket_ifname_down", "gdr_unavailable",
          "gdr_level_blocks", "p2p_disabled", "shm_disabled", "single_qp_multi_rail",
          "gpu_nic_cross_socket")
PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")
MAX_PORTS = 128  # NCCL itself uses at most 32 (MAX_IB_DEVS); SR-IOV nodes list hundreds
MAX_NAMES = 6  # names listed in one piece of evidence
MAX_EVIDENCE = 400
AUTO_GID_VERSION = (2, 21)  # NCCL_IB_GID_INDEX defaults to -1 (choose) from 2.21, 0 before
DEFAULT_QPS = 1  # NCCL_IB_QPS_PER_CONNECTION's default
_VERSION = re.compile(r"^(\d{1,4})\.(\d{1,4})")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device; gids are read only for ACTIVE RoCE ports."""

    device: str
    port: int
    active: bool
    link_layer: str  # "InfiniBand" | "Ethernet" ('' unknown)
    netdev: str
    gids: tuple[Gid, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"

    def gid(self, index: int) -> Gid | None:
        return next((g for g in self.gids if g.index == index), None)


@dataclass(frozen=True)
class NodeFacts:
    """What the node offers NCCL, read once per collection for every job on it."""

    ports: tuple[RdmaPort, ...]
    netdevs_up: frozenset[str]
    netdevs: frozenset[str]
    gpudirect: bool  # nvidia_peermem/nv_peer_mem loaded, or DMA-BUF supported
    gpu_nic_path: Mapping[str, str]  # GPU uuid -> PCIe path to its nearest NIC (PIX..SYS)
    gpus: int
    # RDMA devices that are some GPU's nearest NIC (the training rails); empty: not known,
    # then every ACTIVE port of the chosen link layer counts as a rail
    rail_devices: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Finding:
    check: str  # one of CHECKS
    evidence: str  # one line: what was seen
    fix: str  # one line: what to do


def read_node(sysfs: RootedFS, procfs: RootedFS, gpu_nic_path: Mapping[str, str],
              gpus: int, rail_devices: frozenset[str] = frozenset()) -> NodeFacts:
    """The node's RDMA ports, interfaces and GPUDirect support; an unreadable file costs only
    what it describes (a port without a state is not ACTIVE)."""
    ports: list[RdmaPort] = []
    try:
        devices = infiniband.devices(sysfs)
    except SourceError:
        devices = []
    for device in devices:
        try:
            numbers = infiniband.ports(sysfs, device)
        except SourceError:
            continue
        for number in numbers:
            if len(ports) < MAX_PORTS:
                ports.append(_read_port(sysfs, device, number))
    try:
        names = netclass.interfaces(sysfs)
    except SourceError:
        names = []
    gpudirect = (any(sysfs.exists("module", m) for m in PEER_MEMORY_MODULES)
                 or dmabuf.supported(procfs))
    return NodeFacts(tuple(ports), frozenset(n for n in names if netclass.is_up(sysfs, n)),
                     frozenset(names), gpudirect, dict(gpu_nic_path), gpus, rail_devices)


def _read_port(sysfs: RootedFS, device: str, port: str) -> RdmaPort:
    try:
        active = infiniband.port_state(sysfs, device, port) == infiniband.ACTIVE
    except SourceError:
        active = False
    layer = infiniband.link_layer(sysfs, device, port)
    gids: tuple[Gid, ...] = ()
    if active and layer == "Ethernet":
        try:
            gids = tuple(infiniband.gids(sysfs, device, port))
        except SourceError:
            pass
    return RdmaPort(device, int(port), active, layer,
                    infiniband.port_netdev(sysfs, device, port), gids)


def check(settings: NcclSettings, node: NodeFacts, gpus: Sequence[str],
          log: NcclLog | None, multi_node: bool) -> tuple[tuple[str, ...], list[Finding]]:
    """(the checks that applied, the findings); gpus: uuids of the job's GPUs on this node."""
    job = _Job(settings, node, tuple(dict.fromkeys(gpus)), log, multi_node)
    applied = tuple(name for name in CHECKS if job.applies(name))
    findings = []
    for name in applied:
        result = getattr(job, name)()
        if result is not None:
            evidence, fix = result
            findings.append(Finding(name, _line(evidence), _line(fix)))
    return applied, findings


class _Job:
    """One job on one node: each method is a check, returning (evidence, fix) or None."""

    def __init__(self, settings: NcclSettings, node: NodeFacts, gpus: tuple[str, ...],
                 log: NcclLog | None, multi_node: bool) -> None:
        self.s, self.node, self.gpus, self.log, self.multi_node = (
            settings, node, gpus, log, multi_node)
        self.active = [p for p in node.ports if p.active]
        self.hca = parse_device_list(settings.ib_hca)
        self.selected = [p for p in self.active if self.hca.matches(p.device, p.port)]
        self.roce = [p for p in self.selected if p.roce]
        self.placed = {g: node.gpu_nic_path[g] for g in gpus if g in node.gpu_nic_path}
        ib_off = nccl_int(settings.ib_disable)
        self.ib_off = bool(ib_off) or settings.net.strip().lower() == "socket"

    def applies(self, name: str) -> bool:
        if name in ("p2p_disabled", "shm_disabled"):
            return len(self.gpus) > 1
        if not self.multi_node:
            return False
        if name == "socket_ifname_down":
            return True
        if name == "transport_socket":
            return bool(self.active) and self.log is not None and bool(self.log.net)
        if name in ("ib_disabled", "gdr_unavailable"):
            return bool(self.active) and (name == "ib_disabled" or self.node.gpus > 0)
        if name in ("gdr_level_blocks", "gpu_nic_cross_socket"):
            return bool(self.node.ports) and bool(self.placed)
        # The rest judge how NCCL uses the RDMA ports: moot when it is told not to.
        if self.ib_off:
            return False
        if name == "ib_hca_unknown":
            return bool(self.node.ports)
        if name in ("gid_index_unset", "gid_index_not_rocev2"):
            return any(p.roce for p in self.active)
        return bool(self.active)  # ib_hca_missing_rail, single_qp_multi_rail

    # -- the network NCCL chose --

    def transport_socket(self) -> tuple[str, str] | None:
        log = self.log
        if log is None or log.net.lower() != "socket":
            return None
        version = f"NCCL {_shown(log.version)}" if log.version else "NCCL"
        devices = f" ({_names(log.net_devices)})" if log.net_devices else ""
        return (f"{version} chose NET/Socket{devices} while RDMA ports "
                f"{_names(p.name for p in self.active)} are ACTIVE",
                "let NCCL use RDMA: /dev/infiniband and libibverbs in the job's container, "
                "NCCL_IB_DISABLE and NCCL_NET unset, NCCL_IB_HCA naming ACTIVE ports")

    def ib_disabled(self) -> tuple[str, str] | None:
        if not self.ib_off:
            return None
        said = [f"NCCL_IB_DISABLE={_shown(self.s.ib_disable)}"] if nccl_int(
            self.s.ib_disable) else []
        said += [f"NCCL_NET={_shown(self.s.net)}"] if self.s.net.strip().lower() == "socket" \
            else []
        return (f"{' and '.join(said)} with ACTIVE RDMA ports "
                f"{_names(p.name for p in self.active)}: NCCL runs over TCP",
                f"unset {' and '.join(s.partition('=')[0] for s in said)}")

    # -- which RDMA ports NCCL uses --

    def ib_hca_unknown(self) -> tuple[str, str] | None:
        if not self.s.ib_hca:
            return None
        problems = []
        if not self.hca.exclude:
            for entry in self.hca.entries:
                named = [p for p in self.node.ports
                         if self.hca.entry_matches(entry, p.device, p.port)]
                if not named:
                    problems.append(f"{entry} does not exist")
                elif not any(p.active for p in named):
                    problems.append(f"{entry} is not ACTIVE")
        if self.active and not self.selected:
            problems.append("no ACTIVE port is selected (NCCL falls back to sockets)")
        if not problems:
            return None
        return (f"NCCL_IB_HCA={_shown(self.s.ib_hca)}: {'; '.join(problems[:MAX_NAMES])}",
                f"name ACTIVE ports only, e.g. NCCL_IB_HCA=={_rails(self.active)}"
                if self.active else "name ports that exist and are ACTIVE (ibstat, "
                "/sys/class/infiniband/*/ports/*/state)")

    def ib_hca_missing_rail(self) -> tuple[str, str] | None:
        # An exclusion (^) leaves a port out on purpose; a port of another link layer than
        # the chosen ones (a RoCE storage NIC beside InfiniBand), or one that is no GPU's
        # nearest NIC where that is known (a front-end NIC), is not a training rail.
        if not self.s.ib_hca or self.hca.exclude or not self.selected:
            return None
        layers = {p.link_layer for p in self.selected}
        missing = [p for p in self.active if p not in self.selected and p.link_layer in layers
                   and (not self.node.rail_devices or p.device in self.node.rail_devices)]
        if not missing:
            return None
        return (f"NCCL_IB_HCA={_shown(self.s.ib_hca)} leaves ACTIVE rails out: "
                f"{_names(p.name for p in missing)}",
                f"list every rail: NCCL_IB_HCA=={_rails(self.selected + missing)}")

    # -- the GID on RoCE --

    def gid_index_unset(self) -> tuple[str, str] | None:
        index = nccl_int(self.s.ib_gid_index)
        if (index is not None and index >= 0) or not self.roce:
            return None
        version = _version(self.log.version if self.log else "")
        picks = {}  # which GID NCCL would use, per possible version
        if version is None or version < AUTO_GID_VERSION:
            picks["before 2.21"] = {p.name: (0, _gid_problem(p.gid(0))) for p in self.roce}
        if version is None or version >= AUTO_GID_VERSION:
            picks["2.21 and later"] = {p.name: (i, _gid_problem(p.gid(i)))
                                       for p in self.roce for i in [self._auto_gid(p)]}
        bad = {when: {n: v for n, v in chosen.items() if v[1]} for when, chosen in picks.items()}
        # With the version unknown, only a GID that is wrong whichever NCCL runs is a finding:
        # most jobs run 2.21 or later, where an unset index is NCCL's own good choice.
        if not (all(bad.values()) if version is None else any(bad.values())):
            return None
        if version is None:
            said = ("NCCL's version is unknown, and both would be wrong: before 2.21 it uses "
                    "GID 0 (" + _gid_summary(picks["before 2.21"]) + "), from 2.21 it picks "
                    "one (" + _gid_summary(picks["2.21 and later"]) + ")")
        elif version < AUTO_GID_VERSION:
            said = (f"NCCL {_shown(self.log.version)} uses GID 0: "
                    + _gid_summary(bad["before 2.21"]))
        else:
            said = (f"NCCL {_shown(self.log.version)} picks the GID itself and lands on "
                    + _gid_summary(bad["2.21 and later"]))
        return (f"NCCL_IB_GID_INDEX unset on RoCE ports {_names(p.name for p in self.roce)}; "
                + said, self._gid_fix())

    def gid_index_not_rocev2(self) -> tuple[str, str] | None:
        index = nccl_int(self.s.ib_gid_index)
        if index is None or index < 0:
            return None
        bad = {p.name: (index, problem) for p in self.roce
               for problem in [_gid_problem(p.gid(index))] if problem}
        if not bad:
            return None
        return (f"NCCL_IB_GID_INDEX={_shown(self.s.ib_gid_index)}: {_gid_summary(bad)}",
                self._gid_fix())

    def _gid_fix(self) -> str:
        best = {p.name: self._best_gid(p) for p in self.roce}
        found = {i for i in best.values() if i is not None}
        if len(found) == 1 and None not in best.values():
            return (f"set NCCL_IB_GID_INDEX={found.pop()}, the RoCE v2 entry with the "
                    "port's routable address on every RoCE port here")
        return ("give every RoCE port a routable address and set NCCL_IB_GID_INDEX to its "
                "RoCE v2 entry (show_gids / ibv_devinfo -v); here: " + ", ".join(
                    f"{n} {'none' if i is None else i}" for n, i in best.items()))

    def _best_gid(self, port: RdmaPort) -> int | None:
        auto = self._auto_gid(port)
        if not _gid_problem(port.gid(auto)):
            return auto
        good = [g for g in port.gids if not _gid_problem(g)]
        good.sort(key=lambda g: not g.ipv4_mapped)
        return good[0].index if good else None

    def _auto_gid(self, port: RdmaPort) -> int:
        """The GID index NCCL 2.21+ chooses when NCCL_IB_GID_INDEX is unset (net_ib
        `ncclIbGetGidIndex`): a RoCE v2 (NCCL_IB_ROCE_VERSION_NUM) entry of the family
        NCCL_IB_ADDR_FAMILY (AF_INET by default) in NCCL_IB_ADDR_RANGE, not link-local.
        Unused slots are skipped: NCCL's walk over them changes nothing when GID 0 is the
        port's link-local entry, as the kernel makes it."""
        family6 = self.s.ib_addr_family == "AF_INET6"
        version = nccl_int(self.s.ib_roce_version_num)
        version = 2 if version is None else version
        network = _address_range(self.s.ib_addr_range, family6)
        table = {g.index: g for g in port.gids}
        current = 0
        for index in sorted(table):
            if index == 0:
                continue
            gid, candidate = table.get(current), table[index]
            in_range = _in_range(candidate, network)
            if (_is6(candidate) != _is6(gid) and _is6(candidate) == family6 and in_range):
                current = index
            elif _is6(candidate) == family6 and _routable(candidate) and in_range and (
                    _roce_version(gid) != _roce_version(candidate) or not _routable(gid)) \
                    and _roce_version(candidate) == version:
                current = index
        return current

    # -- the socket interface --

    def socket_ifname_down(self) -> tuple[str, str] | None:
        text = self.s.socket_ifname
        if len(text) <= 1:  # NCCL ignores a value of one character
            return None
        wanted = parse_device_list(text, MAX_IFS)
        if any(wanted.matches(n) for n in self.node.netdevs_up):
            return None
        down = sorted(n for n in self.node.netdevs - self.node.netdevs_up if wanted.matches(n))
        seen = f" (down: {_names(down)})" if down else ""
        up = sorted(n for n in self.node.netdevs_up if n != "lo")
        return (f"NCCL_SOCKET_IFNAME={_shown(text)} matches no interface that is up{seen}",
                f"name an interface that is up and reaches the other nodes (up here: "
                f"{_names(up) if up else 'none'})")

    # -- GPUDirect RDMA --

    def gdr_unavailable(self) -> tuple[str, str] | None:
        if self.node.gpudirect or (self.log is not None and self.log.gdr is True):
            return None
        return (f"no nvidia_peermem (nv_peer_mem) module and no DMA-BUF support on a node with "
                f"{self.node.gpus} GPUs and ACTIVE RDMA ports "
                f"{_names(p.name for p in self.active)}: NCCL stages through host memory",
                "modprobe nvidia_peermem, or run NVIDIA's open GPU kernel module on Linux 5.12 "
                "or newer for DMA-BUF")

    def gdr_level_blocks(self) -> tuple[str, str] | None:
        if not self.s.net_gdr_level:
            return None
        level = path_level(self.s.net_gdr_level)
        if level is None:
            return None  # NCCL ignores a value it cannot read and keeps its default
        limit = path_rank(level)
        blocked = {g: p for g, p in self.placed.items()
                   if (rank := path_rank(p)) is not None and limit is not None and rank > limit}
        if not blocked:
            return None
        fix = "unset NCCL_NET_GDR_LEVEL (NCCL's default allows PIX and PXB)"
        if any((path_rank(p) or 0) > (path_rank("PXB") or 0) for p in blocked.values()):
            fix += "; a GPU farther than PXB from its NIC needs a better placement"
        return (f"NCCL_NET_GDR_LEVEL={_shown(self.s.net_gdr_level)} allows GPUDirect RDMA up to "
                f"{level} only; over a farther path: "
                f"{_names(f'{g} ({p})' for g, p in sorted(blocked.items()))}", fix)

    # -- transports between the GPUs of this node --

    def p2p_disabled(self) -> tuple[str, str] | None:
        said = []
        if nccl_int(self.s.p2p_disable) == 1:
            said.append(f"NCCL_P2P_DISABLE={_shown(self.s.p2p_disable)}")
        elif self.s.p2p_level and path_level(self.s.p2p_level) == "LOC":
            said.append(f"NCCL_P2P_LEVEL={_shown(self.s.p2p_level)}")
        if not said:
            return None
        return (f"{said[0]} with {len(self.gpus)} of the job's GPUs on this node: they copy "
                "through host memory instead of NVLink or PCIe peer-to-peer",
                f"unset {said[0].partition('=')[0]}")

    def shm_disabled(self) -> tuple[str, str] | None:
        if nccl_int(self.s.shm_disable) != 1:
            return None
        return (f"NCCL_SHM_DISABLE={_shown(self.s.shm_disable)} with {len(self.gpus)} of the "
                "job's GPUs on this node: where P2P is not possible their traffic goes over "
                "the network", "unset NCCL_SHM_DISABLE")

    # -- rails and placement --

    def single_qp_multi_rail(self) -> tuple[str, str] | None:
        # On InfiniBand the fabric spreads a flow itself (NCCL turns adaptive routing on), and
        # a net plugin (EFA, an IBext) has its own idea of queue pairs: RoCE over NCCL's IB
        # transport is where one QP per connection pins a flow to one ECMP path.
        qps = nccl_int(self.s.ib_qps_per_connection)
        net = (self.log.net if self.log is not None else "").lower()
        if len(self.roce) < 2 or net not in ("", "ib") \
                or (qps if qps is not None else DEFAULT_QPS) > 1:
            return None
        said = (f"NCCL_IB_QPS_PER_CONNECTION={_shown(self.s.ib_qps_per_connection)}"
                if qps is not None else "NCCL_IB_QPS_PER_CONNECTION unset (NCCL's default 1)")
        return (f"{said} with {len(self.roce)} ACTIVE RoCE rails "
                f"({_names(p.name for p in self.roce)}): one flow per connection and rail",
                "set NCCL_IB_QPS_PER_CONNECTION=4 and NCCL_IB_SPLIT_DATA_ON_QPS=1 to spread "
                "each connection over more paths")

    def gpu_nic_cross_socket(self) -> tuple[str, str] | None:
        far = sorted(g for g, p in self.placed.items() if p == "SYS")
        if not far:
            return None
        return (f"GPUs whose nearest RDMA NIC is across sockets (SYS): {_names(far)}",
                "run the job on GPUs that share a socket with a NIC, or move the NICs "
                "(nvidia-smi topo -m shows the placement)")


def _gid_problem(gid: Gid | None) -> str:
    """'' for a GID RoCE v2 can route over, else what is wrong with it."""
    if gid is None:
        return "unused (no address)"
    if gid.type != ROCE_V2:
        return f"{_shown(gid.type) or 'of unknown type'} ({gid.address})"
    if gid.link_local:
        return f"RoCE v2 but link-local ({gid.address})"
    return ""


def _gid_summary(chosen: Mapping[str, tuple[int, str]]) -> str:
    items = [f"{name} GID {index} is {problem or 'RoCE v2 with an address'}"
             for name, (index, problem) in chosen.items()]
    return _names(items, sep="; ")


def _gid_int(gid: Gid | None) -> int:
    if gid is None:
        return 0
    try:
        return int(ipaddress.IPv6Address(gid.address))
    except ValueError:
        return 0


def _is6(gid: Gid | None) -> bool:
    """NCCL's family of a GID: IPv4-mapped (also ff0e::ffff:...) is AF_INET, all else INET6."""
    value = _gid_int(gid)
    return not (value >> 32 == 0xFFFF or value >> 32 == 0xFF0E << 80 | 0xFFFF)


def _routable(gid: Gid | None) -> bool:
    """NCCL's `validGid`: configured (not zero, not a bare fe80::) and not link-local."""
    value = _gid_int(gid)
    return value != 0 and value >> 64 != 0xFE80 << 48


def _roce_version(gid: Gid | None) -> int:
    kind = gid.type if gid else ""
    if kind.startswith(("IB/RoCE v1", "RoCE v1")):
        return 1
    return 2 if kind.startswith("RoCE v2") else -1


def _address_range(text: str, family6: bool) -> tuple[int, int] | None:
    """NCCL_IB_ADDR_RANGE as (network, mask) over the GID's address bits; None when NCCL
    ignores it (unset, no '/', unparsable, or a mask too long)."""
    address, slash, bits = text[:128].partition("/")
    if not slash:
        return None
    try:
        base = int(ipaddress.IPv6Address(address) if family6 else ipaddress.IPv4Address(address))
    except ValueError:
        return None
    length = nccl_int(bits) or 0
    width = 128 if family6 else 32
    if not 0 <= length <= width:
        return None
    mask = ((1 << length) - 1) << (width - length)
    return base & mask, mask


def _in_range(gid: Gid, network: tuple[int, int] | None) -> bool:
    if network is None:
        return True
    value, (base, mask) = _gid_int(gid), network
    return (value & mask) == base if mask >> 32 else (value & 0xFFFFFFFF & mask) == base


def _version(text: str) -> tuple[int, int] | None:
    match = _VERSION.match(text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _rails(ports: Iterable[RdmaPort]) -> str:
    return ",".join(p.name for p in sorted(ports, key=lambda p: (p.device, p.port)))


def _shown(value: str, limit: int = 64) -> str:
    """An environment value fit for one line of evidence: printable, bounded."""
    value = _UNPRINTABLE.sub("?", value)
    return value if len(value) <= limit else value[:limit] + "..."


def _names(items: Iterable[str], sep: str = ", ") -> str:
    items = list(items)
    shown = [_shown(i, 96) for i in items[:MAX_NAMES]]
    more = f" (+{len(items) - MAX_NAMES} more)" if len(items) > MAX_NAMES else ""
    return sep.join(shown) + more


def _line(text: str) -> str:
    text = _UNPRINTABLE.sub(" ", text)
    return text if len(text) <= MAX_EVIDENCE else text[:MAX_EVIDENCE - 3] + "..."
