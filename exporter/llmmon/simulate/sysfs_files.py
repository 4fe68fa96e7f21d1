"""The sysfs tree of a simulated node: the PCIe topology, /sys/class/infiniband and /sys/class/net.

Devices live under `devices/pci0000:<rc>/...` as on real hardware, and `bus/pci/devices`,
`class/infiniband` and `class/net` are relative symlinks into it, so the topology collector
classifies each GPU-NIC pair from the real path (PIX within a switch, NODE across switches
of a socket, SYS across sockets).  Port counters follow the kernel ABI: `port_xmit_data` and
`port_rcv_data` count 4-byte words, hw_counters are mlx5's q-counters.
"""

from __future__ import annotations

from llmmon.simulate.conditions import Counters, PortCondition
from llmmon.simulate.hardware import Nic, NodeLayout
from llmmon.simulate.filewriter import Tree

NVIDIA, MELLANOX = "0x10de", "0x15b3"
GPU_CLASS, ETHERNET_CLASS, BRIDGE_CLASS = "0x030200", "0x020000", "0x060400"
H200_DEVICE, CX7_DEVICE = "0x2335", "0x1021"
MTU_ROCE, MTU_TCP = 4200, 1500
SPEED_MBIT = 400_000
RATE = "400 Gb/sec (4X NDR)"
PACKET_BYTES = 4096  # RoCE payload per packet at MTU 4200
COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
    "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards", "port_xmit_packets",
    "port_xmit_wait", "symbol_error", "unicast_rcv_packets", "unicast_xmit_packets",
)
HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "local_ack_timeout_err", "np_cnp_sent",
    "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence", "packet_seq_err",
    "req_cqe_error", "req_cqe_flush_error", "req_remote_access_errors",
    "req_remote_invalid_request", "req_rnr_retries_exceeded", "req_transport_retries_exceeded",
    "resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error",
    "resp_remote_access_errors", "rnr_nak_retry_err", "roce_adp_retrans", "roce_adp_retrans_to",
    "roce_slow_restart", "roce_slow_restart_cnps", "roce_slow_restart_trans", "rp_cnp_handled",
    "rp_cnp_ignored", "rx_atomic_requests", "rx_dct_connect", "rx_icrc_encapsulated",
    "rx_read_requests", "rx_write_requests",
)
NETDEV_COUNTERS = ("carrier_changes",)
GID_TABLE = 16  # entries of a port's GID table written (mlx5 has 255; the rest are unused)


def _pci_function(tree: Tree, path: str, vendor: str, klass: str, device: str, numa: int,
                  driver: str) -> None:
    for name, value in (("vendor", vendor), ("class", klass), ("device", device),
                        ("numa_node", str(numa))):
        tree.write(f"{path}/{name}", value + "\n")
    tree.link(f"{path}/driver", f"bus/pci/drivers/{driver}")
    tree.link(f"bus/pci/devices/{path.rsplit('/', 1)[1]}", path)


def nic_path(nic: Nic) -> str:
    root_port, upstream = nic.switch.chain
    return (f"devices/pci0000:{nic.switch.root_bus:02x}/{root_port}/{upstream}/"
            f"{nic.switch.downstream(nic.slot)}/{nic.address}")


def port_dir(nic: Nic) -> str:
    return f"class/infiniband/{nic.device}/ports/1"


def build(tree: Tree, layout: NodeLayout) -> None:
    """Everything that does not change while the node runs."""
    for switch in layout.switches:
        root_port, upstream = switch.chain
        base = f"devices/pci0000:{switch.root_bus:02x}/{root_port}"
        _pci_function(tree, base, "0x8086", BRIDGE_CLASS, "0x1bbc", switch.numa, "pcieport")
        _pci_function(tree, f"{base}/{upstream}", "0x1000", BRIDGE_CLASS, "0xc030",
                      switch.numa, "pcieport")
        for slot in range(4):
            _pci_function(tree, f"{base}/{upstream}/{switch.downstream(slot)}", "0x1000",
                          BRIDGE_CLASS, "0xc030", switch.numa, "pcieport")
    for gpu in layout.gpus:
        root_port, upstream = gpu.switch.chain
        _pci_function(tree, f"devices/pci0000:{gpu.switch.root_bus:02x}/{root_port}/{upstream}/"
                      f"{gpu.switch.downstream(gpu.slot)}/{gpu.address}", NVIDIA, GPU_CLASS,
                      H200_DEVICE, gpu.switch.numa, "nvidia")
    for nic in layout.nics:
        path = nic_path(nic)
        _pci_function(tree, path, MELLANOX, ETHERNET_CLASS, CX7_DEVICE, nic.switch.numa,
                      "mlx5_core")
        ib = f"{path}/infiniband/{nic.device}"
        for name, value in (("hca_type", "MT4129"), ("fw_ver", "28.39.1002"),
                            ("board_id", "MT_0000000838"), ("node_type", "1: CA")):
            tree.write(f"{ib}/{name}", value + "\n")
        tree.link(f"{ib}/device", path)
        tree.link(f"class/infiniband/{nic.device}", ib)
        port = f"{ib}/ports/1"
        for name, value in (("link_layer", "Ethernet"), ("rate", RATE), ("lid", "0x0"),
                            ("sm_lid", "0x0"), ("gid_attrs/ndevs/0", nic.netdev)):
            tree.write(f"{port}/{name}", value + "\n")
        tree.write(f"{port}/hw_counters/lifespan", "10\n")
        _gid_table(tree, port, nic)
        net = f"{path}/net/{nic.netdev}"
        tree.write(f"{net}/mtu", f"{MTU_ROCE}\n")
        tree.link(f"{net}/device", path)
        tree.link(f"class/net/{nic.netdev}", net)
    management = "devices/pci0000:00/0000:00:1c.0/0000:02:00.0"
    _pci_function(tree, management, "0x8086", ETHERNET_CLASS, "0x1533", 0, "igb")
    net = f"{management}/net/{layout.management_netdev}"
    for name, value in (("mtu", MTU_TCP), ("operstate", "up"), ("speed", 100_000),
                        ("carrier_changes", 1)):
        tree.write(f"{net}/{name}", f"{value}\n")
    tree.link(f"{net}/device", management)
    tree.link(f"class/net/{layout.management_netdev}", net)
    tree.write("devices/virtual/net/lo/operstate", "unknown\n")
    tree.link("class/net/lo", "devices/virtual/net/lo")
    tree.write("module/nvidia/initstate", "live\n")


def _gid_table(tree: Tree, port: str, nic: Nic) -> None:
    """A RoCE port's GIDs as mlx5 fills them: the link-local address as RoCE v1 (0) and v2
    (1), the interface's IPv4 address as v1 (2) and v2 (3); the rest of the table unused
    (all zeros, and no type: the kernel answers EINVAL)."""
    mac = f"{nic.bus:02x}"
    link_local = f"fe80:0000:0000:0000:0a5c:2bff:fe00:00{mac}"
    ipv4 = f"0000:0000:0000:0000:0000:ffff:0a01:{nic.index + 1:04x}"
    for index, (gid, kind) in enumerate(((link_local, "IB/RoCE v1"), (link_local, "RoCE v2"),
                                          (ipv4, "IB/RoCE v1"), (ipv4, "RoCE v2"))):
        tree.write(f"{port}/gids/{index}", gid + "\n")
        tree.write(f"{port}/gid_attrs/types/{index}", kind + "\n")
        tree.write(f"{port}/gid_attrs/ndevs/{index}", nic.netdev + "\n")
    for index in range(4, GID_TABLE):
        tree.write(f"{port}/gids/{index}", ":".join(["0000"] * 8) + "\n")


def update(tree: Tree, layout: NodeLayout, ports: list[PortCondition], counters: Counters,
           seconds: float, gpudirect: bool, unbound: frozenset[int] = frozenset()) -> None:
    """Advance every port's counters by `seconds` under `ports` and write what moved; an
    `unbound` NIC has no RDMA device (its driver did not bind), as long as it stays so."""
    for nic in layout.nics:
        if nic.index in unbound:
            tree.remove(f"class/infiniband/{nic.device}")
        else:
            tree.link(f"class/infiniband/{nic.device}", f"{nic_path(nic)}/infiniband/{nic.device}")
    for nic, cond in zip(layout.nics, ports):
        key = f"{nic.device}/"
        counters.advance(key + "port_xmit_data", cond.tx_bytes / 4, seconds)
        counters.advance(key + "port_rcv_data", cond.rx_bytes / 4, seconds)
        for direction, rate in (("xmit", cond.tx_bytes), ("rcv", cond.rx_bytes)):
            counters.advance(f"{key}port_{direction}_packets", rate / PACKET_BYTES, seconds)
            counters.advance(f"{key}unicast_{direction}_packets", rate / PACKET_BYTES, seconds)
        for name in COUNTERS + HW_COUNTERS + NETDEV_COUNTERS:
            counters.advance(key + name, cond.rates.get(name, 0.0), seconds)
            counters.bump(key + name, cond.events.get(name, 0))
        path = nic_path(nic)
        port = f"{path}/infiniband/{nic.device}/ports/1"
        tree.write(f"{port}/state", "4: ACTIVE\n" if cond.up else "1: DOWN\n")
        tree.write(f"{port}/phys_state", "5: LinkUp\n" if cond.up else "2: Polling\n")
        for name in COUNTERS:
            tree.write(f"{port}/counters/{name}", f"{counters[key + name]}\n")
        for name in HW_COUNTERS:
            tree.write(f"{port}/hw_counters/{name}", f"{counters[key + name]}\n")
        net = f"{path}/net/{nic.netdev}"
        tree.write(f"{net}/operstate", "up\n" if cond.up else "down\n")
        tree.write(f"{net}/speed", f"{SPEED_MBIT if cond.up else -1}\n")
        tree.write(f"{net}/carrier_changes", f"{1 + counters[key + 'carrier_changes']}\n")
    if gpudirect:
        tree.write("module/nvidia_peermem/initstate", "live\n")
        tree.write("module/nvidia_peermem/refcnt", "0\n")
    else:
        tree.remove_dir("module/nvidia_peermem")
