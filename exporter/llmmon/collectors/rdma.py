"""RDMA ports from /sys/class/infiniband: identity, link state, traffic, the IB error counters
and the mlx5 `hw_counters` that show loss, retransmission and DCQCN congestion.

Devices excluded by the device regexes are never read: on restricted HGX PFs reading counters
fails and floods the kernel log.  A counter a card lacks is absent, not zero, and so is one
that reads `N/A (no PMA)` (iWARP, VFs).  One unreadable file, device or vanished device costs
only its own series.  Counters are exported raw: hw_counters q-counters are 32-bit and wrap,
IB PMA error counters saturate; `rate()` copes with both.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, NamedTuple

from prometheus_client.core import Metric

from llmmon.collector import Collector, Context, Environment
from llmmon.network.device_filter import DeviceFilter, filter_options
from llmmon.metrics import Families, MetricSpec
from llmmon.options import Option
from llmmon.sources import infiniband, pci
from llmmon.sources.fs import SourceError

PORT = ("device", "port")
ACTIVE, LINK_UP = 4, 5


def _counter(name: str, help_text: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, "counter", help_text, PORT + labels)


class Field(NamedTuple):
    """One sysfs counter file: the family it feeds, extra label values and a scale."""

    file: str
    spec: MetricSpec
    labels: tuple[str, ...] = ()
    scale: float = 1


INFO = MetricSpec(
    "llmmon_rdma_port_info", "info",
    "RDMA port identity; join on device and port. netdev is the RoCE/IPoIB interface.",
    PORT + ("netdev", "link_layer", "pci_bus_id", "numa_node", "hca_type", "firmware_version",
            "board_id"))
STATE = MetricSpec(
    "llmmon_rdma_port_state", "gauge",
    "Logical port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.", PORT)
PHYSICAL_STATE = MetricSpec(
    "llmmon_rdma_port_physical_state", "gauge",
    "Physical port state: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, "
    "5 LinkUp, 6 LinkErrorRecovery, 7 PhyTest.", PORT)
UP = MetricSpec(
    "llmmon_rdma_port_up", "gauge", "1 if the port is ACTIVE and its physical link LinkUp.",
    PORT)
RATE = MetricSpec(
    "llmmon_rdma_port_rate_bytes_per_second", "gauge",
    "Negotiated port rate (the `rate` file, e.g. 400 Gb/sec = 5e10 bytes/s).", PORT)
PCIE_LINK = {
    "current_link_speed": MetricSpec(
        "llmmon_rdma_device_pcie_link_generation", "gauge",
        "Current PCIe link generation of the RDMA device's PCI function (current_link_speed: "
        "2.5 GT/s = 1 ... 64 GT/s = 6); absent while the link speed is Unknown.", ("device",)),
    "max_link_speed": MetricSpec(
        "llmmon_rdma_device_pcie_link_max_generation", "gauge",
        "Maximum PCIe link generation of the device (max_link_speed).", ("device",)),
    "current_link_width": MetricSpec(
        "llmmon_rdma_device_pcie_link_width", "gauge",
        "Current PCIe link width in lanes (current_link_width).", ("device",)),
    "max_link_width": MetricSpec(
        "llmmon_rdma_device_pcie_link_max_width", "gauge",
        "Maximum PCIe link width (max_link_width); below it the link trained down.",
        ("device",)),
}
LIFESPAN = MetricSpec(
    "llmmon_rdma_hw_counters_lifespan_seconds", "gauge",
    "How long the kernel caches hw_counters reads (hw_counters/lifespan).", PORT)
OTHER = _counter(
    "llmmon_rdma_hw_counter_total",
    "Any other hw_counters file by its name; opt-in with extra_hw_counters.", "counter")
CQE_ERRORS = _counter(
    "llmmon_rdma_cqe_errors_total",
    "Work completions with error, by side (requester, responder) and kind (error; flush, "
    "normal when a QP is torn down).", "side", "kind")

COUNTERS: tuple[Field, ...] = (
    Field("port_xmit_data", _counter(
        "llmmon_rdma_transmit_bytes_total",
        "Bytes sent (port_xmit_data counts 4-byte words: x4). On mlx5 RoCE, RDMA traffic "
        "only."), scale=4),
    Field("port_rcv_data", _counter(
        "llmmon_rdma_receive_bytes_total",
        "Bytes received (port_rcv_data counts 4-byte words: x4)."), scale=4),
    Field("port_xmit_packets", _counter("llmmon_rdma_transmit_packets_total", "Packets sent.")),
    Field("port_rcv_packets", _counter(
        "llmmon_rdma_receive_packets_total", "Packets received.")),
    Field("port_xmit_wait", _counter(
        "llmmon_rdma_transmit_wait_ticks_total",
        "Ticks the port had data to send but no flow-control credits (InfiniBand "
        "congestion); 32-bit, saturates.")),
    Field("port_xmit_discards", _counter(
        "llmmon_rdma_transmit_discards_total",
        "Outbound packets discarded because the port was down or congested.")),
    Field("port_rcv_errors", _counter(
        "llmmon_rdma_receive_errors_total", "Received packets with errors.")),
    Field("port_rcv_remote_physical_errors", _counter(
        "llmmon_rdma_receive_remote_physical_errors_total",
        "Received packets marked bad by an upstream hop (EBP delimiter).")),
    Field("port_rcv_switch_relay_errors", _counter(
        "llmmon_rdma_receive_switch_relay_errors_total",
        "Received packets the port could not relay.")),
    Field("port_rcv_constraint_errors", _counter(
        "llmmon_rdma_receive_constraint_errors_total",
        "Received packets dropped by partition or raw-packet constraints.")),
    Field("port_xmit_constraint_errors", _counter(
        "llmmon_rdma_transmit_constraint_errors_total",
        "Outbound packets dropped by partition or raw-packet constraints.")),
    Field("symbol_error", _counter(
        "llmmon_rdma_symbol_errors_total",
        "Minor link errors on any lane (16-bit, saturates); a rising rate means a bad cable.")),
    Field("link_downed", _counter(
        "llmmon_rdma_link_downed_total",
        "Times the link went down after error recovery failed (8-bit, saturates).")),
    Field("link_error_recovery", _counter(
        "llmmon_rdma_link_error_recovery_total",
        "Times the link recovered from errors (a flap that stayed up).")),
    Field("local_link_integrity_errors", _counter(
        "llmmon_rdma_local_link_integrity_errors_total",
        "Times the local physical error threshold was exceeded (4-bit, saturates).")),
    Field("excessive_buffer_overrun_errors", _counter(
        "llmmon_rdma_excessive_buffer_overrun_errors_total",
        "Consecutive receive buffer overruns beyond the threshold.")),
    Field("VL15_dropped", _counter(
        "llmmon_rdma_vl15_dropped_total", "Subnet management packets dropped (VL15).")),
)
HW_COUNTERS: tuple[Field, ...] = (
    Field("out_of_sequence", _counter(
        "llmmon_rdma_out_of_sequence_total",
        "Responder saw a packet sequence gap: packets were lost upstream (the main RoCE "
        "loss signal).")),
    Field("packet_seq_err", _counter(
        "llmmon_rdma_packet_seq_errors_total",
        "Requester received a NAK for a sequence error and retransmitted.")),
    Field("local_ack_timeout_err", _counter(
        "llmmon_rdma_local_ack_timeouts_total",
        "QP ACK timer expired and the requester retransmitted (costly timeout retransmit).")),
    Field("implied_nak_seq_err", _counter(
        "llmmon_rdma_implied_nak_seq_errors_total",
        "Requester inferred a lost packet from a later ACK and retransmitted.")),
    Field("duplicate_request", _counter(
        "llmmon_rdma_duplicate_requests_total",
        "Responder received a retransmitted request it had already executed.")),
    Field("rnr_nak_retry_err", _counter(
        "llmmon_rdma_rnr_nak_retry_errors_total",
        "Receiver-not-ready NAKs: the peer posted receive buffers too slowly.")),
    Field("roce_adp_retrans", _counter(
        "llmmon_rdma_roce_adp_retransmits_total", "RoCE adaptive retransmissions.")),
    Field("roce_adp_retrans_to", _counter(
        "llmmon_rdma_roce_adp_retransmit_timeouts_total",
        "Timeouts that triggered RoCE adaptive retransmission.")),
    Field("req_cqe_error", CQE_ERRORS, ("requester", "error")),
    Field("req_cqe_flush_error", CQE_ERRORS, ("requester", "flush")),
    Field("resp_cqe_error", CQE_ERRORS, ("responder", "error")),
    Field("resp_cqe_flush_error", CQE_ERRORS, ("responder", "flush")),
    Field("req_transport_retries_exceeded", _counter(
        "llmmon_rdma_transport_retries_exceeded_total",
        "QPs that ran out of transport retries and went to error (NCCL 'retry exceeded').")),
    Field("req_rnr_retries_exceeded", _counter(
        "llmmon_rdma_rnr_retries_exceeded_total",
        "QPs that ran out of receiver-not-ready retries and went to error.")),
    Field("out_of_buffer", _counter(
        "llmmon_rdma_out_of_buffer_total",
        "Packets dropped because a QP had no receive WQE posted.")),
    Field("rx_icrc_encapsulated", _counter(
        "llmmon_rdma_icrc_errors_total",
        "RoCE packets received with a bad ICRC (corruption on the path).")),
    Field("np_cnp_sent", _counter(
        "llmmon_rdma_cnp_sent_total",
        "Congestion notification packets sent as notification point (receiver).")),
    Field("np_ecn_marked_roce_packets", _counter(
        "llmmon_rdma_ecn_marked_packets_total", "RoCE packets received with ECN CE marks.")),
    Field("rp_cnp_handled", _counter(
        "llmmon_rdma_cnp_handled_total",
        "CNPs handled as reaction point (sender slowed down by DCQCN).")),
    Field("rp_cnp_ignored", _counter(
        "llmmon_rdma_cnp_ignored_total",
        "CNPs ignored as reaction point: check that ECN/DCQCN is enabled on the adapter.")),
)
_HW_BY_FILE = {field.file: field for field in HW_COUNTERS}
# InfiniBand link-level counters (virtual lanes, subnet management, partitions, credit waits,
# the IB PHY's integrity thresholds). A RoCE port (link_layer Ethernet) keeps them at zero:
# its PHY errors are in ethtool's counters (the nic collector). Not read on Ethernet ports.
IB_LINK_ONLY = frozenset({
    "VL15_dropped", "port_rcv_switch_relay_errors", "port_rcv_constraint_errors",
    "port_xmit_constraint_errors", "port_rcv_remote_physical_errors",
    "local_link_integrity_errors", "excessive_buffer_overrun_errors", "port_xmit_wait"})


class RdmaCollector(Collector):
    name = "rdma"
    description = ("RDMA ports (InfiniBand and RoCE) from /sys/class/infiniband: state, rate, "
                   "traffic, error, retransmit and congestion counters.")
    specs = (INFO, STATE, PHYSICAL_STATE, UP, RATE, *PCIE_LINK.values(), LIFESPAN) + tuple(
        dict.fromkeys(f.spec for f in COUNTERS + HW_COUNTERS)) + (OTHER,)
    options = filter_options(
        "RDMA devices", exclude_help="RDMA devices to skip without reading any of their files "
        "(e.g. restricted HGX PFs whose counter reads flood the kernel log).") + (
        Option("extra_hw_counters", "regex", "",
               "hw_counters files without a dedicated metric to export as "
               "llmmon_rdma_hw_counter_total{counter} (empty: none, '.*': all)."),
    )
    roots = ("sysfs",)
    interval = 5.0
    timeout = 3.0

    def __init__(self, env: Environment, config: dict[str, Any]) -> None:
        super().__init__(env, config)
        self.wanted = DeviceFilter(config["device_include"], config["device_exclude"])
        self._extra = (re.compile(config["extra_hw_counters"])
                       if config["extra_hw_counters"] else None)

    def collect(self, ctx: Context) -> Iterable[Metric]:
        families = Families()
        watched = 0
        for device in infiniband.devices(self.env.sysfs):
            if not self.wanted(device):
                continue
            try:
                watched += self._device(ctx, families, device)
            except SourceError as exc:
                ctx.error(device, f"{device}: {exc}")
        ctx.watching(watched, "RDMA ports")
        return families

    def _device(self, ctx: Context, families: Families, device: str) -> int:
        sysfs = self.env.sysfs
        if not sysfs.exists(infiniband.CLASS, device, "ports"):
            ctx.error(device, f"{device}: vanished, or has no ports directory")
            return 0
        # irdma and bnxt_re have no board_id or hca_type: those labels are ''.
        hca_type, firmware, board = (self._optional(infiniband.CLASS, device, attr)
                                     for attr in ("hca_type", "fw_ver", "board_id"))
        where = pci.locate(sysfs, infiniband.CLASS, device, "device")
        address = where.address if where else ""
        numa = str(pci.numa_node(sysfs, infiniband.CLASS, device, "device")) if where else ""
        if where:
            self._pcie_link(ctx, families, device)
        ports = infiniband.ports(sysfs, device)
        for port in ports:
            labels = (device, port)
            link_layer = self._optional(infiniband.CLASS, device, "ports", port, "link_layer")
            families.add(INFO, labels + (
                infiniband.port_netdev(sysfs, device, port), link_layer, address, numa,
                hca_type, firmware, board), 1)
            self._port(ctx, families, labels, ethernet=link_layer == "Ethernet")
        return len(ports)

    def _pcie_link(self, ctx: Context, families: Families, device: str) -> None:
        try:
            values = pci.link(self.env.sysfs, infiniband.CLASS, device, "device")
        except SourceError as exc:
            ctx.error(f"{device}/pcie_link", str(exc))
            return
        for name, value in values.items():
            families.add(PCIE_LINK[name], (device,), value)

    def _port(self, ctx: Context, families: Families, labels: tuple[str, str],
              ethernet: bool) -> None:
        device, port = labels
        base = (infiniband.CLASS, device, "ports", port)
        state = self._read(ctx, infiniband.parse_state, *base, "state")
        physical = self._read(ctx, infiniband.parse_state, *base, "phys_state")
        for spec, value in ((STATE, state), (PHYSICAL_STATE, physical)):
            if value is not None:
                families.add(spec, labels, value)
        if state is not None and physical is not None:
            families.add(UP, labels, int(state == ACTIVE and physical == LINK_UP))
        rate = self._read(ctx, infiniband.parse_rate, *base, "rate")
        if rate is not None:
            families.add(RATE, labels, rate)

        present = set(self.env.sysfs.listdir(*base, "counters"))  # bnxt_re has none
        for field in COUNTERS:
            if field.file in present and not (ethernet and field.file in IB_LINK_ONLY):
                self._add(ctx, families, field, labels, *base, "counters")
        for file in self.env.sysfs.listdir(*base, "hw_counters"):
            field = _HW_BY_FILE.get(file)
            if file == "lifespan":
                field = Field(file, LIFESPAN, scale=0.001)  # milliseconds
            elif field is None and self._extra and self._extra.search(file):
                field = Field(file, OTHER, (file,))
            if field is not None:
                self._add(ctx, families, field, labels, *base, "hw_counters")

    def _add(self, ctx: Context, families: Families, field: Field, labels: tuple[str, str],
             *directory: str) -> None:
        value = self._read(ctx, infiniband.parse_counter, *directory, field.file)
        if value is not None:
            families.add(field.spec, labels + field.labels, value * field.scale)

    def _read(self, ctx: Context, parse: Callable[[str], float | None],
              *parts: str) -> float | None:
        """A parsed sysfs value, or None (absent) with the problem counted under its path."""
        try:
            return parse(self.env.sysfs.read_value(*parts))
        except SourceError as exc:
            ctx.error("/".join(parts[1:]), str(exc))
        except ValueError as exc:
            ctx.error("/".join(parts[1:]), f"{self.env.sysfs.path(*parts)}: {exc}")
        return None

    def _optional(self, *parts: str) -> str:
        """An attribute some devices lack: '' then, and no error."""
        try:
            return self.env.sysfs.read_value(*parts)
        except SourceError:
            return ""
