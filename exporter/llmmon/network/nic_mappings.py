"""Which driver statistics (`ethtool -S` names) feed which llmmon_nic_* family, per driver.

Each rule is a regular expression matched against the whole stat name (trailing spaces
stripped); its named groups become labels, `labels` adds fixed ones, and the value is divided
by `divisor` (microseconds, percentages and bits to base units).
The table is chosen by the netdev's driver; drivers without a table use mlx5's.  Statistics no
rule maps are exported only through the nic collector's `extra_stats` allow-list.

Names come from the drivers' ethtool string tables: mlx5 `en_stats.c` (documented in the
kernel's mlx5 `counters.rst`), ice `ice_ethtool.c`, bnxt_en `bnxt_ethtool.c`.  mlx5 emits
per-priority pause counters only for priorities with PFC enabled; ice and bnxt_en emit all
eight, so there a missing series never means "PFC off".
"""

from __future__ import annotations

from typing import NamedTuple

US = 1e6  # microseconds per second
PERCENT = 100
BITS = 8  # per byte


class Rule(NamedTuple):
    pattern: str
    metric: str
    labels: tuple[tuple[str, str], ...] = ()
    divisor: float = 1


PFC_FRAMES = "llmmon_nic_pfc_pause_frames_total"
PFC_SECONDS = "llmmon_nic_pfc_pause_seconds_total"
PFC_TRANSITIONS = "llmmon_nic_pfc_pause_transitions_total"
GLOBAL_FRAMES = "llmmon_nic_global_pause_frames_total"
GLOBAL_SECONDS = "llmmon_nic_global_pause_seconds_total"
CONTROL_FRAMES = "llmmon_nic_pause_control_frames_total"
STORMS = "llmmon_nic_pause_storm_events_total"
PRIO_BYTES = "llmmon_nic_priority_bytes_total"
PRIO_PACKETS = "llmmon_nic_priority_packets_total"
PRIO_DISCARDS = "llmmon_nic_priority_discards_total"
PRIO_ECN = "llmmon_nic_priority_ecn_marked_packets_total"
RX_DISCARDS = "llmmon_nic_receive_discards_total"
TX_DISCARDS = "llmmon_nic_transmit_discards_total"
OUT_OF_BUFFER = "llmmon_nic_receive_out_of_buffer_total"
BUFFER_THRESHOLD = "llmmon_nic_receive_buffer_threshold_events_total"
PCIE_STALLED = "llmmon_nic_pcie_outbound_stalled_ratio"
PCIE_STALLED_SECONDS = "llmmon_nic_pcie_outbound_stalled_seconds_total"
PCIE_OVERFLOW = "llmmon_nic_pcie_overflow_drops_total"
LINK_DOWN = "llmmon_nic_link_down_events_total"
CRC_ERRORS = "llmmon_nic_receive_crc_errors_total"
SYMBOL_ERRORS = "llmmon_nic_receive_symbol_errors_total"
CORRECTED_BIT_ERRORS = "llmmon_nic_phy_corrected_bit_errors_total"
RECEIVED_BYTES = "llmmon_nic_phy_received_bytes_total"
UNCORRECTED_SYMBOLS = "llmmon_nic_phy_uncorrected_symbol_errors_total"

P = r"(?P<priority>[0-7])"
DIR = r"(?P<direction>rx|tx)"

MLX5: tuple[Rule, ...] = (
    Rule(rf"{DIR}_prio{P}_pause", PFC_FRAMES),
    Rule(rf"{DIR}_prio{P}_pause_duration", PFC_SECONDS, divisor=US),
    Rule(rf"{DIR}_prio{P}_pause_transition", PFC_TRANSITIONS),
    Rule(rf"{DIR}_global_pause", GLOBAL_FRAMES),
    Rule(rf"{DIR}_global_pause_duration", GLOBAL_SECONDS, divisor=US),
    Rule(rf"{DIR}_pause_ctrl_phy", CONTROL_FRAMES),
    Rule(r"tx_pause_storm_(?P<severity>warning|error)_events", STORMS),
    Rule(rf"{DIR}_prio{P}_bytes", PRIO_BYTES),
    Rule(rf"{DIR}_prio{P}_packets", PRIO_PACKETS),
    Rule(rf"rx_prio{P}_discards", PRIO_DISCARDS, (("reason", "no_buffer"),)),
    Rule(rf"rx_prio{P}_buf_discard", PRIO_DISCARDS, (("reason", "host_buffer"),)),
    Rule(rf"rx_prio{P}_cong_discard", PRIO_DISCARDS, (("reason", "host_congestion"),)),
    Rule(rf"rx_prio{P}_marked", PRIO_ECN),
    Rule(r"rx_discards_phy", RX_DISCARDS),
    Rule(r"tx_discards_phy", TX_DISCARDS),
    Rule(r"rx_out_of_buffer", OUT_OF_BUFFER),
    Rule(r"rx_buffer_passed_thres_phy", BUFFER_THRESHOLD),
    Rule(r"outbound_pci_stalled_rd", PCIE_STALLED, (("op", "read"),), PERCENT),
    Rule(r"outbound_pci_stalled_wr", PCIE_STALLED, (("op", "write"),), PERCENT),
    Rule(r"outbound_pci_stalled_rd_events", PCIE_STALLED_SECONDS, (("op", "read"),)),
    Rule(r"outbound_pci_stalled_wr_events", PCIE_STALLED_SECONDS, (("op", "write"),)),
    Rule(r"outbound_pci_buffer_overflow", PCIE_OVERFLOW),
    Rule(r"link_down_events_phy", LINK_DOWN),
    Rule(r"rx_crc_errors_phy", CRC_ERRORS),
    Rule(r"rx_symbol_err_phy", SYMBOL_ERRORS),
    Rule(r"rx_corrected_bits_phy", CORRECTED_BIT_ERRORS),
    Rule(r"rx_bits_phy", RECEIVED_BYTES, divisor=BITS),
    Rule(r"rx_pcs_symbol_err_phy", UNCORRECTED_SYMBOLS),
)

ICE: tuple[Rule, ...] = (
    # In-tree names, and the out-of-tree driver's UNIFIED_STATS names.
    Rule(rf"{DIR}_priority_{P}_xoff\.nic", PFC_FRAMES),
    Rule(rf"port-{DIR}-xoff_prio-{P}_events", PFC_FRAMES),
    Rule(r"link_xoff_(?P<direction>rx|tx)\.nic", GLOBAL_FRAMES),
    Rule(r"rx_dropped\.nic", RX_DISCARDS),
    Rule(r"tx_dropped_link_down\.nic", TX_DISCARDS),
    Rule(r"rx_crc_errors\.nic", CRC_ERRORS),
)

BNXT_EN: tuple[Rule, ...] = (
    Rule(rf"{DIR}_pfc_ena_frames_pri{P}", PFC_FRAMES),
    Rule(rf"pfc_pri{P}_{DIR}_duration_us", PFC_SECONDS, divisor=US),
    Rule(rf"pfc_pri{P}_{DIR}_transitions", PFC_TRANSITIONS),
    Rule(rf"{DIR}_pause_frames", GLOBAL_FRAMES),
    Rule(rf"{DIR}_bytes_pri{P}", PRIO_BYTES),
    Rule(rf"{DIR}_packets_pri{P}", PRIO_PACKETS),
    Rule(r"rx_buffer_passed_threshold", BUFFER_THRESHOLD),
    Rule(r"link_down_events", LINK_DOWN),
    Rule(r"rx_fcs_err_frames", CRC_ERRORS),
    Rule(r"rx_corrected_bits", CORRECTED_BIT_ERRORS),
    Rule(r"rx_bits", RECEIVED_BYTES, divisor=BITS),
    Rule(r"rx_pcs_symbol_err", UNCORRECTED_SYMBOLS),
)

DEFAULT_DRIVER = "mlx5_core"
TABLES: dict[str, tuple[Rule, ...]] = {"mlx5_core": MLX5, "ice": ICE, "bnxt_en": BNXT_EN}
