"""Network checklist, for collectives slower than expected, in the seed's order: is NCCL on RDMA
at all (the ranks' own NCCL logs first, the RDMA/TCP traffic ratio where none is read), is each
GPU near its NIC, are the QPs and rails, the RoCE GID index and the socket interface set right,
is GPUDirect RDMA on and allowed, are P2P and SHM on, are PFC pauses and ECN marks few, is one
rank late, and how does the bus bandwidth compare with the reference values of
docs/design.md#reference-bus-bandwidth?

The NCCL checks read the nccl collector's series (docs/network.md): each job's settings on the
node (`llmmon_job_nccl_settings_info`), the checks they fail (`llmmon_job_nccl_misconfigured`,
present only while failing) and what the ranks' NCCL logs say it chose (`llmmon_job_nccl_transport_info`, one series per choice with the `ranks` that made it).
"""

from __future__ import annotations

from llmmon.diagnose import describe as d
from llmmon.diagnose.model import Evidence, Outcome, ok, suspect, unknown
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.tree import NEEDS_RATES, BranchSpec, CheckSpec
from llmmon.diagnose.view import Sample, View, group, index, key, total
from llmmon.network.nccl_settings import variable

NODE = ("cluster", "node")
JOB = ("cluster", "job_id")
PG = ("cluster", "job_id", "pg")
GAP = ("cluster", "node", "job_id", "pg")
NODE_JOB = ("cluster", "node", "job_id")
FAR_PATHS = {"PHB": "through the host bridge", "NODE": "across host bridges of one NUMA node",
             "SYS": "across CPU sockets"}
PFC = "node_netdev_priority:llmmon_nic_pfc_pause:ratio_rate1m"
STRAGGLER = "job_id_rank:llmmon_nccl_straggler_score:ratio"
BUSBW = "job_id_pg:llmmon_nccl_busbw_bytes_per_second:rate1m"
GB = 1e9
# Bus bandwidth of a 1 GB all-reduce on H100-class GPUs, low and high end
# (docs/design.md#reference-bus-bandwidth).
REFERENCES = {"nvlink": ("NVLink", 380 * GB, 420 * GB),
              "infiniband": ("8x400G InfiniBand NDR", 320 * GB, 380 * GB),
              "roce": ("8x400G RoCEv2 after tuning", 280 * GB, 360 * GB)}
REFERENCE_GPUS = ("H100", "H200", "GH200")
# The references are for 1 GB messages; below ~128 MiB latency, not bandwidth, bounds busbw.
MIN_MESSAGE_BYTES = 128 << 20
SETTINGS = "llmmon_job_nccl_settings_info"
FINDINGS = "llmmon_job_nccl_misconfigured"
TRANSPORT = "llmmon_job_nccl_transport_info"
# Every check of llmmon.network.nccl_checks.CHECKS (the `check` label of FINDINGS, in the seed's
# order): what its failure means and the fix, as docs/runbooks.md#ncclmisconfigured says at
# length (one subsection per check).
NCCL_CHECKS = {
    "transport_socket": ("NCCL runs its socket transport on a node with RDMA ports",
                         "unset NCCL_NET, mount the RDMA devices into the pod, ship rdma-core "
                         "and the IB plugin"),
    "ib_disabled": ("NCCL_IB_DISABLE=1 keeps NCCL off the RDMA ports",
                    "remove NCCL_IB_DISABLE"),
    "ib_hca_unknown": ("NCCL_IB_HCA names a device or port that is absent or not up",
                       "name the node's devices and active ports (ibv_devinfo -l)"),
    "ib_hca_missing_rail": ("NCCL_IB_HCA leaves out an active rail",
                            "list every rail, or leave NCCL_IB_HCA unset"),
    "gid_index_unset": ("NCCL_IB_GID_INDEX is unset on RoCE ports",
                        "set it to the RoCE v2 GID with the node's address (show_gids; "
                        "usually 3)"),
    "gid_index_not_rocev2": ("NCCL_IB_GID_INDEX points at a GID that is not RoCE v2 or has no "
                             "address", "set the index of the RoCE v2 GID show_gids lists"),
    "socket_ifname_down": ("NCCL_SOCKET_IFNAME matches no interface that is up",
                           "name an interface that is up on every node (ip -br link)"),
    "gdr_unavailable": ("GPUDirect RDMA is unavailable (no nvidia_peermem, no DMA-BUF)",
                        "load nvidia_peermem or use DMA-BUF, then restart the job"),
    "gdr_level_blocks": ("NCCL_NET_GDR_LEVEL is below the GPUs' PCIe path to their NICs",
                         "unset NCCL_NET_GDR_LEVEL, or set the path nvidia-smi topo -m shows"),
    "p2p_disabled": ("NCCL_P2P_DISABLE=1 sends intra-node traffic through host memory",
                     "remove NCCL_P2P_DISABLE (fix IOMMU/ACS instead)"),
    "shm_disabled": ("NCCL_SHM_DISABLE=1 sends intra-node traffic over the network",
                     "remove NCCL_SHM_DISABLE; give /dev/shm room instead"),
    "single_qp_multi_rail": ("one queue pair per connection on a node with several rails",
                             "NCCL_IB_QPS_PER_CONNECTION=4 with NCCL_IB_SPLIT_DATA_ON_QPS=1"),
    "gpu_nic_cross_socket": ("a GPU of the job reaches its nearest NIC across CPU sockets (SYS)",
                             "place the job on GPUs with a NIC on their PCIe switch"),
}
NO_SETTINGS = ("no NCCL settings read: the daemon cannot read the ranks' environment (no "
               "reporter and no access to /proc/PID/environ), or no job runs here")


def _per_node(samples: list[Sample]) -> dict[tuple[str, ...], float]:
    return {k: total(s) for k, s in group(samples, *NODE).items()}


def _multi_node_jobs(view: View) -> dict[tuple[str, ...], list[str]]:
    """(cluster, node) -> jobs with a rank there whose ranks span several nodes."""
    ranks = view.instant("llmmon_rank_info")
    spanning = set()
    for job, members in group(ranks, *JOB).items():
        world = max((int(s.get("world_size") or 0) for s in members), default=0)
        if len({s.get("node") for s in members}) > 1 or world > len(members):
            spanning.add(job)
    found: dict[tuple[str, ...], list[str]] = {}
    for sample in ranks:
        if key(sample, JOB) in spanning:
            found.setdefault(key(sample, NODE), [])
            if sample.get("job_id") not in found[key(sample, NODE)]:
                found[key(sample, NODE)].append(sample.get("job_id"))
    return found


def _traffic(view: View, prefix: str, selector: str = "") -> dict[tuple[str, ...], float] | None:
    both = [view.rate(f"{prefix}_{way}_bytes_total", "5m", selector)
            for way in ("transmit", "receive")]
    if both[0] is None or both[1] is None:
        return None
    return _per_node(both[0] + both[1])


def _rank_order(ranks: str) -> tuple[int, str]:
    first = ranks.split(",")[0].split("-")[0]
    return (int(first), ranks) if first.isdigit() else (1 << 30, ranks)


def _rank_count(members: list[Sample]) -> int:
    """How many ranks the series' `ranks` labels name."""
    count = 0
    for sample in members:
        for part in (sample.get("ranks") or "").split(","):
            low, _, high = part.partition("-")
            if low.isdigit() and (high or low).isdigit():
                count += int(high or low) - int(low) + 1
    return count


def _ranks(members: list[Sample]) -> str:
    """The ranks the series name (`0-3,6`, one series per choice of theirs)."""
    names = sorted((s.get("ranks") for s in members), key=_rank_order)
    return f"rank{'s' if _rank_count(members) > 1 else ''} {', '.join(names)}"


def _transport(view: View) -> tuple[list[Evidence], list[Evidence], set[tuple[str, ...]]]:
    """The ranks' own NCCL logs: (ranks of a multi-node job on Socket on a node with RDMA ports,
    the others, the (cluster, job_id) whose logs name a network), as NCCLNotUsingRDMA's
    `nccl_log` rule reads them."""
    ranks = view.instant(TRANSPORT)
    has_ports = {key(s, NODE) for s in view.instant("llmmon_rdma_port_info")}
    spanning = _multi_node_jobs(view)
    bad, fine = [], []
    for (cluster, node, job, net), members in sorted(
            group(ranks, *NODE, "job_id", "net").items()):
        first = members[0]
        version = f" (NCCL {first.get('version')})" if first.get("version") else ""
        head = f"job {job}{d.on_node(first)}: {_ranks(members)}"
        if not net:
            fine.append(d.evidence(first, ("job_id",), f"{head}: the NCCL log names no network "
                                   "(yet)", ranks=_rank_count(members)))
        elif net == "Socket":
            text = f"{head} use NET/Socket{version}"
            if (cluster, node) not in has_ports:
                fine.append(d.evidence(first, ("job_id",), f"{text}: the node has no RDMA port",
                                       ranks=_rank_count(members)))
            elif job not in spanning.get((cluster, node), []):
                fine.append(d.evidence(first, ("job_id",), f"{text}: a single-node job, nothing "
                                       "crosses the fabric", ranks=_rank_count(members)))
            else:
                bad.append(d.evidence(first, ("job_id",), f"{text}: TCP although the node has "
                                      "RDMA ports", ranks=_rank_count(members)))
        else:
            gdr = {s.get("gdr") for s in members}
            how = ("with GPUDirect RDMA" if gdr == {"1"} else "without GPUDirect RDMA"
                   if "0" in gdr else "GPUDirect RDMA not logged")
            fine.append(d.evidence(first, ("job_id",), f"{head} use NET/{net}{version} on "
                                   f"{first.get('devices') or 'devices not logged'}, {how}",
                                   ranks=_rank_count(members)))
    evidenced = {key(s, JOB) for s in ranks if s.get("net")}
    return bad, fine, evidenced


def _ratio(view: View, t: Thresholds, evidenced: set[tuple[str, ...]]
           ) -> tuple[list[Evidence], list[Evidence], bool] | None:
    """The fallback: RDMA and TCP traffic per node, for the multi-node jobs whose ranks' logs
    name no network; (suspect, fine, any RDMA port), None without rates."""
    rdma = _traffic(view, "llmmon_rdma")
    tcp = _traffic(view, "llmmon_netdev", t.tcp_netdev_selector)
    if rdma is None or tcp is None:
        return None
    has_ranks = {key(s, NODE) for s in view.instant("llmmon_rank_info")}
    has_ports = {key(s, NODE) for s in view.instant("llmmon_rdma_port_info")}
    spanning = _multi_node_jobs(view)
    bad, fine = [], []
    for node in sorted(set(tcp) | set(rdma) | has_ports):
        moved, sockets = rdma.get(node, 0.0), tcp.get(node, 0.0)
        here = Sample(dict(zip(NODE, node)), 0.0)
        every = spanning.get(node, [])
        jobs = [job for job in every if (node[0], job) not in evidenced]
        numbers = {"rdma_bytes_per_second": moved, "tcp_bytes_per_second": sockets}
        text = f"{d.node(here)}: RDMA {d.size(moved, 'B/s')}, TCP {d.size(sockets, 'B/s')}"
        falling_back = moved < t.rdma_idle_bytes_per_second and \
            sockets > t.tcp_busy_bytes_per_second
        if every and not jobs:
            fine.append(Evidence(d.subject(here), f"{text}; not judged: the NCCL logs of "
                                 f"{', '.join(every)} say which network", numbers))
            continue
        if node not in has_ports:
            if jobs and sockets > t.tcp_busy_bytes_per_second:
                bad.append(Evidence(d.subject(here), f"{text}; multi-node job(s) "
                                    f"{', '.join(jobs)} but no RDMA port", numbers))
            continue
        if falling_back and (jobs or node not in has_ranks):
            whose = (f"multi-node job(s) {', '.join(jobs)}" if jobs
                     else "no rank information: whose traffic is unknown")
            bad.append(Evidence(d.subject(here), f"{text}; {whose}", numbers))
        else:
            fine.append(Evidence(d.subject(here), text, numbers))
    return bad, fine, bool(has_ports)


def _nccl_settings(view: View, checks: tuple[str, ...], shown: tuple[str, ...]
                   ) -> tuple[list[Evidence], list[Evidence], bool, bool]:
    """The jobs' NCCL settings against `checks`: (failing on a multi-node job, the rest, any
    job the collector applied one of `checks` to, any settings read)."""
    settings = index(view.instant(SETTINGS), *NODE_JOB)
    failing: dict[tuple[str, ...], list[str]] = {}
    for sample in view.instant(FINDINGS):
        if sample.get("check") in checks and sample.value > 0:
            failing.setdefault(key(sample, NODE_JOB), []).append(sample.get("check"))
    spanning = _multi_node_jobs(view)
    bad, fine, applied = [], [], False
    for where in sorted(set(settings) | set(failing)):
        cluster, node, job = where
        sample = settings.get(where) or Sample(dict(zip(NODE_JOB, where)), 1.0)
        values = ", ".join(f'{variable(name)}="{sample.get(name)}"' for name in shown)
        head = f"job {job}{d.on_node(sample)}" + (f" ({values})" if values and where in settings
                                                   else "")
        ran = [c for c in sample.get("checked").split(",") if c in checks]
        applied = applied or bool(ran) or where in failing
        found = sorted(set(failing.get(where, [])), key=list(NCCL_CHECKS).index)
        if found:
            what = "; ".join(f"{c}: {NCCL_CHECKS[c][0]} (fix: {NCCL_CHECKS[c][1]})"
                             for c in found)
            if job in spanning.get((cluster, node), []):
                bad.append(d.evidence(sample, ("job_id",), f"{head}: {what}",
                                      findings=float(len(found))))
            else:
                fine.append(d.evidence(sample, ("job_id",), f"{head}: {what} (a single-node "
                                       "job: not judged)", findings=float(len(found))))
        elif ran:
            fine.append(d.evidence(sample, ("job_id",), f"{head}: passes {', '.join(ran)}",
                                   findings=0.0))
        else:
            fine.append(d.evidence(sample, ("job_id",), f"{head}: {', '.join(checks)} "
                                   "do not apply here"))
    return bad, fine, applied, bool(settings)


TRANSPORT_CHECKS = ("transport_socket", "ib_disabled")


def rdma_in_use(view: View, t: Thresholds) -> Outcome:
    socket, logged, evidenced = _transport(view)
    wrong, right, _, _ = _nccl_settings(view, TRANSPORT_CHECKS, ("net", "ib_disable"))
    ratio = _ratio(view, t, evidenced)
    if ratio is None and not (socket or logged or wrong):
        return unknown(NEEDS_RATES)
    idle, busy, ports = ratio or ([], [], False)
    if socket or idle:
        summary = ("NCCL runs over TCP sockets on a multi-node job although its node has RDMA "
                   "ports (its ranks' NCCL log says NET/Socket)" if socket else
                   "RDMA idles while TCP is busy: NCCL fell back to sockets")
        return suspect(f"{summary} (check NCCL_DEBUG=INFO for the line before NET/Socket, "
                       "NCCL_NET, NCCL_IB_DISABLE, NCCL_IB_HCA, the RDMA devices in the pod)",
                       *socket, *idle, *wrong, alert="NCCLNotUsingRDMA")
    if wrong:
        return suspect("NCCL's settings keep a multi-node job off the RDMA ports", *wrong,
                       *logged, alert="NCCLMisconfigured")
    if not (logged or busy):
        return unknown("no RDMA ports" if ratio is not None and not ports else NEEDS_RATES,
                       *right)
    if ratio is None:
        right = [*right, Evidence({}, f"traffic not judged: {NEEDS_RATES}")]
    return ok("collective traffic is not on TCP", *logged, *busy, *right)


def gpu_nic_affinity(view: View, t: Thresholds) -> Outcome:
    nearest = view.instant("llmmon_gpu_nearest_nic_info")
    crossing, placed, _, _ = _nccl_settings(view, ("gpu_nic_cross_socket",), ())
    if crossing:
        far = [d.evidence(s, (*d.GPU, "device", "netdev"), f"{d.gpu(s)}: nearest NIC "
                          f"{s.get('device')} ({s.get('netdev') or 'no netdev'}) is SYS, "
                          f"{FAR_PATHS['SYS']}") for s in nearest if s.get("path") == "SYS"]
        return suspect("a GPU a multi-node job uses reaches its NIC across CPU sockets: place "
                       "the job on GPUs with a NIC on their PCIe switch", *crossing, *far,
                       alert="NCCLMisconfigured")
    if not nearest:
        return unknown("no GPU-NIC topology (no NVIDIA GPUs or no RDMA devices in sysfs)")
    far = [d.evidence(s, (*d.GPU, "device", "netdev"), f"{d.gpu(s)}: nearest NIC "
                      f"{s.get('device')} ({s.get('netdev') or 'no netdev'}) is {s.get('path')}, "
                      f"{FAR_PATHS[s.get('path')]}")
           for s in nearest if s.get("path") in FAR_PATHS]
    if far:
        return suspect("GPU traffic to its NIC crosses the CPU: place jobs on GPUs with a NIC "
                       "on their PCIe switch, or check NCCL_IB_HCA's order", *far)
    paths = ", ".join(f"{p} {len(s)}" for (p,), s in sorted(group(nearest, "path").items()))
    return ok(f"every GPU has a NIC on its PCIe switch ({paths})")


def gpudirect(view: View, t: Thresholds) -> Outcome:
    flags = view.instant("llmmon_gpudirect_rdma_enabled")
    blocked, allowed, applied, _ = _nccl_settings(view, ("gdr_unavailable", "gdr_level_blocks"),
                                                  ("net_gdr_level",))
    if not flags:
        if blocked:
            return suspect("NCCL cannot use GPUDirect RDMA for a multi-node job: transfers are "
                           "staged through host memory", *blocked, alert="NCCLMisconfigured")
        return unknown("not exported: the node lacks NVIDIA GPUs or RDMA devices")
    dmabuf = {key(s, ("cluster", "node")) for s in
              view.instant("llmmon_gpudirect_dmabuf_supported") if s.value == 1}
    off = [d.evidence(s, (), f"{d.node(s)}: nvidia_peermem is not loaded and there is no "
                      "DMA-BUF support", enabled=0.0)
           for s in flags if s.value == 0 and key(s, ("cluster", "node")) not in dmabuf]
    if off:
        return suspect("GPUDirect RDMA is off: inter-node transfers are staged through host "
                       "memory (load nvidia_peermem, or use dma-buf)", *off, *blocked,
                       alert="GPUDirectRDMADisabled")
    if blocked:
        return suspect("NCCL_NET_GDR_LEVEL keeps a multi-node job from GPUDirect RDMA: "
                       "transfers are staged through host memory", *blocked,
                       alert="NCCLMisconfigured")
    return ok("GPUDirect RDMA is on (nvidia_peermem loaded, or DMA-BUF supported)"
              + ("" if applied else "; no job's NCCL_NET_GDR_LEVEL was checked"), *allowed)


def _nccl_check(checks: tuple[str, ...], shown: tuple[str, ...], problem: str, passing: str,
                not_applied: str):
    """A check of the jobs' NCCL settings alone: suspect when one of `checks` fails for a
    multi-node job (NCCLMisconfigured's condition, without its wait), unknown without settings
    or where none of `checks` applies."""

    def run(view: View, t: Thresholds) -> Outcome:
        bad, fine, applied, read = _nccl_settings(view, checks, shown)
        if bad:
            return suspect(problem, *bad, *fine, alert="NCCLMisconfigured")
        if not read and not fine:
            return unknown(NO_SETTINGS)
        if not applied:
            return unknown(not_applied, *fine)
        if any(e.values.get("findings") for e in fine):
            return ok("only single-node jobs fail these checks: not judged (NCCLMisconfigured "
                      "tickets multi-node jobs)", *fine)
        return ok(passing, *fine)

    return run


nccl_rails = _nccl_check(
    ("ib_hca_unknown", "ib_hca_missing_rail", "single_qp_multi_rail"),
    ("ib_hca", "ib_qps_per_connection"),
    "NCCL_IB_HCA or the queue pairs per connection leave rails unused: fewer NICs or flows "
    "carry the job's traffic", "NCCL_IB_HCA names the node's active rails, with several queue "
    "pairs per connection where there are several rails",
    "no check of the rails applied (no RDMA port on the node, or no multi-node job)")
nccl_gid_index = _nccl_check(
    ("gid_index_unset", "gid_index_not_rocev2"), ("ib_gid_index",),
    "NCCL_IB_GID_INDEX is unset or not a RoCE v2 GID with an address on RoCE ports",
    "NCCL_IB_GID_INDEX points at a RoCE v2 GID with an address",
    "no GID check applied: the RDMA ports are not RoCE (InfiniBand, or none), or no multi-node "
    "job")
nccl_socket_ifname = _nccl_check(
    ("socket_ifname_down",), ("socket_ifname",),
    "NCCL_SOCKET_IFNAME matches no interface that is up: bootstrap and sockets cannot start",
    "NCCL_SOCKET_IFNAME matches an interface that is up",
    "NCCL_SOCKET_IFNAME is unset for every job: NCCL picks an interface itself")
nccl_p2p_shm = _nccl_check(
    ("p2p_disabled", "shm_disabled"), ("p2p_disable", "shm_disable"),
    "P2P or SHM is disabled: traffic within the node goes through host memory or the network",
    "P2P and SHM are enabled", "no check of P2P and SHM applied")


def pfc_ecn(view: View, t: Thresholds) -> Outcome:
    if not view.instant("llmmon_nic_info") and not view.instant("llmmon_rdma_port_info"):
        return unknown("no NIC driver statistics and no RDMA ports")
    pauses = view.rule(PFC)
    storms = view.increase("llmmon_nic_pause_storm_events_total", t.pfc_storm_window)
    handled = view.rate("llmmon_rdma_cnp_handled_total", "5m")
    marked = view.rate("llmmon_rdma_ecn_marked_packets_total", "5m")
    if pauses is None or storms is None or handled is None or marked is None:
        return unknown(NEEDS_RATES)
    found: list[Evidence] = []
    for (cluster, node, netdev, direction), members in sorted(
            group(pauses, *NODE, "netdev", "direction").items()):
        worst = max(members, key=lambda s: s.value)
        limit = t.pfc_tx_pause_ratio if direction == "tx" else t.pfc_rx_pause_ratio
        if worst.value > limit:
            role = ("it pauses its switch port: the storm's origin" if direction == "tx"
                    else "the switch pauses it: a victim of congestion downstream")
            found.append(d.evidence(worst, ("netdev", "priority", "direction"),
                                    f"{netdev}{d.on_node(worst)} priority {worst.get('priority')}"
                                    f" paused ({direction}) {d.percent(worst.value)} of the time: "
                                    f"{role}", pause_ratio=worst.value))
    found += [d.evidence(s, ("netdev", "severity"), f"{s.get('netdev')}{d.on_node(s)}: "
                         f"{s.value:.0f} pause-storm {s.get('severity')} events",
                         storm_events=s.value) for s in storms if s.value > 0]
    found += [d.evidence(s, d.PORT, f"{d.port(s)}: DCQCN cuts its rate {s.value:.0f} times a "
                         "second (CNPs handled)", cnp_handled_per_second=s.value)
              for s in handled if s.value > t.rdma_cnp_per_second]
    context = _pfc_context(pauses, marked)
    storm = any(e.subject.get("direction") == "tx" or "severity" in e.subject for e in found)
    if found:
        return suspect("PFC pauses or congestion notifications hold collectives back", *found,
                       context, alert="RDMAPFCStorm" if storm else "RDMACongestion")
    return ok("PFC pauses near zero, no pause storm, few congestion notifications", context)


def _pfc_context(pauses: list[Sample], marked: list[Sample]) -> Evidence:
    worst = max((s.value for s in pauses), default=0.0)
    ecn = total(marked)
    return Evidence({}, f"largest pause fraction {d.percent(worst)}; ECN-marked RoCE packets "
                    f"{ecn:.3g}/s over all ports", {"max_pause_ratio": worst,
                                                    "ecn_marked_per_second": ecn})


def straggler(view: View, t: Thresholds) -> Outcome:
    scores = view.rule(STRAGGLER)
    lags = view.instant("llmmon_nccl_enqueue_lag_seconds")
    if not scores and not lags:
        return unknown("no per-rank collective timings (TORCH_NCCL_ENABLE_TIMING) and no "
                       "enqueue lag (needs two ranks of a group on a node)")
    found = [d.evidence(s, d.RANK, f"{d.rank(s)} waits {d.percent(s.value)} less in "
                        "collectives than its group's median rank: it arrives late",
                        straggler_score=s.value)
             for s in scores or [] if s.value > t.straggler_score]
    worst_lag = {}
    for rank, members in group(lags, "cluster", "node", "job_id", "rank").items():
        worst_lag[rank] = max(members, key=lambda s: s.value)
    found += [d.evidence(s, d.RANK, f"{d.rank(s)} enqueues its collectives "
                         f"{d.seconds(s.value)} after its node's median rank (group "
                         f"{s.get('pg')})", enqueue_lag_seconds=s.value)
              for s in worst_lag.values() if s.value > t.straggler_enqueue_lag_seconds]
    if found:
        return suspect("one rank is consistently late and every peer waits for it: look at "
                       "its GPU (clocks, power) and what it does between collectives", *found)
    latest = max((s.value for s in worst_lag.values()), default=0.0)
    return ok(f"no rank is late (largest enqueue lag {d.seconds(latest)})")


def _slowest(view: View) -> dict[tuple[str, ...], Sample]:
    """(cluster, job_id) -> its group whose pace fell most against its own baseline (the value:
    recent gap / baseline gap)."""
    bases = {key(s, GAP): s.value
             for s in view.instant("llmmon_nccl_collective_gap_baseline_seconds")}
    ratios = [Sample(s.labels, s.value / bases[key(s, GAP)])
              for s in view.instant("llmmon_nccl_collective_gap_seconds")
              if bases.get(key(s, GAP))]
    return {job: max(members, key=lambda s: s.value)
            for job, members in group(ratios, *JOB).items()}


def _inside(view: View, t: Thresholds) -> dict[tuple[str, ...], list[float | None]]:
    """(cluster, job_id) -> per node with a pace, the share of the added time its ranks spend
    inside collectives, averaged over `network_slow_inside_window` and the largest of its
    groups' (None where the daemon could not tell), as the rules read it: one read of a share
    comes from a handful of status reports and flickers."""
    shares: dict[tuple[str, ...], float] = {}
    for s in view.mean_over_time("llmmon_nccl_collective_gap_inside_ratio",
                                 t.network_slow_inside_window):
        shares[key(s, NODE_JOB)] = max(s.value, shares.get(key(s, NODE_JOB), s.value))
    paced = {key(s, NODE_JOB): s for s in view.instant("llmmon_nccl_collective_gap_seconds")}
    return {job: [shares.get(key(s, NODE_JOB)) for s in members]
            for job, members in group(list(paced.values()), *JOB).items()}


def _worst_loss(lost: list[Sample], sent: list[Sample]) -> dict[tuple[str, ...], Sample]:
    """(cluster, job_id) -> its network namespace retransmitting the largest share of the TCP
    segments it sends (the value: that share)."""
    sending = {key(s, ("cluster", "node", "job_id", "netns")): s.value for s in sent}
    worst: dict[tuple[str, ...], Sample] = {}
    for s in lost:
        segments = sending.get(key(s, ("cluster", "node", "job_id", "netns")), 0.0)
        share = Sample(s.labels, s.value / segments if segments > 0 else 0.0)
        if share.value > worst.get(key(s, JOB), Sample({}, -1.0)).value:
            worst[key(s, JOB)] = share
    return worst


def _network_slows(pace: Sample, loss: Sample | None, shares: list[float | None],
                   t: Thresholds) -> Evidence | None:
    """Evidence that the network slows a job past `network_slow_factor`: on every node its
    ranks spend the added time inside the collectives, or its TCP is lossy and no node shows
    them spending it before the collectives (the network would not explain that)."""
    if pace.value < t.network_slow_factor:
        return None
    known = [share for share in shares if share is not None]
    least = min((share or 0.0 for share in shares), default=0.0)  # no share reads as 0
    head = f"job {pace.get('job_id')} runs {pace.value:.1f}x slower than its own pace " \
           f"(group {pace.get('pg')})"
    if least >= t.network_slow_inside_share:
        return d.evidence(
            pace, ("job_id", "pg"), f"{head} and on every node at least "
            f"{d.percent(least)} of the added time is spent inside the collectives "
            "(a slow or congested link)", slowdown_ratio=pace.value, inside_share=least)
    if loss and loss.value > t.network_slow_retransmit_share and not (
            known and max(known) <= t.network_slow_outside_share):
        return d.evidence(
            pace, ("job_id", "pg"), f"{head} and {d.percent(loss.value)} of the TCP "
            f"segments sent in the network namespace of {loss.get('netns')}"
            f"{d.on_node(loss)} are retransmitted", slowdown_ratio=pace.value,
            retransmitted_share=loss.value)
    return None


def network_slow(view: View, t: Thresholds) -> Outcome:
    slowest = _slowest(view)
    if not slowest:
        return unknown("no group pace to compare (needs the reporter, and a group completing "
                       "at least 5 collectives in 30 s with an earlier 30 s to compare with)")
    inside = _inside(view, t)
    window = t.network_slow_rate_window
    lost = view.rate("llmmon_tcp_segments_retransmitted_total", window)
    sent = view.rate("llmmon_tcp_segments_sent_total", window)
    if lost is None or sent is None:
        return unknown(NEEDS_RATES)
    worst = _worst_loss(lost, sent)
    found = [e for e in (_network_slows(pace, worst.get(job), inside.get(job, []), t)
                         for job, pace in sorted(slowest.items())) if e is not None]
    if found:
        return suspect("every rank of a job runs slower and waits inside its collectives, or "
                       "its TCP traffic is lossy: suspect the network between its nodes, not a "
                       "rank", *found)
    pace = max(slowest.values(), key=lambda s: s.value)
    loss = max(worst.values(), key=lambda s: s.value, default=None)
    return ok(f"no job both slowed and waiting inside its collectives or lossy (slowest: job "
              f"{pace.get('job_id')} at {pace.value:.1f}x its own pace; most TCP "
              f"retransmitted: {d.percent(loss.value) if loss else 'none read'})")


def _fabrics(view: View) -> dict[tuple[str, ...], str | None]:
    """(cluster, job_id, pg) -> nvlink (every rank on one node), infiniband or roce (the
    group spans nodes; by the RDMA ports' link layer), or None (no RDMA port: TCP)."""
    sizes = {key(s, PG): int(s.get("size")) for s in view.instant("llmmon_nccl_pg_info")
             if s.get("size").isdigit()}
    layers = {s.get("link_layer") for s in view.instant("llmmon_rdma_port_info")}
    across = "infiniband" if "InfiniBand" in layers else "roce" if "Ethernet" in layers else None
    found = {}
    for where, members in group(view.instant("llmmon_nccl_last_enqueued_seq"), *PG).items():
        ranks = {s.get("rank") for s in members}
        nodes = {s.get("node") for s in members}
        local = len(nodes) <= 1 and sizes.get(where, len(ranks)) <= len(ranks)
        found[where] = "nvlink" if local else across
    return found


def busbw(view: View, t: Thresholds) -> Outcome:
    values = view.rule(BUSBW)
    if values is None:
        return unknown(NEEDS_RATES)
    if not values:
        return unknown("no collective durations: timing mode (TORCH_NCCL_ENABLE_TIMING=1) is "
                       "off, or no collective ran in the window")
    moved = view.rate("llmmon_nccl_collective_bytes_total", "1m") or []
    counted = view.rate("llmmon_nccl_collective_duration_seconds_count", "1m") or []
    message = {k: total(s) for k, s in group(moved, *PG).items()}
    calls = {k: total(s) for k, s in group(counted, *PG).items()}
    fabrics = _fabrics(view)
    models = {s.get("model") for s in view.instant("llmmon_gpu_info")}
    hopper = any(name in model for model in models for name in REFERENCE_GPUS)
    bad, fine, other = [], [], []
    for sample in values:
        where = key(sample, PG)
        size = message.get(where, 0.0) / calls[where] if calls.get(where) else 0.0
        fabric = fabrics.get(where)
        text = (f"job {sample.get('job_id')}, group {sample.get('pg')}: busbw "
                f"{d.size(sample.value, 'B/s')} at {d.size(size)} per collective")
        numbers = {"busbw_bytes_per_second": sample.value, "mean_message_bytes": size}
        if fabric is None or not hopper or size < MIN_MESSAGE_BYTES:
            why = ("no RDMA fabric" if fabric is None else
                   "the references are for H100-class GPUs" if not hopper else
                   f"messages under {d.size(MIN_MESSAGE_BYTES)}")
            other.append(d.evidence(sample, ("job_id", "pg"), f"{text} (no reference: {why})",
                                    **numbers))
            continue
        name, low, high = REFERENCES[fabric]
        item = d.evidence(sample, ("job_id", "pg"), f"{text}; {name} reference "
                          f"{low / GB:.0f}-{high / GB:.0f} GB/s", reference_low=low, **numbers)
        (bad if sample.value < low else fine).append(item)
    if bad:
        return suspect("collective bus bandwidth is below the reference: walk the checklist "
                       "above", *bad, *other)
    if fine:
        return ok("bus bandwidth meets the reference", *fine, *other)
    return unknown("no process group to compare with a reference", *other)


BRANCH = BranchSpec(
    "network", "Network checklist", "Why are collectives slower than expected?",
    (CheckSpec("rdma_in_use", "NCCL on RDMA", rdma_in_use,
               ("NCCLNotUsingRDMA", "NCCLMisconfigured"),
               ("rdma_idle_bytes_per_second", "tcp_busy_bytes_per_second",
                "tcp_netdev_selector")),
     CheckSpec("gpu_nic_affinity", "GPU-NIC affinity", gpu_nic_affinity,
               ("NCCLMisconfigured",), doc="gpu-nic-affinity"),
     CheckSpec("nccl_rails", "NCCL QPs and rails", nccl_rails, ("NCCLMisconfigured",)),
     CheckSpec("nccl_gid_index", "NCCL RoCE GID index", nccl_gid_index,
               ("NCCLMisconfigured",)),
     CheckSpec("nccl_socket_ifname", "NCCL socket interface", nccl_socket_ifname,
               ("NCCLMisconfigured",)),
     CheckSpec("gpudirect", "GPUDirect RDMA", gpudirect,
               ("GPUDirectRDMADisabled", "NCCLMisconfigured")),
     CheckSpec("nccl_p2p_shm", "NCCL P2P and SHM", nccl_p2p_shm, ("NCCLMisconfigured",)),
     CheckSpec("pfc_ecn", "PFC pauses and ECN", pfc_ecn, ("RDMAPFCStorm", "RDMACongestion"),
               ("pfc_storm_window", "pfc_tx_pause_ratio", "pfc_rx_pause_ratio",
                "rdma_cnp_per_second")),
     CheckSpec("straggler", "Late rank (fail-slow)", straggler, ("LLMTrainingStraggler",),
               ("straggler_collectives", "straggler_score", "straggler_enqueue_lag_seconds")),
     CheckSpec("network_slow", "Even slowdown the network explains", network_slow,
               ("LLMTrainingNetworkSlow",),
               ("network_slow_factor", "network_slow_retransmit_share",
                "network_slow_rate_window", "network_slow_inside_share",
                "network_slow_outside_share", "network_slow_inside_window")),
     CheckSpec("busbw", "Bus bandwidth vs reference", busbw, doc="bus-bandwidth")))
