"""Node: everything one node's exporter sees, GPU by GPU, port by port, disk by disk.

The panel functions take their size as keyword arguments because the triage dashboard reuses
them as evidence; there `$node` lists the selected job's nodes only.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import units

from dashboards.generator import health, limits
from dashboards.generator.common import build
from dashboards.generator.panels import (
    Query,
    m,
    prop,
    rate,
    row,
    stat,
    state_timeline,
    table,
    timeseries,
    value_text,
)

GPU = "{{node}} GPU {{gpu}}"
PORT = "{{node}} {{device}}/{{port}}"
USED, TOTAL = 'state="used"', 'state="total"'
DASHED = [prop("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})]


def power_average(**size):
    return timeseries(
        "Power, 1 s average", "NVML's 1 s running average per GPU, with the power limit "
        "dashed. It hides sub-second dips: a starving GPU can read a steady mid value here "
        "while its instant power swings.", units.Watt,
        Query(m("llmmon_gpu_power_watts", "node", "gpu"), GPU),
        Query(m("llmmon_gpu_power_limit_watts", "node", "gpu"), GPU + " limit"),
        overrides=[("/limit$/", DASHED)], **size)


def instant_power(**size):
    return timeseries(
        "Instant power, min and max per scrape", "Lowest and highest instant power sampled "
        "(20 Hz) in each scrape window. A band that keeps dropping to tens of watts is "
        "data-loader starvation; a band stuck low on every GPU is an idle or hung job.",
        units.Watt,
        Query(m("llmmon_gpu_power_instant_min_watts", "node", "gpu"), GPU + " min"),
        Query(m("llmmon_gpu_power_instant_max_watts", "node", "gpu"), GPU + " max"), **size)


def power_dips(**size):
    return timeseries(
        "Power dips and time at low power", "Dips per minute (instant power falling from busy "
        "to below the low level) and the share of time below the low level. The starvation "
        f"alert fires above {limits.get('starvation_dips_per_minute'):g} dips/min with "
        f"{limits.get('starvation_low_power_fraction'):.0%} of the time low.",
        units.CountsPerMinute,
        Query(f"60 * {rate('llmmon_gpu_power_dips_total', 'node', 'gpu')}", GPU + " dips/min"),
        Query(rate("llmmon_gpu_power_low_seconds_total", "node", "gpu"), GPU + " low share"),
        overrides=[("/low share$/", [prop("unit", units.PercentUnit)])], **size)


def sm_clock(**size):
    return timeseries(
        "SM clock", "Streaming-multiprocessor clock per GPU. Under full bf16 load an H200 sits "
        "at its power cap around 1.4-1.5 GHz; a card far below its peers is throttled (see "
        "the clock-event reasons).", units.Hertz,
        Query(m("llmmon_gpu_clock_hertz", "node", "gpu", 'clock="sm"'), GPU), **size)


def clock_reasons(**size):
    active = m("llmmon_gpu_clock_event_active", "node", "gpu")
    return state_timeline(
        "Clock-event reasons", "Active clock-event reasons per GPU (only reasons active at "
        "some point in the range). sw_power_cap under load and gpu_idle at rest are normal; "
        "thermal slowdowns, hw_slowdown and the power brake are not.", units.NoUnit,
        # `@ end()`: the window over the whole range is taken once, at its end, not at every
        # step (at 1,000 nodes on VictoriaMetrics the per-step form took 9-13 s)
        Query(f"{active} and on (cluster, node, gpu, reason) "
              f"max_over_time({active}[$__range] @ end()) > 0", GPU + " {{reason}}"),
        steps=((None, "transparent"), (1, "orange")),
        mappings=value_text({"0": ("off", "transparent"), "1": ("on", "orange")}), **size)


def throttle_time(**size):
    return timeseries(
        "Time throttled, by reason", "Share of time each GPU was held below its clocks, by "
        "reason (NVML violation counters).", units.PercentUnit,
        Query(rate("llmmon_gpu_throttle_seconds_total", "node", "gpu"), GPU + " {{reason}}"),
        **size)


def temperature(**size):
    return timeseries(
        "Temperature vs slowdown threshold", "GPU and memory temperatures; dashed: each card's "
        "slowdown threshold. At the threshold the card slows itself down: check airflow, fans "
        "and that card's heatsink.", units.Celsius,
        Query(m("llmmon_gpu_temperature_celsius", "node", "gpu"), GPU + " {{sensor}}"),
        Query(m("llmmon_gpu_temperature_threshold_celsius", "node", "gpu",
                'threshold="slowdown"'), GPU + " slowdown"),
        overrides=[("/slowdown$/", DASHED)], **size)


def gpu_memory(**size):
    return timeseries(
        "Memory used", "Device memory used as a share of the card's total (NVML v2: the "
        "driver's reservation is not counted as used).", units.PercentUnit,
        Query(f"{m('llmmon_gpu_memory_bytes', 'node', 'gpu', USED)} / ignoring (state) "
              f"{m('llmmon_gpu_memory_bytes', 'node', 'gpu', TOTAL)}", GPU),
        steps=((None, "green"), (0.95, "red")), max_value=1, **size)


def utilisation(**size):
    return timeseries(
        "Utilisation and tensor activity", "NVML utilisation (any kernel running) and "
        "tensor-core activity. Utilisation stays at 100 % while a GPU spins in a hung NCCL "
        "kernel; tensor activity does not.", units.PercentUnit,
        Query(m("llmmon_gpu_utilization_ratio", "node", "gpu"), GPU + " util"),
        Query(m("llmmon_gpu_tensor_active_ratio", "node", "gpu"), GPU + " tensor"),
        max_value=1, **size)


def gpu_errors(**size):
    return timeseries(
        "GPU errors", "XID errors by code, uncorrectable ECC errors and PCIe replays per "
        "scrape window. Any XID or uncorrectable ECC error needs its runbook.", units.Short,
        Query(rate("llmmon_gpu_xid_errors_total", "node", "gpu", fn="increase"),
              GPU + " XID {{xid}}"),
        Query(rate("llmmon_gpu_ecc_errors_total", "node", "gpu", 'severity="uncorrected"',
                   fn="increase"), GPU + " ECC {{scope}}"),
        Query(rate("llmmon_gpu_pcie_replays_total", "node", "gpu", fn="increase"),
              GPU + " PCIe replays"),
        bars=True, **size)


def rdma_traffic(**size):
    return timeseries(
        "RDMA traffic per port", "RDMA bytes per second per port (port counters x 4); "
        "transmit above the axis, receive below. All ports at zero while a job runs: a hang, "
        "or NCCL is not using RDMA.", units.BytesPerSecondSI,
        Query(rate("llmmon_rdma_transmit_bytes_total", "node"), PORT + " tx"),
        Query(f"-{rate('llmmon_rdma_receive_bytes_total', 'node')}", PORT + " rx"), **size)


def rdma_loss(**size):
    return timeseries(
        "RDMA loss and retransmissions", "Loss and retransmission events per second per port "
        "and hardware counter (5 min rate). A lossless RoCE fabric shows none; RDMAPacketLoss "
        f"fires above {limits.get('rdma_loss_events_per_second'):g}/s.",
        units.CountsPerSecond,
        Query(m("node_device_port:llmmon_rdma_loss_events:rate5m", "node"),
              PORT + " {{counter}}"), **size)


def rdma_congestion(**size):
    return timeseries(
        "Congestion: CNP and ECN", "Congestion notifications handled (DCQCN slowed this "
        "port's flows), sent (this port received ECN-marked packets), and ECN-marked packets.",
        units.PacketsPerSecond,
        Query(rate("llmmon_rdma_cnp_handled_total", "node"), PORT + " CNP handled"),
        Query(rate("llmmon_rdma_cnp_sent_total", "node"), PORT + " CNP sent"),
        Query(rate("llmmon_rdma_ecn_marked_packets_total", "node"), PORT + " ECN marked"),
        **size)


def port_state(**size):
    return state_timeline(
        "RDMA port state", "Link state per RDMA port; red is down. Several short red slices "
        "are a flapping link.", units.NoUnit, Query(m("llmmon_rdma_port_up", "node"), PORT),
        steps=((None, "red"), (1, "green")),
        mappings=value_text({"0": ("down", "red"), "1": ("up", "green")}), **size)


def link_flaps(**size):
    return timeseries(
        "Link downs and carrier changes", "Link-downed events per RDMA port and carrier "
        "changes per netdev in each scrape window: flaps.", units.Short,
        Query(rate("llmmon_rdma_link_downed_total", "node", fn="increase"),
              PORT + " link downed"),
        Query(rate("llmmon_netdev_carrier_changes_total", "node", fn="increase"),
              "{{node}} {{netdev}} carrier"), bars=True, **size)


def pfc_pause(**size):
    return timeseries(
        "PFC pause fraction per priority", "Share of time each port and priority was paused. "
        "rx: the switch paused us (a victim of congestion downstream); tx: we paused the "
        "switch (this host cannot drain its NIC). Dashed: RDMAPFCStorm's level for tx. A "
        "priority with no series has PFC off.", units.PercentUnit,
        Query(m("node_netdev_priority:llmmon_nic_pfc_pause:ratio_rate1m", "node"),
              "{{node}} {{netdev}} prio {{priority}} {{direction}}"),
        steps=((None, "green"), (limits.get("pfc_tx_pause_ratio"), "red")), **size)


def pause_frames(**size):
    return timeseries(
        "Pause frames and storm events", "PFC pause frames per second per port, priority and "
        "direction, and pause-storm events (warning: the NIC asserted pause for seconds; "
        "error: it disabled its own pause and drops packets).", units.PacketsPerSecond,
        Query(rate("llmmon_nic_pfc_pause_frames_total", "node"),
              "{{node}} {{netdev}} prio {{priority}} {{direction}}"),
        Query(rate("llmmon_nic_pause_storm_events_total", "node"),
              "{{node}} {{netdev}} storm {{severity}}"), **size)


def disk_iops(**size):
    return timeseries(
        "Disk read and write IOPS", "Completed reads and writes per second per disk.",
        units.IOOpsPerSecond,
        Query(rate("llmmon_disk_reads_total", "node"), "{{node}} {{device}} read"),
        Query(rate("llmmon_disk_writes_total", "node"), "{{node}} {{device}} write"), **size)


def disk_throughput(**size):
    return timeseries(
        "Disk throughput", "Bytes read and written per second per disk.",
        units.BytesPerSecondSI,
        Query(rate("llmmon_disk_read_bytes_total", "node"), "{{node}} {{device}} read"),
        Query(rate("llmmon_disk_written_bytes_total", "node"), "{{node}} {{device}} write"),
        **size)


def disk_latency(**size):
    return timeseries(
        "Disk read latency", "Mean time per completed read (r_await). Dashed: "
        "DiskReadSaturated's level; above it, jobs reading their data from this disk starve.",
        units.Seconds,
        Query(m("node_device:llmmon_disk_read_latency_seconds:rate1m", "node"),
              "{{node}} {{device}}"),
        steps=((None, "green"), (limits.get("disk_read_latency_seconds"), "red")), **size)


def disk_pressure(**size):
    return timeseries(
        "Disk utilisation and IO pressure", "Share of time each disk had IO in flight, and "
        "share of time tasks on the node stalled on IO (PSI some/full). Near 100 % busy "
        "saturates a single-queue disk; NVMe can go further.", units.PercentUnit,
        Query(rate("llmmon_disk_io_seconds_total", "node"), "{{node}} {{device}} busy"),
        Query(m("node:llmmon_pressure_io_stalled_seconds:rate1m", "node"),
              "{{node}} IO pressure {{kind}}"), **size)


def nic_paths(**size):
    return table(
        "GPU to NIC paths", "The RDMA device nearest each GPU and the PCIe path between them, "
        "as `nvidia-smi topo -m` prints it: PIX (one PCIe switch, best), PXB, PHB, NODE, SYS "
        "(across sockets, worst). Each GPU should have a PIX or PXB NIC. Every pair: "
        "--collector.topology.affinity-matrix (llmmon_gpu_nic_affinity).",
        Query(f"max by (node, gpu, device, netdev, path) "
              f"({m('llmmon_gpu_nearest_nic_info', 'node', 'gpu')})"),
        columns=("node", "gpu", "device", "netdev", "path"), renames={"device": "RDMA device"},
        sort_by="gpu", **size)


def gpudirect(**size):
    return stat(
        "GPUDirect RDMA", "Whether nvidia_peermem (or dma-buf) lets the NICs read GPU memory "
        "directly. Off: every inter-node transfer is staged through host memory.",
        units.NoUnit, Query(m("llmmon_gpudirect_rdma_enabled", "node"), "{{node}}"),
        steps=((None, "red"), (1, "green")),
        mappings=value_text({"0": ("off", "red"), "1": ("on", "green")}), **size)


def collector_health(**size):
    return state_timeline(
        "Collector health", "1 while each collector's last run succeeded within its timeout. "
        "A failed collector's last good snapshot is served for a minute, then its panels go "
        "empty.", units.NoUnit,
        Query(m("llmmon_exporter_collector_success", "node"), "{{node}} {{collector}}"),
        steps=((None, "red"), (1, "green")),
        mappings=value_text({"0": ("failed", "red"), "1": ("ok", "green")}), **size)


def collector_runs(**size):
    return timeseries(
        "Collector run time and errors", "Wall time of each collector's last run, and errors "
        "per second (skipped series, failed or timed-out runs).", units.Seconds,
        Query(m("llmmon_exporter_collector_duration_seconds", "node"), "{{node}} {{collector}}"),
        Query(rate("llmmon_exporter_collector_errors_total", "node"),
              "{{node}} {{collector}} errors/s"),
        overrides=[("/errors\\/s$/", [prop("unit", units.CountsPerSecond)])], **size)


def dashboard() -> dict:
    third, half, quarter = {"width": 8}, {"width": 12}, {"width": 6}
    return build("node", "llmmon / Node",
                 "One node in depth: GPU power, clocks, throttling, temperature and memory; "
                 "RDMA traffic, loss and congestion; PFC; disk; GPU-NIC topology; exporter "
                 "health.",
                 [row("GPU power"), power_average(**third), instant_power(**third),
                  power_dips(**third),
                  row("GPU clocks and throttling"), sm_clock(**third),
                  clock_reasons(width=10), throttle_time(width=6),
                  row("GPU temperature, memory and errors"), temperature(**third),
                  gpu_memory(**third), utilisation(**third), gpu_errors(width=24, height=6),
                  row("Node health"), health.xid_actions(**quarter),
                  health.memory_repair(**quarter), health.pcie_links(**quarter),
                  health.link_errors(**quarter), health.rdma_link_quality(width=24, height=6),
                  row("RDMA ports"), rdma_traffic(**third), rdma_loss(**third),
                  rdma_congestion(**third), port_state(**half, height=6),
                  link_flaps(**half, height=6),
                  row("PFC and pause storms"), pfc_pause(**half), pause_frames(**half),
                  row("Disk"), disk_iops(**quarter), disk_throughput(**quarter),
                  disk_latency(**quarter), disk_pressure(**quarter),
                  row("GPU-NIC topology and exporter health"), nic_paths(width=10, height=9),
                  gpudirect(width=4, height=9), collector_health(width=10, height=9),
                  collector_runs(width=24, height=6)],
                 job_scoped_nodes=False)
