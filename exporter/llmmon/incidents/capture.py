"""What an incident holds, gathered from what the daemon already has: the job's evidence, its
ranks' stacks and environment, the GPU and network counters of the stall against the span
before it, and the kernel log since it began.

Each function returns one file's document; none raises for what one rank, device or file
lacks (that goes into the document or the summary's errors), so one bad part never costs the
others.
"""

from __future__ import annotations

import re
import time
from array import array
from collections import deque
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Iterable, Mapping

from llmmon.ranks import ending, stall
from llmmon.ranks.discover import SEEN_FROM_OUTSIDE
from llmmon.sources import procenv, procstat
from llmmon.sources.fs import RootedFS
from llmmon.sources.kmsg import KmsgError, read_kmsg

LabelKey = tuple[tuple[str, str], ...]
Snapshot = Mapping[str, Mapping[LabelKey, float]]  # sample name -> labels -> value
GPU_PREFIX = "llmmon_gpu_"
NETWORK_PREFIXES = ("llmmon_rdma_", "llmmon_nic_", "llmmon_netdev_")
# Series that name things rather than measure them, and per-process GPU series.
NOT_MEASURED = ("_info", "llmmon_gpu_process_", "llmmon_gpu_xid_last_timestamp_seconds")
ENV_NAMES = re.compile(r"^(NCCL_|TORCH_|CUDA_|PYTORCH_|MASTER_|SLURM_|LLMMON_|GLOO_|"
                       r"(WORLD_SIZE|RANK|LOCAL_RANK|GROUP_RANK|LOCAL_WORLD_SIZE|"
                       r"OMP_NUM_THREADS)$)")
SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
REDACTED = "<redacted>"
KMSG_LINES = 2000
KMSG_LEAD = 5.0  # seconds before the onset still shown: what led to it


@dataclass(frozen=True)
class Culprit:
    ranks: tuple[int, ...]
    cause: str  # root, cycle, remote, symmetric, stack_root, stack_symmetric, ended, ""
    text: str

    def json(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "cause": self.cause, "text": self.text}


def onset(job: stall.JobEvidence, now: float) -> float:
    """When the job stopped, as the daemon sees it: the longest-stalled group's last progress,
    the stacks' stillness, or the first end."""
    if job.end is not None and job.end.get("ranks"):
        return min(float(r["earliest"]) for r in job.end["ranks"])
    if job.stacks is not None and job.stacks.stalled:
        return now - job.stacks.unchanged
    still = [max(g.stalled_seconds, g.quiet_seconds) for g in job.groups
             if g.stalled or g.remote]
    return now - max(still, default=0.0)


def trigger(job: stall.JobEvidence) -> str | None:
    """What opens an incident of the job here, if anything: its verdict (stalled), ranks here
    waiting past the job's learned threshold for a rank on another node (waiting: that node's
    daemon judges the rank, and this one calls it stalled only at the ceiling, but its ranks'
    evidence is needed now, before the job dies), or an abnormal end (ended)."""
    if job.verdict.stalled:
        return "stalled"
    if any(g.remote and g.waiting and g.stalled_seconds >= g.threshold_seconds
           for g in job.groups):
        return "waiting"
    return "ended" if abnormal_end(job) else None


def abnormal_end(job: stall.JobEvidence) -> bool:
    """A rank of the job is blamed for its end, or one ended with an error or a violent
    signal; not a clean exit, nor every rank stopped from outside (a teardown, a preemption)."""
    if job.end is None:
        return False
    return bool(job.end.get("first")) or any(
        r.get("code") not in (0, None, *ending.POLITE) for r in job.end.get("ranks", ()))


def culprit(job: stall.JobEvidence) -> Culprit:
    """The job's one verdict as cause and ranks, in the vocabulary of the hang rules."""
    verdict = job.verdict
    if job.end is not None and not verdict.stalled:
        ranks = tuple(r for r in job.end.get("first") or () if isinstance(r, int))
        return Culprit(ranks, "ended", str(job.end.get("summary", "")))
    text = verdict.summary()
    if not verdict.stalled:
        waiting = [g for g in job.groups if g.remote and g.waiting]
        if waiting:
            return Culprit((), "remote", waiting[0].summary())
    if job.stacks is not None and verdict.stalled:
        if verdict.roots:
            return Culprit(verdict.roots, "stack_root", text)
        return Culprit((), "stack_symmetric" if job.stacks.symmetric else "", text)
    if verdict.roots:
        return Culprit(verdict.roots, "root", text)
    if verdict.graph.cycle:
        return Culprit(tuple(verdict.graph.cycle), "cycle", text)
    if verdict.graph.remote:
        return Culprit((), "remote", text)
    return Culprit((), "symmetric" if verdict.stalled else "", text)


def stacks(job: stall.JobEvidence) -> dict[str, Any]:
    """Each local rank's Python stack as the daemon last had it (the reporter's while the rank
    completes nothing; py-spy's for a rank without the reporter)."""
    ranks = {}
    for rank in job.ranks:
        state = rank.state
        source = "none" if state.stack is None else (
            "py-spy" if state.health.fr_api == SEEN_FROM_OUTSIDE else "reporter")
        ranks[str(rank.rank)] = {
            "source": source, "state": rank.doing.state, "where": rank.doing.where,
            "frames": [f._asdict() for f in state.stack or ()],
            "blocked": [w._asdict() for w in state.blocked]}
    return {"ranks": ranks}


def collectives(job: stall.JobEvidence, newest: int = 64) -> dict[str, Any]:
    """Each local rank's progress per group and its newest Flight Recorder records as its
    last report shipped them (those in flight at a stall), as the daemon holds them."""
    ranks = {}
    for rank in job.ranks:
        state = rank.state
        records = state.inflight.entries[-newest:] if state.inflight else ()
        ranks[str(rank.rank)] = {
            "progress": {pg: {"enqueued": p.enqueued, "started": p.started,
                              "completed": p.completed}
                         for pg, p in sorted(state.progress.items())},
            "records": [r._asdict() for r in records]}
    return {"ranks": ranks}


def environments(job: stall.JobEvidence, procfs: RootedFS) -> dict[str, Any]:
    """The NCCL, torch and launcher variables of each local rank, secrets redacted; read only
    from the process that is the rank (same pid and start time)."""
    found: dict[str, dict[str, str]] = {}
    errors: dict[str, str] = {}
    redacted: set[str] = set()
    for rank in job.ranks:
        who = rank.state.identity
        stat = procstat.read(procfs, who.pid)
        if stat is None or stat.ended or (who.start_ticks and stat.start_ticks != who.start_ticks):
            errors[str(rank.rank)] = f"pid {who.pid} is not the rank's process here (ended, " \
                                     "or in another PID namespace)"
            continue
        env = procenv.environ(procfs, who.pid)
        if env is None:
            errors[str(rank.rank)] = f"/proc/{who.pid}/environ is not readable (another " \
                                     "user's process without CAP_SYS_PTRACE?)"
            continue
        kept = {}
        for name, value in sorted(env.items()):
            if not ENV_NAMES.match(name):
                continue
            if SECRET.search(name):
                redacted.add(name)
                value = REDACTED
            kept[name] = value
        found[str(rank.rank)] = kept
    return {"ranks": found, "redacted": sorted(redacted), "error": errors}


SeriesKey = tuple[str, LabelKey]


class CounterRing:
    """The node's GPU and network series over the last `span` seconds, one snapshot every
    `every` seconds: what an incident compares the stall with. A snapshot is an array of
    doubles in the order of an index of its series, shared with the snapshots before it while
    the node's series do not change: a fat node's 7 minutes (1,100 series, 85 snapshots) hold
    about 1 MiB, where dicts of floats held 4."""

    def __init__(self, span: float = 420.0, every: float = 5.0) -> None:
        self.span = span
        self.every = every
        self._ring: deque[tuple[float, Mapping[SeriesKey, int], array]] = deque()

    def offer(self, at: float, snapshots: Iterable[Snapshot]) -> None:
        if self._ring and at - self._ring[-1][0] < self.every:
            return
        kept: dict[SeriesKey, float] = {}
        for snapshot in snapshots:
            for name, series in snapshot.items():
                if name.startswith((GPU_PREFIX, *NETWORK_PREFIXES)) and \
                        not any(part in name for part in NOT_MEASURED):
                    kept.update(((name, labels), value) for labels, value in series.items())
        index = self._ring[-1][1] if self._ring else {}
        if len(index) != len(kept) or any(key not in index for key in kept):
            index = {key: n for n, key in enumerate(kept)}
        values = array("d", bytes(8 * len(index)))
        for key, value in kept.items():
            values[index[key]] = value
        self._ring.append((at, index, values))
        while len(self._ring) > 2 and at - self._ring[0][0] > self.span:
            self._ring.popleft()

    def __len__(self) -> int:
        """Snapshots held."""
        return len(self._ring)

    def width(self) -> int:
        """Series in the newest snapshot."""
        return len(self._ring[-1][1]) if self._ring else 0

    def spans(self, start: float, now: float) -> tuple[tuple[float, float], tuple[float, float]]:
        """(before, during): the stall from its onset, and as long a span before it (at least
        10 s each), within what the ring holds."""
        length = max(now - start, 10.0)
        during = (now - length, now)
        oldest = self._ring[0][0] if self._ring else during[0]
        # a ring younger than the stall (the daemon started during it) has no span before it
        return (min(max(during[0] - length, oldest), during[0]), during[0]), during

    def _points(self, name: str, labels: LabelKey, span: tuple[float, float]
                ) -> list[tuple[float, float]]:
        key = (name, labels)
        return [(at, values[index[key]]) for at, index, values in self._ring
                if span[0] - self.every <= at <= span[1] + self.every and key in index]

    def measure(self, name: str, labels: LabelKey, span: tuple[float, float]) -> float | None:
        """A counter's increase over the span (a reset counts its new value), a gauge's mean."""
        points = self._points(name, labels, span)
        if not points:
            return None
        if not name.endswith("_total"):
            return round(fmean(v for _, v in points), 6)
        if len(points) < 2:
            return None
        return sum(b - a if b >= a else b for (_, a), (_, b) in zip(points, points[1:]))

    def series(self, prefixes: tuple[str, ...]) -> dict[str, set[LabelKey]]:
        out: dict[str, set[LabelKey]] = {}
        seen: set[int] = set()
        for _, index, _ in self._ring:
            if id(index) in seen:  # shared with the snapshot before
                continue
            seen.add(id(index))
            for name, labels in index:
                if name.startswith(prefixes):
                    out.setdefault(name, set()).add(labels)
        return out


def _sample_key(name: str, labels: LabelKey, identity: tuple[str, ...]) -> str:
    rest = ",".join(f'{k}="{v}"' for k, v in labels if k not in identity)
    return f"{name}{{{rest}}}" if rest else name


def gpus(ring: CounterRing, start: float, now: float) -> dict[str, Any]:
    """Per GPU, each measured series over the stall and before it; XIDs of the stall."""
    before, during = ring.spans(start, now)
    by_gpu: dict[tuple[str, str], dict[str, Any]] = {}
    for name, label_sets in sorted(ring.series((GPU_PREFIX,)).items()):
        for labels in sorted(label_sets):
            found = dict(labels)
            if "gpu" not in found:
                continue
            entry = by_gpu.setdefault((found["gpu"], found.get("uuid", "")), {
                "gpu": found["gpu"], "uuid": found.get("uuid", ""), "values": {}, "xids": []})
            pair = {"before": ring.measure(name, labels, before),
                    "during": ring.measure(name, labels, during)}
            entry["values"][_sample_key(name, labels, ("gpu", "uuid"))] = pair
            if name == "llmmon_gpu_xid_errors_total" and (pair["during"] or 0) > 0:
                entry["xids"].append({"xid": found.get("xid", ""), "count": pair["during"]})
    return {"spans": {"before": list(before), "during": list(during)},
            "gpus": [by_gpu[key] for key in sorted(by_gpu, key=lambda k: (_num(k[0]), k))]}


def network(ring: CounterRing, start: float, now: float) -> dict[str, Any]:
    """Per RDMA port, NIC and netdev, each counter's increase over the stall and before it."""
    before, during = ring.spans(start, now)
    ports: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for name, label_sets in sorted(ring.series(NETWORK_PREFIXES).items()):
        if not name.endswith("_total") and name != "llmmon_nic_driver_stat":
            continue
        kind = name.split("_")[1]
        for labels in sorted(label_sets):
            found = dict(labels)
            device = found.get("device", "")
            port = found.get("port", "")
            netdev = found.get("netdev", found.get("interface", ""))
            entry = ports.setdefault((kind, device, port, netdev), {
                "kind": kind, "device": device, "port": port, "netdev": netdev,
                "counters": {}})
            entry["counters"][_sample_key(name, labels, ("device", "port", "netdev",
                                                         "interface"))] = {
                "before": ring.measure(name, labels, before),
                "during": ring.measure(name, labels, during)}
    return {"spans": {"before": list(before), "during": list(during)},
            "ports": [ports[key] for key in sorted(ports)]}


def kernel_log(path: str, start: float, now: float) -> tuple[str, str | None]:
    """The kernel log lines since `start` (Unix time) as dmesg shows them, and why not."""
    try:
        records = read_kmsg(path)
    except KmsgError as exc:
        return "", f"kernel log: {exc.strerror}"
    boot_start = time.monotonic() - (now - start) - KMSG_LEAD
    lines = [f"[{r.seconds:12.6f}] {r.message}" for r in records if r.seconds >= boot_start]
    cut = len(lines) - KMSG_LINES
    if cut > 0:
        lines = [f"[llmmon: {cut} earlier lines left out]"] + lines[cut:]
    return "".join(line + "\n" for line in lines), None


def _num(text: str) -> int:
    return int(text) if text.isdigit() else 1 << 30
