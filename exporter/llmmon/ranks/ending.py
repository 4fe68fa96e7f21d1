"""A job's end is an end, not a hang: which rank went first, and how.

Each rank's end is known from its reporter's exit record (written at interpreter exit: an
unhandled exception, or a normal exit) or from procfs (the process vanished: a signal, or
os._exit).  A recorded end has a time; a vanished one lies between the reporter's last write
and the moment the daemon saw the pid gone.  The first end is the one that could be first
and explains the others best: a crash of the job's own code before a violent kill (SIGKILL,
SIGSEGV, SIGABRT), that before a polite one (SIGTERM: torchrun's teardown) or an unknown end, any
of them before a communication error (peers of a dead rank fail in their next collective), all
before a normal exit.  Ranks that all vanished within the same moment were stopped from outside
(torchrun's teardown of a job, preemption, a scheduler's kill): no rank is blamed.  Nor is one
when every end seen here is a peer's failure: the rank that went first is on another node.
A rank that went first by aborting because a peer issued another collective (gloo's answer to a
desync by size, `llmmon.ranks.desync.behind_abort`) is not blamed either: that peer is.  A rank
followed without the reporter that exited with status 1 raised an exception nobody read: its
own error, or a peer's failure seen from its side; it counts as an end from outside, not as the
rank that took the job down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from llmmon.ranks.discover import SEEN_FROM_OUTSIDE
from llmmon.ranks.failure import PEER_FAILURE
from llmmon.ranks.ledger import RankTrack
from llmmon.ranks.liveness import Process
from llmmon.ranks.spans import spans_text

# How torchrun tears the rest of a job down, and how schedulers preempt: SIGTERM (or SIGINT,
# SIGHUP).  A rank that died of another signal (SIGKILL from the OOM killer, SIGSEGV, SIGABRT)
# or with a non-zero status while the others got those was the first to go.
POLITE = (-15, -2, -1)


@dataclass(frozen=True)
class End:
    rank: int
    earliest: float  # Unix time
    latest: float
    how: str  # exit, exception or vanished
    code: int | None
    error: str
    unread: bool = False  # followed without the reporter: an exception's text is not known

    @property
    def cause(self) -> int:
        """0 explains the others best: own crash, a violent kill, an end from outside (a polite
        signal, unknown, or an exception nobody read), peer failure, normal exit."""
        if self.how == "exception":
            return 3 if PEER_FAILURE.search(self.error) else 0
        if self.how == "vanished":
            unknown = self.code is None or self.code in POLITE or (self.unread and self.code == 1)
            return 2 if unknown else 1
        return 4 if self.code == 0 else 0

    def words(self) -> str:
        if self.how == "exception":
            return f"code {self.code}: {self.error}"
        if self.how == "vanished":
            return (f"killed by signal {-self.code}" if self.code is not None and self.code < 0
                    else f"code {self.code}" if self.code is not None
                    else "no exit record: killed by a signal or os._exit")
        return f"code {self.code}"

    def json(self) -> dict[str, Any]:
        return {"rank": self.rank, "how": self.how, "code": self.code, "error": self.error,
                "earliest": round(self.earliest, 3), "latest": round(self.latest, 3)}


def end_of(track: RankTrack, process: Process | None) -> End | None:
    who, record = track.state.identity, track.state.exit
    if record is not None:
        return End(who.rank, record.at, record.at, record.how, record.code, record.error)
    if process is not None and process.gone_at is not None:
        return End(who.rank, min(track.mtime, process.gone_at), process.gone_at, "vanished",
                   process.exit_status, "",
                   track.state.health.fr_api == SEEN_FROM_OUTSIDE)
    return None


@dataclass(frozen=True)
class _Case:
    """The ends of one job, read once for the rules that word its end."""

    job: str
    ends: list[End]
    first: list[End]  # the ends that could be first with the best cause, earliest first
    best: int  # their cause (`End.cause`)
    ended: bool  # every local rank ended
    rest: str  # the ranks still running, as the tail of a sentence

    @classmethod
    def of(cls, job: str, ranks: list[int], ends: list[End]) -> _Case:
        ended = len(ends) == len(ranks)
        alive = sorted(set(ranks) - {e.rank for e in ends})
        latest = min(e.latest for e in ends)
        possible = [e for e in ends if e.earliest <= latest]
        best = min(e.cause for e in possible)
        first = sorted((e for e in possible if e.cause == best), key=lambda e: e.earliest)
        rest = "" if ended else f"; rank(s) {spans_text(alive)} still run"
        return cls(job, ends, first, best, ended, rest)


@dataclass(frozen=True)
class _Finding:
    """One sentence on the job's end and the rank(s) it blames (none: no rank here is)."""

    text: str
    named: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # more keys for /api/v1/ranks


def _all_normal(case: _Case) -> _Finding | None:
    if case.best != 4 or any(e.cause != 4 for e in case.ends):
        return None
    if case.ended:
        return _Finding(f"job {case.job} ended: every rank on this node exited normally")
    return _Finding(f"job {case.job}: rank(s) {spans_text([e.rank for e in case.ends])} "
                    f"exited normally{case.rest}")


def _peer_lost(case: _Case) -> _Finding | None:
    """Every end here is a peer's failure seen from this side: the rank that failed first is
    one this daemon does not follow (another node's), or the network between them."""
    if case.best != 3:
        return None
    lost = [e.rank for e in case.ends if e.cause == 3]
    return _Finding(f"job {case.job}: rank(s) {spans_text(lost)} lost a peer "
                    f"({case.first[0].error[:160]}): the rank that failed first is not on this "
                    f"node, or the network between them failed{case.rest}")


def _stopped_together(case: _Case) -> _Finding | None:
    """Several ranks vanished within the same moment: stopped from outside, none blamed."""
    if len(case.first) < 2 or case.best not in (1, 2):
        return None
    spread = max(e.latest for e in case.first) - min(e.earliest for e in case.first)
    return _Finding(f"job {case.job} ended: ranks {spans_text([e.rank for e in case.first])} "
                    f"stopped within {spread:.1f} s of each other without an exit record (a "
                    f"signal from outside: torchrun's teardown, preemption or a kill){case.rest}")


def _desync_abort(case: _Case, desync: Callable[[End], dict[str, Any] | None] | None
                  ) -> _Finding | None:
    """The first rank aborted on a peer's other collective: that peer is blamed."""
    found = desync(case.first[0]) if desync is not None else None
    if found is None:
        return None
    return _Finding(f"job {case.job}: {found['said']} (a desync); the rank that was to receive "
                    f"it ended first ({case.first[0].words()}) without completing it, as gloo "
                    f"aborts on a tensor of another size, and took the job down; fix the code "
                    f"path of rank(s) {spans_text(found['odd'])}; rank(s) "
                    f"{spans_text([e.rank for e in case.ends])} ended{case.rest}",
                    found["odd"], {"desync": found})


def _unread_first(case: _Case) -> _Finding | None:
    """The first end here is an exception nobody read (no reporter): not a verdict."""
    first = case.first[0]
    if not (first.unread and first.code == 1 and case.best == 2):
        return None
    return _Finding(f"job {case.job}: rank {first.rank} ended first here (code 1: an exception "
                    "the daemon cannot read without the reporter), its own error or a peer's "
                    f"failure; the rank that took the job down may be on another node"
                    f"{case.rest}")


def _first_out(case: _Case) -> _Finding:
    culprit = case.first[0]
    others = [e.rank for e in case.ends if e.rank != culprit.rank]
    after = f"; rank(s) {spans_text(others)} ended after it" if others else ""
    return _Finding(f"job {case.job}: rank {culprit.rank} exited first ({culprit.words()}) and "
                    f"took the job down{after}{case.rest}", [culprit.rank])


def verdict(job: str, ranks: list[int], ends: list[End],
            desync: Callable[[End], dict[str, Any] | None] | None = None
            ) -> dict[str, Any] | None:
    """The job's end for /api/v1/ranks: ended (every local rank), first, and one sentence;
    `desync`: the desync that made a rank abort (`desync.behind_abort`), asked of the first
    end only."""
    if not ends:
        return None
    case = _Case.of(job, ranks, ends)
    found = (_all_normal(case) or _peer_lost(case) or _stopped_together(case)
             or _desync_abort(case, desync) or _unread_first(case) or _first_out(case))
    return {"ended": case.ended, "first": found.named, **found.extra,
            "ranks": [e.json() for e in sorted(ends, key=lambda e: e.rank)],
            "summary": found.text}
