"""TCP loss in the network namespaces a job's ranks run in, read through the ranks' own /proc.

A daemon in the host's network namespace sees the host's TCP counters, not a pod's: the ranks'
/proc/<pid>/net holds their namespace's.  Ranks sharing a namespace (the ranks of one pod) are
read once; a pid is read only while the PID watch trusts it (seen alive with the start time the
reporter wrote), so a number reused by another process is never read as the rank.  The namespace
is named by the pod of its lowest rank, or `host` when it is the daemon's own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from llmmon.ranks.liveness import Process
from llmmon.sources import tcpstats
from llmmon.sources.fs import RootedFS, SourceError

HOST = "host"
MAX_SAMPLES = 64  # per namespace: over five minutes at the collector's 5 s


@dataclass(frozen=True)
class Member:
    rank: int
    pid: int
    pod: str
    process: Process | None


@dataclass(frozen=True)
class Loss:
    """Retransmitted segments over a window, in one namespace of the job."""

    netns: str
    retransmitted: int
    sent: int
    seconds: float

    @property
    def share(self) -> float:
        return self.retransmitted / self.sent if self.sent > 0 else 0.0

    def json(self) -> dict[str, object]:
        return {"netns": self.netns, "retransmitted": self.retransmitted,
                "segments_sent": self.sent, "share": round(self.share, 4),
                "window_seconds": round(self.seconds, 1)}


@dataclass
class _Namespace:
    label: str
    samples: deque[tuple[float, tcpstats.TcpStats]]


class TcpWatch:
    def __init__(self, procfs: RootedFS) -> None:
        self.procfs = procfs
        try:  # the daemon's own namespace: a job in it (hostNetwork) is labelled `host`
            self._own = tcpstats.namespace(RootedFS("/proc"), "self")
        except SourceError:
            self._own = ""
        self._jobs: dict[str, dict[str, _Namespace]] = {}

    def read(self, jobs: dict[str, list[Member]], now: float) -> list[tuple[str, str]]:
        """Sample every job's namespaces; returns (key, problem) for what could not be read."""
        problems: list[tuple[str, str]] = []
        seen: dict[str, dict[str, _Namespace]] = {}
        for job_id, members in jobs.items():
            known = self._jobs.get(job_id, {})
            mine: dict[str, _Namespace] = {}
            for member in sorted(members, key=lambda m: m.rank):
                if member.process is None or not member.process.visible \
                        or member.process.gone_at is not None:
                    continue
                try:
                    ns = tcpstats.namespace(self.procfs, member.pid)
                    if ns in mine:
                        continue
                    stats = tcpstats.read(self.procfs, member.pid)
                except SourceError as exc:
                    problems.append((f"tcp/{job_id}/{member.rank}", str(exc)))
                    continue
                entry = known.get(ns) or _Namespace(
                    HOST if ns == self._own else member.pod or ns, deque(maxlen=MAX_SAMPLES))
                entry.samples.append((now, stats))
                mine[ns] = entry
            if mine:
                seen[job_id] = mine
        self._jobs = seen
        return problems

    def series(self) -> list[tuple[str, str, tcpstats.TcpStats]]:
        """(job_id, netns label, newest counters) of every namespace read last time."""
        return [(job_id, entry.label, entry.samples[-1][1])
                for job_id, spaces in sorted(self._jobs.items())
                for entry in sorted(spaces.values(), key=lambda e: e.label)]

    def loss(self, job_id: str, now: float, window: float) -> Loss | None:
        """The job's namespace with the largest share of retransmitted segments over the last
        `window` seconds (None: no namespace read twice in it)."""
        found = []
        for entry in self._jobs.get(job_id, {}).values():
            inside = [(t, s) for t, s in entry.samples if t >= now - window]
            if len(inside) < 2:
                continue
            (t0, first), (t1, last) = inside[0], inside[-1]
            sent, retransmitted = last.sent - first.sent, last.retransmitted - first.retransmitted
            if sent >= 0 and retransmitted >= 0:  # a namespace re-created under one id resets
                found.append(Loss(entry.label, retransmitted, sent, t1 - t0))
        return max(found, key=lambda loss: (loss.share, loss.retransmitted), default=None)
