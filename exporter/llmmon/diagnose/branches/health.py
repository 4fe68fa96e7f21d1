"""Node health: must a GPU or node be repaired, or is one of its links degrading?

The verdicts of alerts/source/health.yaml over the same series: XIDs whose catalogued action
needs an SRE, the memory repair state NVML reports, PCIe links that trained down while busy,
and NVLink or PCIe error rates far above those of the node's other GPUs.
"""

from __future__ import annotations

from statistics import median

from llmmon.diagnose import describe as d
from llmmon.diagnose.model import Evidence, Outcome, ok, suspect, unknown
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.tree import NEEDS_RATES, BranchSpec, CheckSpec
from llmmon.diagnose.view import Sample, View, group, index, key

GPU_KEY = ("cluster", "node", "uuid")
NIC_KEY = ("cluster", "node", "device")
LEMON = "node:llmmon_lemon_score:hours7d"
FABRIC_COMPLETED = 3
RECOVERY = {1: "reset the GPU", 2: "reboot the node", 3: "drain peer-to-peer traffic",
            4: "drain peer-to-peer traffic, then reset the GPU"}
LINK_ERRORS = (("llmmon_gpu_nvlink_errors_total", 'type=~"crc_flit|crc_data|replay|recovery"',
                "NVLink CRC/replay/recovery errors"),
               ("llmmon_gpu_pcie_replays_total", "", "PCIe replays"))


def xid_actions(view: View, t: Thresholds) -> Outcome:
    actions = {key(s, ("cluster", "node", "xid")): s.get("action")
               for s in view.instant("llmmon_gpu_xid_action_info")}
    if not view.instant("llmmon_gpu_xid_watched") and not actions:
        return unknown("no NVML GPUs watched for XIDs")
    counts = index(view.instant("llmmon_gpu_xid_errors_total"), *GPU_KEY, "xid")
    found = []
    for last in view.instant("llmmon_gpu_xid_last_timestamp_seconds"):
        action = actions.get(key(last, ("cluster", "node", "xid")), "")
        age = view.now - last.value
        if action not in t.xid_paged_actions or age > t.xid_action_window_seconds:
            continue
        count = counts.get(key(last, (*GPU_KEY, "xid")))
        found.append(d.evidence(last, (*d.GPU, "xid"), f"{d.gpu(last)}: XID {last.get('xid')} "
                                f"({count.value if count else 0:.0f} since boot), last "
                                f"{d.seconds(max(age, 0))} ago: {action}", age_seconds=age))
    if found:
        return suspect("a GPU reported an XID that needs a GPU reset, a node reboot or an RMA "
                       "(NVIDIA's XID catalogue): drain the node", *found)
    return ok(f"no XID needing an SRE in the last {t.xid_action_window_seconds:.0f} s")


def memory_repair(view: View, t: Thresholds) -> Outcome:
    failure = view.instant("llmmon_gpu_row_remap_failure")
    recovery = view.instant("llmmon_gpu_recovery_action")
    if not failure and not recovery:
        return unknown("no GPU reports its row remapper or recovery action")
    found: list[Evidence] = []
    alerts = []
    for s in failure:
        if s.value == 1:
            found.append(d.evidence(s, d.GPU, f"{d.gpu(s)}: a row remap failed: RMA",
                                    row_remap_failure=1.0))
            alerts.append("GPURowRemapFailure")
    for s in recovery:
        if s.value:
            action = RECOVERY.get(int(s.value), "see nvmlDeviceGpuRecoveryAction_t")
            found.append(d.evidence(s, d.GPU, f"{d.gpu(s)}: the driver asks for recovery "
                                    f"action {s.value:.0f}: {action}", recovery_action=s.value))
            alerts.append("GPURecoveryActionRequired")
    repairing = {key(s, GPU_KEY) for s in (*failure, *view.instant(
        "llmmon_gpu_row_remap_pending")) if s.value == 1}
    for s in view.instant("llmmon_gpu_ecc_errors_total",
                          'severity="uncorrected",scope="volatile"'):
        if s.value > 0 and key(s, GPU_KEY) not in repairing:
            found.append(d.evidence(s, d.GPU, f"{d.gpu(s)}: {s.value:.0f} uncorrectable ECC "
                                    "errors since the driver loaded, already remapped: reset "
                                    "at the job boundary", uncorrected=s.value))
            alerts.append("GPUEccUncorrectableSinceBoot")
    if found:
        return suspect("a GPU's memory or driver needs repair", *found, alert=alerts[0])
    return ok("no failed row remap, no recovery action, no uncorrectable error since boot")


def _downtrained(links: dict[str, dict[tuple[str, ...], Sample]],
                 device: tuple[str, ...]) -> str | None:
    """`Gen4 x8 of Gen5 x16` when the device's link runs below its maximum, else None."""
    now = {name: links[name].get(device) for name in links}
    if any(value is None for value in now.values()):
        return None
    gen, top_gen = now["generation"].value, now["max_generation"].value  # type: ignore[union-attr]
    width, top_width = now["width"].value, now["max_width"].value  # type: ignore[union-attr]
    if gen >= top_gen and width >= top_width:
        return None
    return f"Gen{gen:.0f} x{width:.0f} of Gen{top_gen:.0f} x{top_width:.0f}"


def _links(view: View, prefix: str,
           labels: tuple[str, ...]) -> dict[str, dict[tuple[str, ...], Sample]]:
    return {name: index(view.instant(f"{prefix}{name}"), *labels)
            for name in ("generation", "max_generation", "width", "max_width")}


def pcie_link(view: View, t: Thresholds) -> Outcome:
    gpus = _links(view, "llmmon_gpu_pcie_link_", GPU_KEY)
    nics = _links(view, "llmmon_rdma_device_pcie_link_", NIC_KEY)
    if not gpus["generation"] and not nics["generation"]:
        return unknown("no GPU or RDMA device reports its PCIe link")
    found = []
    busy = index(view.instant("llmmon_gpu_utilization_ratio"), *GPU_KEY)
    for gpu, sample in gpus["generation"].items():
        link = _downtrained(gpus, gpu)
        utilization = busy[gpu].value if gpu in busy else 0.0
        if link and utilization > t.pcie_busy_utilization:
            found.append(d.evidence(sample, d.GPU, f"{d.gpu(sample)} is {d.percent(utilization)} "
                                    f"busy on a link at {link}", utilization=utilization))
    rates = [*(view.rate("llmmon_rdma_transmit_bytes_total", "5m") or []),
             *(view.rate("llmmon_rdma_receive_bytes_total", "5m") or [])]
    moved = {k: sum(s.value for s in members) for k, members in group(rates, *NIC_KEY).items()}
    for nic, sample in nics["generation"].items():
        link = _downtrained(nics, nic)
        if link and moved.get(nic, 0.0) > t.pcie_nic_busy_bytes_per_second:
            found.append(d.evidence(sample, ("device",), f"RDMA device {sample.get('device')}"
                                    f"{d.on_node(sample)} moves {d.size(moved[nic], 'B/s')} on "
                                    f"a link at {link}", bytes_per_second=moved[nic]))
    if found:
        return suspect("a busy PCIe link trained down below its maximum generation or width: "
                       "reseat or replace the card or its riser", *found)
    return ok("every busy GPU and RDMA device runs its PCIe link at its maximum")


def link_errors(view: View, t: Thresholds) -> Outcome:
    found = []
    compared = False
    for name, selector, what in LINK_ERRORS:
        rates = view.rate(name, "10m", selector)
        if rates is None:
            return unknown(NEEDS_RATES)
        per_gpu = {k: (members[0], sum(s.value for s in members))
                   for k, members in group(rates, *GPU_KEY).items()}
        for members in group([s for s, _ in per_gpu.values()], "cluster", "node").values():
            if len(members) < 2:
                continue
            compared = True
            values = {key(s, GPU_KEY): per_gpu[key(s, GPU_KEY)][1] for s in members}
            middle = median(values.values())
            for sample in members:
                value = values[key(sample, GPU_KEY)]
                if value > t.link_error_floor_per_second and value > t.link_error_peer_ratio * middle:
                    found.append(d.evidence(sample, d.GPU, f"{d.gpu(sample)}: {value:.3g} {what} "
                                            f"a second, its node's median GPU {middle:.3g}",
                                            per_second=value, peer_median=middle))
    if not compared:
        return unknown("fewer than two GPUs with NVLink or PCIe error counters on a node")
    if found:
        return suspect("a GPU's links count far more errors than its node's other GPUs: the "
                       "card, its NVLink or its PCIe slot is degrading", *found)
    return ok("every GPU's NVLink and PCIe error rates are close to its node's other GPUs")


def _rates_below_peers(view: View, active: set[tuple[str, ...]]) -> list[Evidence]:
    """Active ports negotiated below the median port of the same adapter type and link
    layer in their cluster."""
    kinds = index(view.instant("llmmon_rdma_port_info"), *NIC_KEY, "port")
    rates = [s for s in view.instant("llmmon_rdma_port_rate_bytes_per_second")
             if key(s, (*NIC_KEY, "port")) in active and key(s, (*NIC_KEY, "port")) in kinds]
    found = []
    for members in group(rates, "cluster").values():
        peers: dict[tuple[str, str], list[Sample]] = {}
        for s in members:
            info = kinds[key(s, (*NIC_KEY, "port"))]
            peers.setdefault((info.get("hca_type"), info.get("link_layer")), []).append(s)
        for (hca, layer), ports in peers.items():
            usual = median(s.value for s in ports)
            found += [d.evidence(s, d.PORT, f"{d.port(s)} negotiated {d.size(s.value, 'B/s')}, "
                                 f"the median {hca} {layer} port {d.size(usual, 'B/s')}",
                                 rate=s.value) for s in ports if s.value < usual]
    return found


def rdma_links(view: View, t: Thresholds) -> Outcome:
    up = view.instant("llmmon_rdma_port_up")
    if not up:
        return unknown("no RDMA ports")
    symbols = view.increase("llmmon_rdma_symbol_errors_total", "1h")
    recoveries = view.increase("llmmon_rdma_link_error_recovery_total",
                               t.rdma_link_recovery_window)
    if symbols is None or recoveries is None:
        return unknown(NEEDS_RATES)
    found = [d.evidence(s, d.PORT, f"{d.port(s)}: {s.value:.0f} symbol errors in the window "
                        f"(limit {t.rdma_symbol_errors_per_hour:.0f} an hour)", symbol_errors=s.value)
             for s in symbols if s.value > t.rdma_symbol_errors_per_hour]
    found += [d.evidence(s, d.PORT, f"{d.port(s)}: {s.value:.0f} link error recoveries",
                         link_error_recovery=s.value) for s in recoveries if s.value > 0]
    active = [s for s in up if s.value == 1]
    per_node = {k: len(v) for k, v in group(active, "cluster", "node").items()}
    for cluster in group(active, "cluster"):
        counts = [n for (c, _), n in per_node.items() if (c,) == cluster]
        middle = median(counts)
        for (c, node), count in per_node.items():
            if (c,) == cluster and count < middle:
                found.append(Evidence({"node": node, **({"cluster": c} if c else {})},
                                      f"node {node} has {count} active RDMA ports, its "
                                      f"cluster's median node {middle:.0f}", active_ports=count))
    found += _rates_below_peers(view, {key(s, (*NIC_KEY, "port")) for s in active})
    if found:
        return suspect("an RDMA link is degrading or runs below its peers: replace the cable or "
                       "optic, or find the missing or slow port", *found)
    return ok("no symbol-error burst or link recovery; every node has its peers' active ports "
              "and rates")


def fabric(view: View, t: Thresholds) -> Outcome:
    states = view.instant("llmmon_gpu_fabric_state")
    if not states:
        return unknown("no GPU reports an NVSwitch fabric")
    status = index(view.instant("llmmon_gpu_fabric_status"), *GPU_KEY)
    found = []
    for s in states:
        code = status.get(key(s, GPU_KEY))
        if s.value != FABRIC_COMPLETED or (code is not None and code.value != 0):
            found.append(d.evidence(s, d.GPU, f"{d.gpu(s)}: fabric state {s.value:.0f}"
                                    f"{f', status {code.value:.0f}' if code else ''} (3 with "
                                    "status 0 is registered)", fabric_state=s.value))
    found += [d.evidence(s, d.GPU, f"{d.gpu(s)}: the fabric reports degraded NVLink bandwidth",
                         degraded_bandwidth=1.0)
              for s in view.instant("llmmon_gpu_fabric_degraded_bandwidth") if s.value == 1]
    if found:
        return suspect("a GPU is not registered with its NVSwitch fabric, or the fabric is "
                       "degraded: check nvidia-fabricmanager", *found)
    return ok(f"{len(states)} GPUs registered with a healthy fabric")


def lemon_nodes(view: View, t: Thresholds) -> Outcome:
    scores = view.instant(LEMON)
    if not scores:
        return unknown("no lemon score (a Prometheus with the shipped rules records it)")
    found = []
    for members in group(scores, "cluster").values():
        middle = median(s.value for s in members)
        found += [Evidence(d.subject(s), f"{d.node(s)}: {s.value:.1f} alert-hours of hang "
                           f"culprits, stragglers, XIDs and link flaps in 7 days (median node "
                           f"{middle:.1f})", alert_hours=s.value)
                  for s in members
                  if s.value > t.lemon_min_hours and s.value > t.lemon_fleet_ratio * middle]
    if found:
        return suspect("a node fails or slows the jobs that land on it far more often than the "
                       "fleet: pull it from the pool", *found)
    return ok("no node stands out of its cluster's lemon scores")


BRANCH = BranchSpec(
    "health", "Node health", "Must a GPU or node be repaired, or is one of its links degrading?",
    (CheckSpec("xid_actions", "XIDs needing an SRE", xid_actions, ("GPUXidActionRequired",),
               ("xid_action_window_seconds", "xid_paged_actions")),
     CheckSpec("memory_repair", "Memory repair state", memory_repair,
               ("GPURowRemapFailure", "GPURecoveryActionRequired",
                "GPUEccUncorrectableSinceBoot")),
     CheckSpec("pcie_link", "PCIe link training", pcie_link, ("PCIeLinkDowntrained",),
               ("pcie_busy_utilization", "pcie_nic_busy_bytes_per_second")),
     CheckSpec("link_errors", "Link errors against peers", link_errors,
               ("GPULinkErrorsAbovePeers",), ("link_error_peer_ratio",
                                              "link_error_floor_per_second")),
     CheckSpec("rdma_links", "RDMA link quality", rdma_links, ("RDMALinkDegraded",),
               ("rdma_symbol_errors_per_hour", "rdma_link_recovery_window")),
     CheckSpec("fabric", "NVSwitch fabric", fabric, ("GPUFabricUnhealthy",)),
     CheckSpec("lemon_nodes", "Lemon nodes", lemon_nodes, ("LLMNodeLemon",),
               ("lemon_min_hours", "lemon_fleet_ratio"))))
