"""NCCL, job by job: the settings each job's ranks run with, checked against this node, and the
transport NCCL chose, from NCCL's own log.

The seed's checklist for "a step's all-reduce takes 20 % longer than theory" is about a job's
NCCL environment against the node's hardware (NCCL_IB_HCA naming rails that exist,
NCCL_IB_GID_INDEX on a RoCE v2 GID, NCCL_SOCKET_IFNAME on an interface that is up,
NCCL_NET_GDR_LEVEL against the GPU's path to its NIC, several QPs per connection on a
multi-rail node) and about what NCCL then printed (`NET/IB` or `NET/Socket`, `GDRDMA`).  Both
are read per rank from outside the job: its environment from procfs, its NCCL_DEBUG_FILE
through /proc/<pid>/root (`llmmon launch` and the admission webhook set one; a job's own is
read as well).  The ranks come from the ranks collector's verdicts and the GPU-to-NIC paths
from the topology collector's digest (`serve/assembly` hands both over: collectors never
import each other).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Iterable, Mapping

from prometheus_client.core import Metric

from llmmon.collector import Collector, Context, Environment
from llmmon.metrics import Families, MetricSpec
from llmmon.network import nccl_checks, nccl_settings
from llmmon.network.nccl_checks import NodeFacts
from llmmon.network.nccl_reads import Process, RankRead, RankReader
from llmmon.options import Option
from llmmon.ranks import stall
from llmmon.sources import netclass, pci

SETTINGS = MetricSpec(
    "llmmon_job_nccl_settings_info", "info",
    "The NCCL settings of a job's ranks on this node (the environment of its lowest local "
    "rank whose environment could be read; '' unset); checked lists the checklist's checks "
    "that apply to the job here (llmmon_job_nccl_misconfigured names the failing ones).",
    ("job_id", *nccl_settings.EXPORTED, "checked"))
MISCONFIGURED = MetricSpec(
    "llmmon_job_nccl_misconfigured", "gauge",
    "1 while a check of the NCCL checklist fails for a job on this node (check: "
    + ", ".join(nccl_checks.CHECKS) + "); absent when it passes.", ("job_id", "check"))
TRANSPORT = MetricSpec(
    "llmmon_job_nccl_transport_info", "info",
    "What the NCCL logs (NCCL_DEBUG=INFO, NCCL_DEBUG_FILE) of a job's ranks on this node say "
    "NCCL chose: net (IB, Socket or a plugin's name), gdr (1: GPUDirect RDMA used, 0: network "
    "channels without it, '' unknown), devices (the NICs NCCL uses), paths (the channels' "
    "transports: P2P/IPC, SHM, NET/IB, ...) and NCCL's version; one series per distinct "
    "choice, ranks lists the global ranks that made it (0-3,6).",
    ("job_id", "ranks", "version", "net", "gdr", "devices", "paths"))

LABEL_MAX = 120  # characters of one label value: settings are the job's own, hostile text
NODE_FACTS_TTL = 60.0  # seconds the node's ports, GIDs and interfaces are reused
LOG_WAIT = 2.0  # seconds a run waits for the ranks' NCCL logs, all together


class NcclCollector(Collector):
    name = "nccl"
    description = ("Each job's NCCL settings (its ranks' environment) checked against the node "
                   "(RDMA rails, RoCE GIDs, interfaces, GPUDirect, GPU-NIC placement), and the "
                   "transport NCCL chose, from its NCCL_DEBUG_FILE log.")
    specs = (SETTINGS, MISCONFIGURED, TRANSPORT)
    options = (
        Option("log_max_bytes", "int", 1 << 20,
               "Bytes read from the head of a rank's NCCL log (the network and the channels "
               "are printed as each communicator starts).", metavar="BYTES",
               minimum=4096, maximum=64 << 20),
    )
    roots = ("sysfs", "procfs")
    interval = 15.0
    timeout = 5.0

    def __init__(self, env: Environment, config: dict[str, Any]) -> None:
        super().__init__(env, config)
        self._evidence: Callable[[], stall.Evidence] | None = None
        self._digests: Callable[[], list[Any]] = list
        self._reader = RankReader(env.procfs, "", config["log_max_bytes"])
        self._node: tuple[float, NodeFacts] | None = None
        self._lock = threading.Lock()
        self._judged: list[dict[str, Any]] = []  # the last run's jobs, for /api/v1/nccl

    def attach(self, evidence: Callable[[], stall.Evidence], fr_dir: str,
               digests: Callable[[], list[Any]]) -> None:
        """Follow the ranks collector's verdicts (which ranks run here, their processes and
        GPUs), its dump directory (where injected jobs write their NCCL log) and the
        sampler's digests (the topology collector's GPU-to-NIC paths)."""
        self._evidence = evidence
        self._reader.shared_dir = fr_dir
        self._digests = digests

    def collect(self, ctx: Context) -> Iterable[Metric]:
        families = Families()
        if self._evidence is None:
            ctx.watching(0, "jobs (the ranks collector is disabled: no ranks to check)")
            return families
        jobs = [job for job in self._evidence().jobs if any(r.alive for r in job.ranks)]
        ctx.watching(len(jobs), "jobs")
        ranks = {job.job_id: sorted(job.ranks, key=lambda r: (r.state.identity.local_rank,
                                                              r.rank)) for job in jobs}
        who = [view.state.identity for views in ranks.values() for view in views
               if view.alive]
        reads = self._reader.read(
            [Process(w.pid, w.start_ticks, None if w.nccl_env is None else dict(w.nccl_env))
             for w in who], time.time(), time.monotonic() + LOG_WAIT)
        judged: list[dict[str, Any]] = []
        node = self._node_facts() if jobs else None  # no job: the node's files are not read
        for job_id, views in ranks.items():
            assert node is not None
            mine = [(v, reads[(v.state.identity.pid, v.state.identity.start_ticks)])
                    for v in views if v.alive]
            for view, read in mine:
                self._report(ctx, job_id, view, read)
            judged.append(self._export(families, job_id, mine, len(views), node))
        with self._lock:
            self._judged = judged
        return families

    def _report(self, ctx: Context, job_id: str, view: stall.RankView, read: RankRead) -> None:
        """A rank whose settings or log could not be read: one problem each, in the log and
        counted once in the collector's errors while it lasts."""
        who, where = view.state.identity, f"job {job_id} rank {view.rank}"
        problems = {}
        if read.env is None:
            problems["environ"] = (f"{where}: /proc/{who.pid}/environ is not readable (the "
                                   "daemon needs root or CAP_SYS_PTRACE) and no reporter sent "
                                   "its NCCL variables: its NCCL settings are unknown")
        stuck = read.stuck_for(time.monotonic())
        if stuck > LOG_WAIT:
            problems["nccl_log"] = (f"{where}: reading its NCCL log has not returned for "
                                    f"{stuck:.0f} s (a hung file system?); its last reading "
                                    "stands")
        elif read.error:
            problems["nccl_log"] = f"{where}: NCCL log: {read.error}"
        for kind, message in problems.items():
            (ctx.persists if kind in read.told else ctx.error)(f"{job_id}/{view.rank}/{kind}",
                                                               message)
        read.told = set(problems)

    def api(self) -> dict[str, Callable[[], Any]]:
        return {"nccl": self.judged}

    def judged(self) -> dict[str, Any]:
        """GET /api/v1/nccl: each job's settings, the checks that applied, each finding with
        its evidence and fix (what the metrics cannot carry), and what NCCL chose."""
        with self._lock:
            return {"jobs": list(self._judged)}

    def _export(self, families: Families, job_id: str,
                reads: list[tuple[stall.RankView, RankRead]], ranks_here: int,
                node: NodeFacts) -> dict[str, Any]:
        """The job's series; returns what /api/v1/nccl shows of it.  `ranks_here` counts the
        job's ranks on this node, ended ones included: a job is multi-node when its world is
        larger."""
        chose: dict[tuple[str, ...], list[int]] = {}
        for view, read in reads:
            log = read.log
            if log is not None and log.lines:
                choice = (_label(log.version), _label(log.net), _gdr(log.gdr),
                          _label(",".join(log.net_devices)),
                          _label(",".join(sorted(log.paths))))
                chose.setdefault(choice, []).append(view.rank)
        transport = []
        for choice, ranks in sorted(chose.items()):
            families.add(TRANSPORT, [job_id, _label(rank_ranges(ranks)), *choice], 1)
            transport.append(dict(zip(TRANSPORT.labels[1:], (rank_ranges(ranks), *choice))))
        judged: dict[str, Any] = {"job_id": job_id, "settings": None, "checked": [],
                                  "findings": [], "transport": transport}
        first = next(((v, r) for v, r in reads if r.settings is not None), None)
        if first is None:
            return judged
        settings = first[1].settings
        assert settings is not None
        world = max(v.state.identity.world_size for v, _ in reads)
        multi_node = world > ranks_here
        gpus = [v.state.identity.uuid for v, _ in reads if v.state.identity.uuid]
        log = next((r.log for _, r in reads if r.log is not None and r.log.net), None) \
            or next((r.log for _, r in reads if r.log is not None and r.log.lines), None)
        applied, findings = nccl_checks.check(settings, self._seen_by(first[0], node), gpus,
                                              log, multi_node)
        families.add(SETTINGS, [job_id, *(_label(getattr(settings, name))
                                          for name in nccl_settings.EXPORTED),
                                ",".join(applied)], 1)
        for check in sorted({f.check for f in findings}, key=nccl_checks.CHECKS.index):
            families.add(MISCONFIGURED, [job_id, check], 1)
        judged.update(settings={name: getattr(settings, name)
                                for name in nccl_settings.EXPORTED},
                      multi_node=multi_node, checked=list(applied),
                      findings=[asdict(f) for f in findings])
        return judged

    def _seen_by(self, view: stall.RankView, node: NodeFacts) -> NodeFacts:
        """The node as the rank sees it: a rank in a network namespace of its own (a pod
        without hostNetwork, a Multus interface) has its own interfaces, from its
        /proc/<pid>/net/dev; whether they are up is not known from there, so they count as up."""
        pid = view.state.identity.pid
        own = netclass.process_interfaces(self.env.procfs, pid)
        if own is None:
            return node
        return dataclasses.replace(node, netdevs=frozenset(own), netdevs_up=frozenset(own))

    def _node_facts(self) -> NodeFacts:
        now = time.monotonic()
        if self._node is not None and now - self._node[0] < NODE_FACTS_TTL:
            return self._node[1]
        paths, rails = placement(self._digests())
        facts = nccl_checks.read_node(self.env.sysfs, self.env.procfs, paths,
                                      len(pci.nvidia_gpus(self.env.sysfs)), rails)
        self._node = (now, facts)
        return facts


def placement(digests: list[Any]) -> tuple[dict[str, str], frozenset[str]]:
    """From the topology collector's digest: GPU uuid -> the PCIe path to its nearest NIC, and
    the RDMA devices that are some GPU's nearest NIC (the training rails)."""
    paths: dict[str, str] = {}
    rails: set[str] = set()
    for snapshot in digests:
        for labels, _ in _series(snapshot, "llmmon_gpu_nearest_nic_info"):
            if labels.get("uuid"):
                paths[labels["uuid"]] = labels.get("path", "")
            if labels.get("device"):
                rails.add(labels["device"])
    return paths, frozenset(rails)


def _series(snapshot: Mapping[str, Mapping[Any, float]],
            name: str) -> Iterable[tuple[dict[str, str], float]]:
    for labels, value in (snapshot.get(name) or {}).items():
        yield dict(labels), value


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 3, 6] -> '0-3,6'."""
    out: list[str] = []
    for rank in sorted(set(ranks)):
        if out and out[-1].split("-")[-1] == str(rank - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{rank}"
        else:
            out.append(str(rank))
    return ",".join(out)


def _label(value: str) -> str:
    return value if len(value) <= LABEL_MAX else value[:LABEL_MAX - 1] + "…"


def _gdr(value: bool | None) -> str:
    return "" if value is None else str(int(value))
