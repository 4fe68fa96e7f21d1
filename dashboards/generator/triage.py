"""Triage: the decision tree (docs/design.md#the-decision-tree), one row per branch, in the
order an SRE walks it.

Each row opens with a verdict stat: "suspect" while any alert of that branch is pending or
firing for the selected job (job-level alerts) or its nodes (node-level alerts), else "ok".
The verdict is the alert rules' own judgement, so the dashboard and the pages never disagree
and no threshold is repeated here. Evidence panels follow, reused from the node and job
dashboards (here `$node` lists only the job's nodes), and the verdict links to the runbooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from grafana_foundation_sdk.models import units

from dashboards.generator import health, job, limits, node
from dashboards.generator.common import build, dashboard_url, runbook
from dashboards.generator.panels import (
    Query,
    link,
    m,
    rate,
    row,
    stat,
    text,
    timeseries,
    value_text,
)

HEIGHT = 7


@dataclass(frozen=True)
class TriageRow:
    title: str
    job_alerts: tuple[str, ...]  # alerts labelled with job_id
    node_alerts: tuple[str, ...]  # alerts labelled with node only
    evidence: tuple[tuple[Callable, int], ...]  # (panel function, width); lines of 24

    @property
    def alerts(self) -> tuple[str, ...]:
        return self.job_alerts + self.node_alerts


def verdict(branch: TriageRow):
    selectors = []
    if branch.job_alerts:
        selectors.append(m("ALERTS", f'alertname=~"{"|".join(branch.job_alerts)}"', "job_id"))
    if branch.node_alerts:
        selectors.append(m("ALERTS", f'alertname=~"{"|".join(branch.node_alerts)}"', "node"))
    return stat(
        "Verdict", f"suspect while any of {', '.join(branch.alerts)} is pending or firing for "
        "the selected job or its nodes; ok otherwise. The panel links open their runbooks.",
        units.NoUnit, Query(f"max({' or '.join(selectors)}) or vector(0)"),
        width=4, height=HEIGHT, steps=((None, "green"), (1, "red")),
        mappings=value_text({"0": ("ok", "green"), "1": ("suspect", "red")}),
        links=[link(f"Runbook: {alert}", runbook(alert)) for alert in branch.alerts])


def dtype_bytes(**size):
    reductions = f'coll=~"{limits.text("reduction_collectives")}"'
    return timeseries(
        "Gradient-reduction bytes by dtype", "Bytes the job's all-reduce and reduce-scatter "
        "collectives move, by element type. Half (fp16) instead of BFloat16 risks overflow "
        "and NaN losses in large models.", units.BytesPerSecondSI,
        Query("sum by (cluster, job_id, dtype) "
              f"({rate('llmmon_nccl_collective_bytes_total', 'job_id', reductions)})",
              "{{job_id}} {{dtype}}"), stack=True, **size)


def nonfinite_losses(**size):
    return timeseries(
        "Non-finite losses", "NaN or infinite loss values the ranks reported in each scrape "
        "window: the run is diverging.", units.Short,
        Query("sum by (cluster, job_id, rank) "
              f"({rate('llmmon_training_loss_nonfinite_total', 'job_id', fn='increase')})",
              job.RANK), bars=True, **size)


def job_gpu_power(**size):
    return timeseries(
        "Power of the job's GPUs", "1 s average power of every GPU an alive rank of the job "
        "runs on. All of them idle at once while the ranks are alive: a distributed hang.",
        units.Watt, Query(m("uuid_job_id:llmmon_gpu_power_watts:max", "job_id"), node.GPU),
        **size)


def power_vs_peers(**size):
    power = m("uuid_job_id:llmmon_gpu_power_watts:max", "job_id")
    return timeseries(
        "Power against the job's median GPU", "Each GPU's power over the median GPU of its "
        "job. Synchronous ranks draw within 5-10 % of each other; one card far below "
        "(dashed: GPUPowerBelowPeers' level) is throttled and slows the whole job.",
        units.PercentUnit,
        Query(f"{power} / on (cluster, job_id) group_left "
              f"quantile by (cluster, job_id) (0.5, {power})", node.GPU),
        steps=((None, "red"), (limits.get("power_peer_ratio"), "green")), **size)


def rdma_vs_tcp(**size):
    tcp = limits.text("tcp_netdev_selector")
    both = "sum by (cluster, node) ({0} + {1})"
    return timeseries(
        "RDMA vs TCP traffic per node", "Bytes per second on the RDMA ports and on the "
        "TCP/IP netdevs of the job's nodes. A multi-node job whose traffic runs over TCP "
        "while RDMA idles has fallen back to NCCL's socket transport.", units.BytesPerSecondSI,
        Query(both.format(rate("llmmon_rdma_transmit_bytes_total", "node"),
                          rate("llmmon_rdma_receive_bytes_total", "node")), "{{node}} RDMA"),
        Query(both.format(rate("llmmon_netdev_transmit_bytes_total", "node", tcp),
                          rate("llmmon_netdev_receive_bytes_total", "node", tcp)),
              "{{node}} TCP netdevs"), **size)


def report_age(**size):
    return timeseries(
        "Report age per rank", "Seconds since each rank's reporter last wrote its spool "
        "file. Dashed: LLMMonReporterStale's level; past it, this rank's hang and memory "
        "evidence is blind.", units.Seconds,
        Query(m("llmmon_rank_report_age_seconds", "job_id", "rank"), job.RANK),
        steps=((None, "green"), (limits.get("reporter_stale_seconds"), "red")), **size)


BRANCHES = (
    TriageRow("1. Precision: does the job train in BF16?",
           ("LLMTrainingNotBF16", "LLMTrainingLossNonFinite"), (),
           ((dtype_bytes, 10), (nonfinite_losses, 10))),
    TriageRow("2. Memory: out of memory, or about to be?",
           ("GPUMemoryOOM", "GPUMemoryOOMRisk", "GPUMemoryFragmentation"), (),
           ((job.allocator_memory, 5), (job.fragmentation, 5), (job.reserved_share, 5),
            (job.retries_ooms, 5))),
    TriageRow("3a. Starvation: is MFU low, or does GPU power dip every few seconds?",
           ("LLMTrainingMFULow", "GPUDataLoaderStarvation"), ("DiskReadSaturated",),
           ((job.mfu, 5), (node.instant_power, 5), (node.power_dips, 5),
            (node.disk_latency, 5), (node.disk_iops, 8), (node.disk_throughput, 8),
            (node.disk_pressure, 8))),
    TriageRow("3b. Hang: did traffic stop and every GPU go idle?",
           ("LLMTrainingHang", "LLMTrainingDesync", "LLMTrainingHangNodes",
            "LLMTrainingHangSuspected"),
           ("GPULost", "GPUXidError", "GPUEccUncorrectable"),
           ((job.time_since_progress, 5), (job.ranks_behind, 5), (job_gpu_power, 5),
            (node.rdma_traffic, 5), (node.rdma_loss, 8), (node.link_flaps, 8),
            (node.gpu_errors, 8))),
    TriageRow("3c. Thermal: is one card low against its peers?",
           ("GPUPowerBelowPeers",), ("GPUThermalThrottle",),
           ((power_vs_peers, 7), (node.temperature, 7), (node.clock_reasons, 6))),
    TriageRow("4. Network checklist: is collective bandwidth what it should be?",
           ("NCCLNotUsingRDMA", "NCCLMisconfigured", "LLMTrainingStraggler",
            "LLMTrainingNetworkSlow"),
           ("GPUDirectRDMADisabled", "RDMAPFCStorm", "RDMAPacketLoss", "RDMACongestion",
            "RDMALinkDown", "RDMALinkFlapping"),
           ((rdma_vs_tcp, 7), (node.nic_paths, 7), (node.gpudirect, 6), (job.busbw, 6),
            (node.pfc_pause, 6), (node.rdma_congestion, 6), (job.straggler_score, 6),
            (job.pace, 6), (job.tcp_loss, 6), (job.nccl_findings, 12))),
    TriageRow("5. Node health: must a GPU or node be repaired, or is a link degrading?", (),
           ("GPUXidActionRequired", "GPURowRemapFailure", "GPURecoveryActionRequired",
            "GPUEccUncorrectableSinceBoot", "PCIeLinkDowntrained", "GPULinkErrorsAbovePeers",
            "RDMALinkDegraded", "LLMNodeLemon", "GPUFabricUnhealthy"),
           ((health.xid_actions, 5), (health.memory_repair, 5), (health.pcie_links, 5),
            (health.link_errors, 5), (health.rdma_link_quality, 24))),
    TriageRow("Monitoring coverage: can the evidence above be trusted?",
           ("LLMMonReporterStale",), ("LLMMonExporterDown", "LLMMonCollectorFailing"),
           ((node.collector_health, 10), (report_age, 10))),
)

GUIDE = (
    "Pick a job: each row below is one branch of the triage decision tree, in the order to "
    "walk it. The verdict on the left is *suspect* while an alert of that branch is pending "
    "or firing for this job or its nodes; its links open the runbooks. The panels to its "
    "right are the evidence. The [job dashboard]({job}) names the rank behind a hang.")


def dashboard() -> dict:
    items = [text("How to read this dashboard",
                  GUIDE.format(job=dashboard_url("job", carry=("job_id",))), height=3)]
    for branch in BRANCHES:
        items += [row(branch.title), verdict(branch)]
        items += [panel(width=width, height=HEIGHT) for panel, width in branch.evidence]
    return build("triage", "llmmon / Triage",
                 "The SRE decision tree as rows: precision, memory, starvation, hang, thermal, "
                 "network checklist; each with a verdict, its evidence and runbook links.",
                 items, job_scoped_nodes=True)
