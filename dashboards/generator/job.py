"""Job: one training job across its ranks: who is behind, how fast, how much memory.

Like node.py, the panel functions take their size as keyword arguments for reuse by triage.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import units

from dashboards.generator import limits
from dashboards.generator.common import RUNBOOKS, build, dashboard_url
from dashboards.generator.panels import (
    Query,
    heatmap,
    m,
    prop,
    rate,
    row,
    table,
    timeseries,
    value_text,
)

RANK = "{{job_id}} rank {{rank}}"
RANK_PG = "{{job_id}} rank {{rank}} {{pg}}"
PG = "{{job_id}} {{pg}} {{dimension}}"


def with_dimension(expr: str) -> str:
    """Per-group `expr` with the mesh dimension its group carries (tp, dp_shard, pp, ep,
    world), for legends in the job's parallelism; a group with no llmmon_nccl_pg_info keeps
    its series, without one."""
    return (f"({expr}) * on (cluster, job_id, pg) group_left (dimension) max by (cluster, "
            f"job_id, pg, dimension) ({m('llmmon_nccl_pg_info', 'job_id')}) or ({expr})")
MFU_STEPS = ((None, "red"), (limits.get("mfu_low"), "yellow"), (0.5, "green"))
# Reference bus bandwidth of a 1 GB all-reduce (docs/design.md#reference-bus-bandwidth): the low
# end of 8x400G RoCEv2, of H100 8x400G InfiniBand NDR and of H100 NVLink.
BUSBW_STEPS = ((None, "red"), (280e9, "orange"), (320e9, "yellow"), (380e9, "green"))
# How many collectives a rank's last enqueued sequence trails its group's leader, per group.
BEHIND = (f"max by (cluster, job_id, pg) ({m('llmmon_nccl_last_enqueued_seq', 'job_id')}) "
          "- on (cluster, job_id, pg) group_right "
          f"{m('llmmon_nccl_last_enqueued_seq', 'job_id', 'rank')}")


def ranks_table(**size):
    rank_info = m("llmmon_rank_info", "job_id", "rank")
    with_gpu = (f"{rank_info} * on (cluster, node, uuid) group_left (gpu) "
                f"{m('llmmon_gpu_info')} or on (cluster, job_id, rank) {rank_info}")
    per_rank = "max by (cluster, job_id, rank, node)"
    node_link = {"title": "Node ${__data.fields.node}",
                 "url": dashboard_url("node", carry=("job_id",), node="${__data.fields.node}")}
    return table(
        "Ranks", "Every rank of the job: where it runs, whether its reporter is alive, the "
        "last collective it completed (highest over its process groups), how many collectives "
        "it trails the leader of its worst group (the rank behind in a hang is the culprit) "
        "and the age of its last report. Click a node for its dashboard.",
        Query(f"max by (cluster, job_id, rank, node, gpu) ({with_gpu})"),
        Query(f"{per_rank} ({m('llmmon_rank_up', 'job_id', 'rank')})"),
        Query(f"{per_rank} ({m('llmmon_nccl_last_completed_seq', 'job_id', 'rank')})"),
        Query(f"{per_rank} ({BEHIND})"),
        Query(f"{per_rank} ({m('llmmon_rank_report_age_seconds', 'job_id', 'rank')})"),
        columns=("job_id", "rank", "node", "gpu", "Value #B", "Value #C", "Value #D",
                 "Value #E"),
        renames={"job_id": "job", "Value #B": "state", "Value #C": "last completed",
                 "Value #D": "behind", "Value #E": "report age"},
        sort_by="rank",
        overrides=[
            ("state", [prop("mappings", value_text({"0": ("stale", "red"),
                                                    "1": ("reporting", "green")})),
                       prop("custom.cellOptions", {"type": "color-text"})]),
            ("behind", [prop("thresholds", {"mode": "absolute", "steps": [
                {"value": None, "color": "green"}, {"value": 1, "color": "red"}]}),
                        prop("custom.cellOptions", {"type": "color-background"})]),
            ("report age", [prop("unit", units.Seconds), prop("thresholds", {
                "mode": "absolute", "steps": [
                    {"value": None, "color": "green"},
                    {"value": limits.get("reporter_stale_seconds"), "color": "red"}]}),
                            prop("custom.cellOptions", {"type": "color-text"})]),
            ("node", [prop("links", [node_link])]),
        ], **size)


def time_since_progress(**size):
    return timeseries(
        "Time since last progress, per process group", "Seconds since any rank of the group "
        "last completed a collective. It saws up and down while training; a line climbing "
        "past the dashed hang window is a hang (LLMTrainingHang).", units.Seconds,
        Query(with_dimension("time() - max by (cluster, job_id, pg) "
                             f"({m('llmmon_nccl_last_progress_timestamp_seconds', 'job_id')})"),
              PG),
        steps=((None, "green"), (limits.get("hang_window_seconds"), "red")), **size)


def ranks_behind(**size):
    return timeseries(
        "Collectives behind the group's leader, per rank", "How many collectives each rank's "
        "last enqueued one trails the most advanced rank of its group. Brief spreads are "
        "normal (CPUs run ahead); a rank stuck behind while the group stops is the one the "
        "others wait for.", units.NoUnit, Query(BEHIND, RANK_PG), **size)


def completed_seq(**size):
    return timeseries(
        "Completed collectives per process group", "Sequence number of the last collective "
        "the group completed: a rising staircase while training, flat during a hang.",
        units.NoUnit,
        Query(with_dimension("max by (cluster, job_id, pg) "
                             f"({m('llmmon_nccl_last_completed_seq', 'job_id')})"), PG), **size)


def oldest_inflight(**size):
    return timeseries(
        "Oldest in-flight collective", "Age of the oldest collective each rank has enqueued "
        "but not completed. Near zero while healthy; growing on every rank but one: the one "
        "rank behind never joined.", units.Seconds,
        Query(m("llmmon_nccl_oldest_inflight_age_seconds", "job_id", "rank"), RANK_PG),
        steps=((None, "green"), (limits.get("hang_window_seconds"), "red")), **size)


def collective_time_heatmap(**size):
    by_rank = "sum by (cluster, job_id, rank)"
    return heatmap(
        "Collective time per rank", "Mean time each rank spends per collective (timing mode). "
        "The rank that arrives last waits least: a pale row among dark ones is the late "
        "rank (straggler); all rows darkening together points at the network.", units.Seconds,
        Query(f"{by_rank} ({rate('llmmon_nccl_collective_duration_seconds_sum', 'job_id', 'rank')})"
              f" / {by_rank} "
              f"({rate('llmmon_nccl_collective_duration_seconds_count', 'job_id', 'rank')})",
              RANK), **size)


def enqueue_lag(**size):
    return timeseries(
        "Enqueue lag per rank", "How much later each rank enqueues the same collective than "
        "its node's median rank. Dashed: LLMTrainingStraggler's level.", units.Seconds,
        Query(m("llmmon_nccl_enqueue_lag_seconds", "job_id", "rank"), RANK_PG),
        steps=((None, "green"), (limits.get("straggler_enqueue_lag_seconds"), "red")), **size)


def busbw(**size):
    return timeseries(
        "Bus bandwidth per process group", "Collective bus bandwidth (nccl-tests factors, "
        "timing mode). Reference for a 1 GB all-reduce: 8x400G RoCEv2 280-360 GB/s after "
        "tuning, H100 8x400G InfiniBand NDR 320-380 GB/s, H100 NVLink 380-420 GB/s (dashed: "
        "280, 320, 380). Small collectives never reach these.", units.BytesPerSecondSI,
        Query(with_dimension(m("job_id_pg:llmmon_nccl_busbw_bytes_per_second:rate1m", "job_id")),
              PG),
        steps=BUSBW_STEPS, min_value=0, **size)


def straggler_score(**size):
    return timeseries(
        "Straggler score per rank", "How much less a rank waits in collectives than its "
        "group's median rank (10 min): 0 is typical, positive arrives late. Dashed: "
        "LLMTrainingStraggler's level.", units.PercentUnit,
        Query(m("job_id_rank:llmmon_nccl_straggler_score:ratio", "job_id", "rank"), RANK),
        steps=((None, "green"), (limits.get("straggler_score"), "red")), **size)


def pace(**size):
    return timeseries(
        "Pace against its own", "Seconds per collective now over the fastest earlier 30 s "
        "still in the ranks' Flight Recorder, per group and node: 1 is the job's own pace. "
        "Dashed: LLMTrainingNetworkSlow's level (with TCP loss beside it).", units.Short,
        Query(f"{m('llmmon_nccl_collective_gap_seconds', 'job_id')} / on (cluster, node, "
              f"job_id, pg) {m('llmmon_nccl_collective_gap_baseline_seconds', 'job_id')}",
              "{{job_id}} {{pg}} {{node}}"),
        steps=((None, "green"), (limits.get("network_slow_factor"), "red")), min_value=0,
        **size)


def tcp_loss(**size):
    return timeseries(
        "TCP segments retransmitted", "Share of the TCP segments sent in each network "
        "namespace of the job's ranks that were retransmitted (gloo, NCCL's socket "
        "transport). Dashed: LLMTrainingNetworkSlow's level.", units.PercentUnit,
        Query(f"{rate('llmmon_tcp_segments_retransmitted_total', 'job_id')} / "
              f"{rate('llmmon_tcp_segments_sent_total', 'job_id')}",
              "{{job_id}} {{netns}} {{node}}"),
        steps=((None, "green"), (limits.get("network_slow_retransmit_share"), "red")),
        min_value=0, **size)


# The settings the nccl collector reads from each job's ranks on a node
# (llmmon_job_nccl_settings_info), as the table names them: the variables themselves.
NCCL_SETTINGS = {"ib_hca": "NCCL_IB_HCA", "ib_gid_index": "NCCL_IB_GID_INDEX",
                 "socket_ifname": "NCCL_SOCKET_IFNAME", "net_gdr_level": "NCCL_NET_GDR_LEVEL",
                 "ib_qps_per_connection": "NCCL_IB_QPS_PER_CONNECTION",
                 "ib_disable": "NCCL_IB_DISABLE", "p2p_disable": "NCCL_P2P_DISABLE",
                 "shm_disable": "NCCL_SHM_DISABLE", "net": "NCCL_NET", "algo": "NCCL_ALGO",
                 "proto": "NCCL_PROTO"}
FINDING = [prop("thresholds", {"mode": "absolute", "steps": [
    {"value": None, "color": "green"}, {"value": 1, "color": "red"}]}),
           prop("custom.cellOptions", {"type": "color-background"})]


def nccl_settings(**size):
    settings = m("llmmon_job_nccl_settings_info", "job_id", "node")
    by = f"max by (cluster, job_id, node, {', '.join(NCCL_SETTINGS)})"
    findings = (f"count by (cluster, job_id, node) "
                f"({m('llmmon_job_nccl_misconfigured', 'job_id', 'node')})")
    return table(
        "NCCL settings per node", "The NCCL variables the job's ranks run with on each node "
        "(its lowest local rank's environment; empty: unset) and how many checks of the node "
        "they fail (NCCLMisconfigured; which ones: NCCL findings per node). No row for a "
        "node: the daemon could not read the ranks' environment there.",
        Query(f"{by} ({findings} * on (cluster, job_id, node) group_right () {settings} "
              f"or 0 * {settings})"),
        columns=("node", *NCCL_SETTINGS, "Value"),
        renames={**NCCL_SETTINGS, "Value": "findings"}, sort_by="node",
        overrides=[("findings", FINDING)], **size)


def nccl_findings(**size):
    return table(
        "NCCL findings per node", "Each check the job's NCCL settings fail on a node, against "
        "what the node has (devices and ports, RoCE GIDs, interfaces up, GPUDirect RDMA, the "
        "GPU-NIC path): NCCLMisconfigured tickets it on a running multi-node job. Click a "
        "check for what it means and its fix. Empty: nothing fails, or nothing was read.",
        Query("max by (cluster, job_id, node, check) "
              f"({m('llmmon_job_nccl_misconfigured', 'job_id', 'node')})"),
        columns=("job_id", "node", "check"), renames={"job_id": "job"}, sort_by="node",
        overrides=[("check", [prop("links", [{"title": "Runbook: ${__value.raw}",
                                              "url": RUNBOOKS + "#${__value.raw}"}])])],
        **size)


def nccl_transport(**size):
    return table(
        "NCCL transport", "The network the job's ranks' NCCL chose, from their own logs "
        "(NCCL_DEBUG=INFO), one row per choice and node with the ranks that made it: IB (RDMA) "
        "or Socket (TCP, NCCLNotUsingRDMA on a multi-node job whose node has RDMA ports), "
        "whether it uses GPUDirect RDMA (GDRDMA), the devices and the transports of its "
        "channels. No row: no NCCL log was read for the job.",
        Query("max by (cluster, job_id, ranks, node, version, net, gdr, devices, paths) "
              f"({m('llmmon_job_nccl_transport_info', 'job_id', 'node')})"),
        columns=("ranks", "node", "net", "gdr", "devices", "paths", "version"),
        renames={"gdr": "GPUDirect RDMA", "version": "NCCL"}, sort_by="ranks",
        overrides=[
            ("net", [prop("mappings", value_text({"Socket": ("Socket", "red"),
                                                  "IB": ("IB", "green")})),
                     prop("custom.cellOptions", {"type": "color-text"})]),
            ("GPUDirect RDMA", [prop("mappings", value_text({"1": ("yes", "green"),
                                                             "0": ("no", "orange")})),
                                prop("custom.cellOptions", {"type": "color-text"})]),
        ], **size)


def step_time(**size):
    step = "llmmon_training_step_seconds"
    return timeseries(
        "Step time", "Median step time per job, and mean step time per rank. A rank slower "
        "than the rest slows every step of a synchronous job.", units.Seconds,
        Query("histogram_quantile(0.5, sum by (cluster, job_id, le) "
              f"({rate(step + '_bucket', 'job_id')}))", "{{job_id}} median"),
        Query(f"sum by (cluster, job_id, rank) ({rate(step + '_sum', 'job_id', 'rank')}) "
              f"/ sum by (cluster, job_id, rank) ({rate(step + '_count', 'job_id', 'rank')})",
              RANK), **size)


def mfu(**size):
    return timeseries(
        "MFU", "Model FLOPs utilisation: model FLOPs per second over the bf16 dense peak of "
        f"the job's GPUs. Below {limits.get('mfu_low'):.0%} fails (LLMTrainingMFULow), above "
        "50 % is excellent.", units.PercentUnit,
        Query(m("job_id:llmmon_training_mfu:ratio", "job_id"), "{{job_id}}"),
        steps=MFU_STEPS, min_value=0, **size)


def tokens(**size):
    return timeseries(
        "Tokens per second", "Training throughput of the job, summed over its ranks.",
        units.Short,
        Query(f"sum by (cluster, job_id) ({rate('llmmon_training_tokens_total', 'job_id')})",
              "{{job_id}} tokens/s"), **size)


def allocator_memory(**size):
    return timeseries(
        "Allocator reserved vs active, per rank", "Bytes PyTorch's caching allocator has "
        "reserved from the GPU and bytes in active blocks. Reserved high with active low is "
        "fragmentation (try expandable_segments).", units.BytesIEC,
        Query(m("llmmon_torch_memory_reserved_bytes", "job_id", "rank"), RANK + " reserved"),
        Query(m("llmmon_torch_memory_active_bytes", "job_id", "rank"), RANK + " active"),
        **size)


def fragmentation(**size):
    return timeseries(
        "Fragmentation per rank", "Share of reserved memory that holds no tensor. High at "
        "every instant is fragmentation; dashed: GPUMemoryFragmentation's level.",
        units.PercentUnit,
        Query(m("job_id_rank:llmmon_torch_memory_fragmentation:ratio", "job_id", "rank"), RANK),
        steps=((None, "green"), (limits.get("fragmentation_ratio"), "red")), max_value=1,
        **size)


def reserved_share(**size):
    return timeseries(
        "Reserved share of GPU memory", "PyTorch reserved bytes of each rank over its GPU's "
        "total memory. Dashed: GPUMemoryOOMRisk's level; the next larger peak may not fit.",
        units.PercentUnit,
        Query(m("job_id_rank:llmmon_torch_memory_reserved_per_gpu_memory:ratio", "job_id",
                "rank"), RANK),
        steps=((None, "green"), (limits.get("oom_risk_reserved_ratio"), "red")), max_value=1,
        **size)


def retries_ooms(**size):
    return timeseries(
        "Allocator retries and OOMs", "cudaMalloc retries (the allocator flushed its cache: "
        "the step before an OOM) and out-of-memory errors per rank in each scrape window.",
        units.Short,
        Query(rate("llmmon_torch_alloc_retries_total", "job_id", "rank", fn="increase"),
              RANK + " retries"),
        Query(rate("llmmon_torch_ooms_total", "job_id", "rank", fn="increase"), RANK + " OOMs"),
        bars=True, **size)


def dashboard() -> dict:
    third, half, quarter = {"width": 8}, {"width": 12}, {"width": 6}
    return build("job", "llmmon / Job",
                 "One training job across its ranks: the ranks table (who is behind), "
                 "progress per process group, collective timings, bandwidth, stragglers, "
                 "NCCL settings and transport, throughput and allocator memory.",
                 [row("Ranks"), ranks_table(width=14, height=10),
                  time_since_progress(width=10, height=10),
                  row("Progress and collectives"), completed_seq(**third),
                  ranks_behind(**third), oldest_inflight(**third),
                  collective_time_heatmap(**half), enqueue_lag(**half),
                  row("Bandwidth and stragglers"), busbw(**half), straggler_score(**half),
                  pace(**half), tcp_loss(**half),
                  row("NCCL settings and transport"), nccl_settings(width=24, height=6),
                  nccl_findings(width=8, height=8), nccl_transport(width=16, height=8),
                  row("Throughput"), step_time(**third), mfu(**third), tokens(**third),
                  row("Allocator memory"), allocator_memory(**quarter),
                  fragmentation(**quarter), reserved_share(**quarter),
                  retries_ooms(**quarter)],
                 job_scoped_nodes=True)
