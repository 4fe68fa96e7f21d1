"""The alert thresholds the diagnosis judges by: the same numbers as alerts/config.yaml.

The rules and `llmmon diagnose` must agree on what is wrong, so every threshold here carries the
name and default of its alerts/config.yaml entry (a test fails when they drift apart; the reasons
for each value are written there).  A site that tunes its config passes the same file to
`llmmon diagnose --alerts-config`.  The exporter image ships without alerts/, hence the copy.
"""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import dataclass
from typing import Any

import yaml


class ThresholdsError(ValueError):
    """An alerts config file that cannot be used, with the reason."""


@dataclass(frozen=True)
class Thresholds:
    runbook_base_url: str = "https://github.com/llmmon/llmmon/blob/main/docs/runbooks.md"
    # precision
    reduction_collectives: str = ".*(all_?reduce|reduce_scatter).*"
    fp16_share: float = 0.5
    loss_nonfinite_window: str = "5m"
    # memory
    oom_window: str = "5m"
    oom_risk_retries_window: str = "15m"
    oom_risk_reserved_ratio: float = 0.95
    fragmentation_ratio: float = 0.3
    fragmentation_reserved_ratio: float = 0.75
    # starvation
    mfu_low: float = 0.3
    starvation_low_power_fraction: float = 0.2
    starvation_dips_per_minute: float = 6
    disk_read_latency_seconds: float = 0.05
    disk_min_reads_per_second: float = 10
    # hang
    hang_window_seconds: float = 180
    hang_busy_seconds: float = 10
    xid_critical: tuple[int, ...] = (48, 62, 64, 74, 79, 95, 119, 120)
    xid_window: str = "10m"
    ecc_window: str = "10m"
    rdma_loss_events_per_second: float = 0.01
    rdma_port_selector: str = ""
    link_flap_window: str = "15m"
    link_flap_downs: float = 1
    link_flap_carrier_changes: float = 2
    # thermal
    thermal_sw_fraction: float = 0.1
    power_peer_ratio: float = 0.7
    power_busy_utilization: float = 0.5
    # network
    rdma_idle_bytes_per_second: float = 1_000_000
    tcp_netdev_selector: str = 'netdev!~"lo|veth.*|docker.*|cali.*|cni.*|flannel.*|cilium.*"'
    tcp_busy_bytes_per_second: float = 10_000_000
    pfc_storm_window: str = "5m"
    pfc_tx_pause_ratio: float = 0.5
    pfc_rx_pause_ratio: float = 0.2
    rdma_cnp_per_second: float = 500
    straggler_collectives: str = ".*(all_?reduce|all_?gather|reduce_scatter).*"
    straggler_score: float = 0.3
    straggler_enqueue_lag_seconds: float = 0.01
    network_slow_factor: float = 2
    network_slow_retransmit_share: float = 0.01
    network_slow_rate_window: str = "1m"
    network_slow_inside_share: float = 0.7
    network_slow_outside_share: float = 0.25
    network_slow_inside_window: str = "2m"
    xid_action_window_seconds: float = 3600
    xid_paged_actions: tuple[str, ...] = ("reset_gpu", "reboot_node", "rma")
    pcie_busy_utilization: float = 0.5
    pcie_nic_busy_bytes_per_second: float = 100_000_000
    link_error_peer_ratio: float = 10
    link_error_floor_per_second: float = 0.01
    rdma_symbol_errors_per_hour: float = 120
    rdma_link_recovery_window: str = "15m"
    lemon_min_hours: float = 2
    lemon_fleet_ratio: float = 5

    @classmethod
    def load(cls, path: str) -> Thresholds:
        """The values of an alerts/config.yaml-shaped file (`name: {value, why}`); entries the
        diagnosis does not use are ignored, missing ones keep their defaults."""
        try:
            with open(path, encoding="utf-8") as handle:
                data = yaml.safe_load(handle)
        except OSError as exc:
            raise ThresholdsError(f"{path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ThresholdsError(f"{path}: invalid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ThresholdsError(f"{path}: expected a mapping of thresholds")
        values: dict[str, Any] = {}
        for item in dataclasses.fields(cls):
            entry = data.get(item.name)
            if entry is None:
                continue
            if not isinstance(entry, dict) or "value" not in entry:
                raise ThresholdsError(f"{path}: {item.name}: expected {{value: ..., why: ...}}")
            values[item.name] = _coerce(path, item.name, entry["value"], str(item.type))
        return cls(**values)

    def runbook(self, anchor: str) -> str:
        """The runbook section of an alert (`#<alertname lower-cased>`, as the rules link)."""
        return f"{self.runbook_base_url}#{anchor.lower()}"

    def doc(self, page: str, anchor: str) -> str:
        """A section of another page next to the runbooks (docs/diagnose.md for checks that no
        alert covers)."""
        return f"{posixpath.dirname(self.runbook_base_url)}/{page}#{anchor}"


def _coerce(path: str, name: str, value: Any, kind: str) -> Any:
    """`value` as the field's type (`kind`, the annotation's text)."""
    if kind.startswith("tuple"):
        if not isinstance(value, list):
            raise ThresholdsError(f"{path}: {name}: expected a list")
        return tuple(value)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ThresholdsError(f"{path}: {name}: expected a number, got {value!r}")
        return float(value)
    return str(value)
