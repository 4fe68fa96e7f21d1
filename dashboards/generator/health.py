"""Node health panels: the must-repair and fail-slow verdicts of alerts/source/health.yaml.

Used as a row of the node dashboard; each panel shows the series one health alert reads.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import units

from dashboards.generator.panels import Query, m, prop, rate, timeseries

GPU = "{{node}} GPU {{gpu}}"
DASHED = [prop("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})]


def xid_actions(**size):
    return timeseries(
        "XIDs by action", "Time since each GPU's last XID of each code (those the kernel log "
        "held when the exporter started included), labelled with the action NVIDIA's XID "
        "catalogue asks for; reset_gpu, reboot_node and rma page within the hour "
        "(GPUXidActionRequired).", units.Seconds,
        Query(f'(time() - {m("llmmon_gpu_xid_last_timestamp_seconds", "node", "gpu")}) '
              f'* on (cluster, node, xid) group_left (action) max by (cluster, node, xid, action) '
              f'({m("llmmon_gpu_xid_action_info", "node")})',
              GPU + " XID {{xid}} {{action}}"),
        **size)


def memory_repair(**size):
    return timeseries(
        "Memory repair state", "Row remap pending (reset at the job boundary), row remap failed "
        "(RMA), the driver's recovery action (1 reset, 2 reboot, 3 drain P2P, 4 drain and "
        "reset), the rows remapped after uncorrectable errors, and the NVSwitch fabric state "
        "(GPUFabricUnhealthy below 3).", units.Short,
        Query(m("llmmon_gpu_row_remap_pending", "node", "gpu"), GPU + " remap pending"),
        Query(m("llmmon_gpu_row_remap_failure", "node", "gpu"), GPU + " remap failed"),
        Query(m("llmmon_gpu_recovery_action", "node", "gpu"), GPU + " recovery action"),
        Query(m("llmmon_gpu_remapped_rows", "node", "gpu", 'cause="uncorrectable"'),
              GPU + " rows remapped (uncorrectable)"),
        Query(m("llmmon_gpu_fabric_state", "node", "gpu"), GPU + " fabric state (3 registered)"),
        Query(m("llmmon_gpu_fabric_degraded_bandwidth", "node", "gpu"),
              GPU + " fabric bandwidth degraded"),
        **size)


def pcie_links(**size):
    return timeseries(
        "PCIe link vs maximum", "Current PCIe generation x width of each GPU and RDMA device "
        "(solid) against its maximum (dashed). Idle GPUs drop their generation to save power; "
        "a busy device below its maximum trained down (PCIeLinkDowntrained).", units.Short,
        Query(f'{m("llmmon_gpu_pcie_link_generation", "node", "gpu")} * '
              f'{m("llmmon_gpu_pcie_link_width", "node", "gpu")}', GPU + " gen x lanes"),
        Query(f'{m("llmmon_gpu_pcie_link_max_generation", "node", "gpu")} * '
              f'{m("llmmon_gpu_pcie_link_max_width", "node", "gpu")}', GPU + " max"),
        Query(f'{m("llmmon_rdma_device_pcie_link_generation", "node")} * '
              f'{m("llmmon_rdma_device_pcie_link_width", "node")}',
              "{{node}} {{device}} gen x lanes"),
        Query(f'{m("llmmon_rdma_device_pcie_link_max_generation", "node")} * '
              f'{m("llmmon_rdma_device_pcie_link_max_width", "node")}', "{{node}} {{device}} max"),
        overrides=[("/max$/", DASHED)], **size)


def link_errors(**size):
    return timeseries(
        "Link errors per GPU", "NVLink CRC/replay/recovery errors and PCIe replays per second "
        "of each GPU over 10 minutes; one GPU far above its node's others is the degrading one "
        "(GPULinkErrorsAbovePeers).", units.CountsPerSecond,
        Query(m("node_gpu:llmmon_gpu_nvlink_errors:rate10m", "node", "gpu"), GPU + " NVLink"),
        Query(m("node_gpu:llmmon_gpu_pcie_replays:rate10m", "node", "gpu"), GPU + " PCIe replays"),
        **size)


def rdma_link_quality(**size):
    return timeseries(
        "RDMA link quality", "Symbol errors and link error recoveries per port (over 120 symbol "
        "errors an hour breaks the IBTA bit-error limit), and the node's active RDMA ports: a "
        "node below its peers' count runs with fewer rails (RDMALinkDegraded).", units.Short,
        Query(rate("llmmon_rdma_symbol_errors_total", "node", fn="increase"),
              "{{node}} {{device}}/{{port}} symbol errors"),
        Query(rate("llmmon_rdma_link_error_recovery_total", "node", fn="increase"),
              "{{node}} {{device}}/{{port}} link recoveries"),
        Query(f'count by (cluster, node) ({m("llmmon_rdma_port_up", "node")} == 1)',
              "{{node}} active ports"),
        bars=True, **size)
