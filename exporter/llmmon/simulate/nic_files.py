"""`ethtool -S` dumps of the simulated ConnectX-7 netdevs and an `ip -s -s -j link show` dump.

The dump carries mlx5's names (kernel `en_stats.c`): per-priority traffic for all eight
priorities, PFC pause counters for priority 3 only (the lossless RoCE class: mlx5 prints
pause counters just for PFC-enabled priorities), pause-storm watermark events, PHY and PCIe
back-pressure counters, and a few of the ~700 others that no rule maps.  RDMA bypasses the
kernel, so the netdev's own byte counters (and the link dump) only see TCP: the management
netdev carries it, the RoCE netdevs a trickle.
"""

from __future__ import annotations

import json

from llmmon.simulate.conditions import Counters, NodeCondition, PortCondition
from llmmon.simulate.hardware import NodeLayout
from llmmon.simulate.sysfs_files import MTU_ROCE, MTU_TCP, PACKET_BYTES

HEADER = "NIC statistics:"
LOSSLESS = 3
PAUSE_FRAMES_PER_SECOND = 24_000  # a fully paused 400G port re-sends pause this often
LINE_BITS = 400e9
KERNEL_BYTES = 20e3  # TCP through a RoCE netdev (ARP, LLDP, monitoring)
# Statistics no mapping rule reads, as mlx5 prints them among the mapped ones.
UNMAPPED = ("rx_csum_complete", "rx_csum_unnecessary", "tx_csum_partial", "tx_queue_stopped",
            "tx_queue_wake", "ch_events", "ch_poll", "rx_wqe_err", "tx_timeout")


def _rates(cond: PortCondition) -> dict[str, float]:
    """Per-second rates of the dump's counters under `cond`."""
    rates: dict[str, float] = {
        "rx_packets": KERNEL_BYTES / 800, "rx_bytes": KERNEL_BYTES,
        "tx_packets": KERNEL_BYTES / 800, "tx_bytes": KERNEL_BYTES,
        "rx_bits_phy": LINE_BITS if cond.up else 0.0,
        "rx_corrected_bits_phy": 4000.0 if cond.up else 0.0,
        "rx_csum_complete": KERNEL_BYTES / 800, "ch_events": 300.0, "ch_poll": 310.0,
    }
    for direction, rdma in (("rx", cond.rx_bytes), ("tx", cond.tx_bytes)):
        rates[f"{direction}_prio{LOSSLESS}_bytes"] = rdma
        rates[f"{direction}_prio{LOSSLESS}_packets"] = rdma / PACKET_BYTES
        rates[f"{direction}_prio0_bytes"] = KERNEL_BYTES
        rates[f"{direction}_prio0_packets"] = KERNEL_BYTES / 800
    for direction, fraction in (("rx", cond.rx_pause), ("tx", cond.tx_pause)):
        rates[f"{direction}_prio{LOSSLESS}_pause"] = fraction * PAUSE_FRAMES_PER_SECOND
        rates[f"{direction}_prio{LOSSLESS}_pause_duration"] = fraction * 1e6
        rates[f"{direction}_pause_ctrl_phy"] = fraction * PAUSE_FRAMES_PER_SECOND
    rates[f"rx_prio{LOSSLESS}_pause_transition"] = cond.rx_pause * 50
    rates["outbound_pci_stalled_rd_events"] = 1.0 if cond.pcie_stalled > 0.3 else 0.0
    for name, rate in cond.rates.items():
        rates[name] = rates.get(name, 0.0) + rate
    return rates


def dump(netdev: str, cond: PortCondition, counters: Counters, seconds: float) -> str:
    key = f"eth/{netdev}/"
    counters.advance_all(key, _rates(cond), seconds)
    for name, count in cond.events.items():
        counters.bump(key + name, count)
    names = ["rx_packets", "rx_bytes", "tx_packets", "tx_bytes", *UNMAPPED[:4]]
    for priority in range(8):
        names += [f"rx_prio{priority}_bytes", f"rx_prio{priority}_packets",
                  f"rx_prio{priority}_discards", f"tx_prio{priority}_bytes",
                  f"tx_prio{priority}_packets"]
        if priority == LOSSLESS:
            names += [f"rx_prio{priority}_pause", f"rx_prio{priority}_pause_duration",
                      f"rx_prio{priority}_pause_transition", f"tx_prio{priority}_pause",
                      f"tx_prio{priority}_pause_duration"]
    names += ["rx_pause_ctrl_phy", "tx_pause_ctrl_phy", "tx_pause_storm_warning_events",
              "tx_pause_storm_error_events", "rx_discards_phy", "tx_discards_phy",
              "rx_out_of_buffer", "rx_buffer_passed_thres_phy", "outbound_pci_buffer_overflow",
              "outbound_pci_stalled_rd", "outbound_pci_stalled_wr",
              "outbound_pci_stalled_rd_events", "outbound_pci_stalled_wr_events",
              "link_down_events_phy", "rx_crc_errors_phy", "rx_symbol_err_phy",
              "rx_corrected_bits_phy", "rx_bits_phy", "rx_pcs_symbol_err_phy", *UNMAPPED[4:]]
    gauges = {"outbound_pci_stalled_rd": round(cond.pcie_stalled * 100),
              "outbound_pci_stalled_wr": round(cond.pcie_stalled * 30)}
    lines = [HEADER] + [f"     {name}: {gauges.get(name, counters[key + name])}"
                        for name in names]
    return "\n".join(lines) + "\n"


def _link(index: int, name: str, mtu: int, up: bool, counters: Counters, key: str) -> dict:
    return {
        "ifindex": index, "ifname": name, "mtu": mtu, "operstate": "UP" if up else "DOWN",
        "flags": ["BROADCAST", "MULTICAST", "UP"] + (["LOWER_UP"] if up else []),
        "link_type": "ether",
        "stats64": {
            "rx": {"bytes": counters[key + "rx_bytes"], "packets": counters[key + "rx_packets"],
                   "errors": 0, "dropped": 0, "over_errors": 0, "multicast": 0,
                   "missed_errors": 0},
            "tx": {"bytes": counters[key + "tx_bytes"], "packets": counters[key + "tx_packets"],
                   "errors": 0, "dropped": 0, "carrier_errors": 0, "collisions": 0}}}


def link_dump(layout: NodeLayout, node: NodeCondition, counters: Counters,
              seconds: float) -> str:
    """`ip -s -s -j link show`: lo, the management netdev and the RoCE netdevs.  Call after
    `dump` advanced the RoCE netdevs' kernel counters this tick."""
    management = f"eth/{layout.management_netdev}/"
    counters.advance_all(management, {"rx_bytes": node.tcp_bytes, "tx_bytes": node.tcp_bytes,
                                      "rx_packets": node.tcp_bytes / 1400,
                                      "tx_packets": node.tcp_bytes / 1400}, seconds)
    links = [_link(1, "lo", 65536, True, counters, "eth/lo/"),
             _link(2, layout.management_netdev, MTU_TCP, True, counters, management)]
    links += [_link(3 + nic.index, nic.netdev, MTU_ROCE, cond.up, counters, f"eth/{nic.netdev}/")
              for nic, cond in zip(layout.nics, node.ports)]
    return json.dumps(links, indent=1) + "\n"
