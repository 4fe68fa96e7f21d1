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

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping

from prometheus_client.core import Metric

from llmmon.collector import Collector, Context, Environment
from llmmon.metrics import Families, MetricSpec
from llmmon.network import nccl_checks, nccl_log, nccl_settings
from llmmon.network.nccl_checks import NodeFacts
from llmmon.network.nccl_settings import NcclSettings
from llmmon.options import Option
from llmmon.ranks import stall
from llmmon.sources import pci, procenv, procroot
from llmmon.sources.fs import SourceError

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


@dataclass
class RankRead:
    """What was read of one rank's process (kept while the same process lives)."""

    settings: NcclSettings | None
    log: nccl_log.NcclLog | None = None
    log_signature: tuple[str, int, int] | None = None  # path, size, mtime of the last parse


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
        self._ranks: dict[tuple[int, int], RankRead] = {}
        self._node: tuple[float, NodeFacts] | None = None
        self._shared_dir = ""  # the dump directory, at the same path on the host and in pods
        self._lock = threading.Lock()
        self._judged: list[dict[str, Any]] = []  # the last run's jobs, for /api/v1/nccl

    def attach(self, evidence: Callable[[], stall.Evidence], fr_dir: str,
               digests: Callable[[], list[Any]]) -> None:
        """Follow the ranks collector's verdicts (which ranks run here, their processes and
        GPUs), its dump directory (where injected jobs write their NCCL log) and the
        sampler's digests (the topology collector's GPU-to-NIC paths)."""
        self._evidence = evidence
        self._shared_dir = fr_dir
        self._digests = digests

    def collect(self, ctx: Context) -> Iterable[Metric]:
        families = Families()
        if self._evidence is None:
            ctx.watching(0, "jobs (the ranks collector is disabled: no ranks to check)")
            return families
        jobs = [job for job in self._evidence().jobs if any(r.alive for r in job.ranks)]
        ctx.watching(len(jobs), "jobs")
        judged: list[dict[str, Any]] = []
        if not jobs:
            self._ranks.clear()
            with self._lock:
                self._judged = judged
            return families
        node = self._node_facts()
        live: set[tuple[int, int]] = set()
        for job in jobs:
            ranks = sorted((r for r in job.ranks if r.alive),
                           key=lambda r: (r.state.identity.local_rank, r.rank))
            reads = []
            for view in ranks:
                who = view.state.identity
                live.add((who.pid, who.start_ticks))
                reads.append((view, self._read_rank(ctx, job.job_id, view)))
            judged.append(self._export(families, job.job_id, reads, node))
        self._ranks = {k: v for k, v in self._ranks.items() if k in live}
        with self._lock:
            self._judged = judged
        return families

    def api(self) -> dict[str, Callable[[], Any]]:
        return {"nccl": self.judged}

    def judged(self) -> dict[str, Any]:
        """GET /api/v1/nccl: each job's settings, the checks that applied, each finding with
        its evidence and fix (what the metrics cannot carry), and what NCCL chose."""
        with self._lock:
            return {"jobs": list(self._judged)}

    def _export(self, families: Families, job_id: str,
                reads: list[tuple[stall.RankView, RankRead]], node: NodeFacts) -> dict[str, Any]:
        """The job's series; returns what /api/v1/nccl shows of it."""
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
        settings = next((r.settings for _, r in reads if r.settings is not None), None)
        if settings is None:
            return judged
        world = max(v.state.identity.world_size for v, _ in reads)
        multi_node = world > len(reads)
        gpus = [v.state.identity.uuid for v, _ in reads if v.state.identity.uuid]
        log = next((r.log for _, r in reads if r.log is not None and r.log.net), None) \
            or next((r.log for _, r in reads if r.log is not None and r.log.lines), None)
        applied, findings = nccl_checks.check(settings, node, gpus, log, multi_node)
        families.add(SETTINGS, [job_id, *(_label(getattr(settings, name))
                                          for name in nccl_settings.EXPORTED), ",".join(applied)], 1)
        for check in sorted({f.check for f in findings}, key=nccl_checks.CHECKS.index):
            families.add(MISCONFIGURED, [job_id, check], 1)
        judged.update(settings={name: getattr(settings, name) for name in nccl_settings.EXPORTED},
                      multi_node=multi_node, checked=list(applied),
                      findings=[asdict(f) for f in findings])
        return judged

    def _read_rank(self, ctx: Context, job_id: str, view: stall.RankView) -> RankRead:
        """The rank's settings (its environment, read once per process) and its NCCL log
        (parsed again only when the file changed)."""
        who = view.state.identity
        key = (who.pid, who.start_ticks)
        read = self._ranks.get(key)
        if read is None:
            # procfs has every variable NCCL reads; the reporter's copy of the NCCL_* ones
            # serves where the daemon may not read another user's environment
            env = procenv.environ(self.env.procfs, who.pid)
            if env is None and who.nccl_env is not None:
                env = dict(who.nccl_env)
            read = RankRead(None if env is None else NcclSettings.from_env(env))
            self._ranks[key] = read
            if env is None:
                ctx.error(f"{job_id}/{view.rank}/environ",
                          f"job {job_id} rank {view.rank}: /proc/{who.pid}/environ is not "
                          "readable (the daemon needs root or CAP_SYS_PTRACE) and no reporter "
                          "sent its NCCL variables: its NCCL settings are unknown")
        if read.settings is not None and read.settings.debug_file:
            self._read_log(ctx, job_id, view, read)
        return read

    def _read_log(self, ctx: Context, job_id: str, view: stall.RankView,
                  read: RankRead) -> None:
        """The rank's NCCL_DEBUG_FILE, through its own root; a file in the dump directory the
        node shares with its pods (where `llmmon launch` and the webhook put it) from the
        host where that root is out of reach."""
        who, procfs = view.state.identity, self.env.procfs
        assert read.settings is not None
        pattern = expand_debug_file(read.settings.debug_file,
                                    procroot.ns_pid(procfs, who.pid))
        bases = [procroot.root(procfs, who.pid)]
        if self._shared_dir and pattern.startswith(self._shared_dir.rstrip("/") + "/"):
            bases.append("/")
        problem = ""
        for base in bases:
            paths = procroot.find(base, pattern) if pattern else []
            if not paths:
                continue
            path = paths[-1]  # one rank, one process: more matches are restarts' leftovers
            try:
                signature = (path, *procroot.signature(base, path))
                if signature != read.log_signature:
                    text = procroot.read_owned(base, path, procenv.owner(procfs, who.pid),
                                               self.config["log_max_bytes"])
                    read.log, read.log_signature = nccl_log.parse(text), signature
                return
            except SourceError as exc:
                problem = str(exc)
        if problem:
            ctx.error(f"{job_id}/{view.rank}/nccl_log",
                      f"job {job_id} rank {view.rank}: NCCL log: {problem}")

    def _node_facts(self) -> NodeFacts:
        now = time.monotonic()
        if self._node is not None and now - self._node[0] < NODE_FACTS_TTL:
            return self._node[1]
        facts = nccl_checks.read_node(self.env.sysfs, self.env.procfs,
                                      gpu_paths(self._digests()),
                                      len(pci.nvidia_gpus(self.env.sysfs)))
        self._node = (now, facts)
        return facts


def expand_debug_file(template: str, pid: int) -> str:
    """NCCL_DEBUG_FILE as NCCL expands it (%h the host name, %p the process id, %% a per
    cent sign); the host name is the rank's own, which the daemon matches as `*`."""
    out, i = [], 0
    while i < len(template):
        char = template[i]
        if char == "%" and i + 1 < len(template):
            nxt = template[i + 1]
            out.append({"h": "*", "p": str(pid), "%": "%"}.get(nxt, char + nxt))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def gpu_paths(digests: list[Any]) -> dict[str, str]:
    """GPU uuid -> the PCIe path to its nearest NIC, from the topology collector's digest."""
    paths: dict[str, str] = {}
    for snapshot in digests:
        for labels, _ in _series(snapshot, "llmmon_gpu_nearest_nic_info"):
            if labels.get("uuid"):
                paths[labels["uuid"]] = labels.get("path", "")
    return paths


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
