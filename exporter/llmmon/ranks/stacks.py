"""The hang verdict of a job seen only from outside: its ranks' stacks stop changing.

ByteRobust's rule, per node: a healthy job's stacks change from step to step; when every rank's
stack has stayed the same for longer than the job itself has ever held one still while it
trained (times `stall_factor`, within [stall_floor, stall_after]), the job is hung.  The ranks
then fall in two sides: those blocked inside torch (a collective, a send or receive, the
autograd engine or a wait on a Work) wait for someone; those whose training thread is in the
job's own code (a loader, a lock, a sleep) or stopped wait for nobody, and are the roots.
Every rank inside the same collective is a symmetric stall: no rank here is to blame, and the
culprit is on another node, or in the GPUs or the network.  Ranks inside different
collectives, the fewer of them are the odd ones (a desync).

"Unchanged" is only credited between samples taken close together (MAX_GAP): two samples ten
seconds apart that look alike say nothing of the steps between them.  The sampler's default
interval is within it, so a healthy job's still periods are measured all along, and it samples
a job's ranks more quickly (`suspect`) once their last two samples look alike or they use no
CPU.  A rank in its own code is still only
while its process also uses no CPU: a job whose "compute" is a sleep at one line (or a long
kernel launched from one line) shows the same stack at every sample while it trains.  A rank
inside torch counts by its stack alone: an NCCL wait spins a CPU.

A stopped rank (state T: SIGSTOP, a debugger) is no phase of training: with one, the job is
hung at `stall_floor`, learned or not.  Until the job has been seen in its training loop (a rank back at a stack it had before, after
another: A, B, A; start-up's imports and rendezvous never come back), the threshold is the
ceiling: a job that starts with minutes of compilation or loading holds its stacks still from
the start.  After that it is `stall_factor` times the 90th percentile of the still periods,
not the longest: the rendezvous at start holds every rank still as long as the slowest rank
takes to start.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from llmmon.sources.pyspy import StackFrame

MAX_GAP = 6.0  # seconds: samples further apart do not show that nothing changed between them
MAX_EPISODES = 32  # healthy still periods remembered per job (the threshold is their max)
STILL_AFTER = 2.0  # seconds without CPU that make a job's ranks suspect
RECENT = 8  # distinct stacks remembered per process, to see it come back to one
LEARN_QUANTILE = 0.9  # of the still periods: one long one (the rendezvous at start) is not it

_C10D = "torch.distributed.distributed_c10d"
_OPS = frozenset((
    "send", "isend", "recv", "irecv", "batch_isend_irecv", "all_reduce",
    "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_coalesced",
    "all_gather_object", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "broadcast", "broadcast_object_list", "reduce", "gather", "scatter",
    "barrier", "monitored_barrier"))
INSIDE_TORCH = "torch"  # blocked inside torch, in no collective its frames name
# Point-to-point ops: a pipeline's stages wait in sends and receives that differ by design
P2P = frozenset(("send", "isend", "recv", "irecv", "batch_isend_irecv"))


Signature = tuple[tuple[str, int, str], ...]


def signature(frames: tuple[StackFrame, ...]) -> Signature:
    return tuple((f.file, f.line, f.function) for f in frames)


def blocked_in(frames: tuple[StackFrame, ...]) -> str | None:
    """The torch.distributed operation the thread is in (`all_reduce`), INSIDE_TORCH for a
    wait elsewhere inside torch, None when its innermost frame is the job's own code."""
    if not frames or not frames[0].module.startswith("torch"):
        return None
    for frame in frames:
        if not frame.module.startswith("torch"):
            break
        if frame.module == _C10D and frame.function in _OPS:
            return frame.function
    return INSIDE_TORCH


def collective(op: str | None) -> bool:
    """A named collective: what the ranks of a job must all be in at once."""
    return op is not None and op != INSIDE_TORCH and op not in P2P


@dataclass
class History:
    """A process' newest sample and the run of alike samples, close together, it ends."""

    newest: float = float("-inf")
    frames: tuple[StackFrame, ...] = ()
    sig: Signature = ()
    previous: Signature | None = None  # the sample before the newest
    since: float = float("-inf")  # the first sample of the run
    count: int = 0
    recent: deque[Signature] = field(default_factory=lambda: deque(maxlen=RECENT))
    looped: bool = False  # came back to a stack it had before, after another: a training loop

    def add(self, at: float, frames: tuple[StackFrame, ...]) -> None:
        if at <= self.newest:
            return
        sig = signature(frames)
        if self.count and sig != self.sig:
            self.looped = self.looped or sig in self.recent
            if self.sig in self.recent:
                self.recent.remove(self.sig)
            self.recent.append(self.sig)
        if not (self.count and sig == self.sig and at - self.newest <= MAX_GAP):
            self.since = at
        self.previous = self.sig if self.count else None
        self.newest, self.frames, self.sig = at, frames, sig
        self.count += 1

    @property
    def latest(self) -> tuple[StackFrame, ...] | None:
        return self.frames if self.count else None

    def unchanged(self) -> float:
        """Seconds the stack is known to have stayed the same: from the first to the newest
        of the alike samples, each within MAX_GAP of the one before."""
        return self.newest - self.since if self.count else 0.0

    def looks_still(self) -> bool:
        """The last two samples alike, however far apart: worth sampling quickly."""
        return self.count >= 2 and self.previous == self.sig

    def changed(self) -> bool:
        """The newest sample differs from the one before."""
        return self.count >= 2 and self.previous != self.sig


@dataclass(frozen=True)
class RankStack:
    """What the verdict needs of one rank: its samples, and what procfs says."""

    rank: int
    history: History
    stopped: bool
    cpu_still: float  # seconds its process used no CPU

    def still(self) -> float:
        """How long the rank is known to have done nothing: its stack unchanged, and, in its
        own code, no CPU either."""
        unchanged = self.history.unchanged()
        if self.stopped or blocked_in(self.history.latest or ()) is not None:
            return unchanged
        return min(unchanged, self.cpu_still)


@dataclass(frozen=True)
class StackVerdict:
    unchanged: float  # seconds every rank here has done nothing (RankStack.still)
    threshold: float
    stalled: bool
    roots: tuple[int, ...]
    waits: Mapping[int, str]  # rank -> the operation it is blocked in (INSIDE_TORCH: unnamed)
    suspect: bool  # sample this job's ranks quickly
    symmetric: str  # the operation every rank here waits in, when that is the stall
    disagree: bool  # ranks wait in different operations, none fewer than the others
    learned: bool = True  # the threshold is the job's own (a rank was seen in its loop)

    def json(self) -> dict[str, object]:
        return {"unchanged_seconds": self.unchanged, "threshold_seconds": self.threshold,
                "stalled": self.stalled, "roots": list(self.roots),
                "waits": {str(r): op for r, op in sorted(self.waits.items())},
                "suspect": self.suspect, "symmetric": self.symmetric, "disagree": self.disagree,
                "learned": self.learned}


@dataclass
class StackWatch:
    """One job's still periods: what it holds still while healthy sets its threshold."""

    floor: float
    factor: float
    ceiling: float
    episodes: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_EPISODES))
    looped: bool = False  # a rank here was seen in its training loop
    _newest: dict[int, float] = field(default_factory=dict)  # rank -> its newest sample seen
    _last: float = 0.0
    _stalled: bool = False

    def threshold(self) -> float:
        if not self.looped:
            return self.ceiling
        ordered = sorted(self.episodes) or [0.0]
        typical = ordered[int(LEARN_QUANTILE * (len(ordered) - 1))]
        return min(self.ceiling, max(self.floor, self.factor * typical))

    def _moved(self, ranks: list[RankStack]) -> bool:
        """Whether a stack changed among the samples new since the last judgement (a still
        period cut by a late sample, or by CPU, is not the job moving on)."""
        moved = False
        for rank in ranks:
            newest = rank.history.newest
            moved |= newest > self._newest.get(rank.rank, float("-inf")) and \
                rank.history.changed()
            self._newest[rank.rank] = newest
            self.looped |= rank.history.looped
        return moved

    def _observe(self, ranks: list[RankStack]) -> float:
        """How long every rank has been still; a still period the job ended is learned."""
        moved = self._moved(ranks)
        unchanged = min(r.still() for r in ranks)
        if moved and unchanged < self._last and not self._stalled:
            self.episodes.append(self._last)  # a still period that ended: the job moved on
        self._last = unchanged
        return unchanged

    def applied(self, ranks: list[RankStack]) -> float:
        """The threshold for these ranks: a stopped rank (SIGSTOP, a debugger) is no phase of
        training, so with one the floor is enough, learned or not."""
        if any(r.stopped for r in ranks):
            return min(self.threshold(), self.floor)
        return self.threshold()

    def judge(self, ranks: Iterable[RankStack]) -> StackVerdict:
        ranks = [r for r in ranks if r.history.count]
        if not ranks:
            return StackVerdict(0.0, self.threshold(), False, (), {}, False, "", False,
                                self.looped)
        unchanged = self._observe(ranks)
        threshold = self.applied(ranks)
        stalled = self._stalled = unchanged >= threshold
        suspect = all(r.history.looks_still() or r.cpu_still >= STILL_AFTER or r.stopped
                      for r in ranks)
        ops = {r.rank: blocked_in(r.history.latest or ()) for r in ranks}
        waits = {rank: op for rank, op in ops.items() if op is not None}
        roots, symmetric, disagree = _roots(ops, {r.rank for r in ranks if r.stopped})
        return StackVerdict(round(unchanged, 3), round(threshold, 3), stalled,
                            roots if stalled else (), waits, suspect,
                            symmetric if stalled else "", disagree and stalled, self.looped)


def _roots(ops: Mapping[int, str | None], stopped: set[int]) -> tuple[tuple[int, ...], str, bool]:
    """Ranks outside torch or stopped; else the ranks in the rarer named operations; else
    none, and the one operation all wait in (a symmetric stall) or that they disagree."""
    outside = {rank for rank, op in ops.items() if op is None}
    if outside or stopped:
        return tuple(sorted(outside | stopped)), "", False
    # a rank inside torch in no named operation (the autograd engine, a Work's wait) may wait
    # in any of them, and pipeline stages in their sends and receives: never the odd ones
    counts = Counter(op for op in ops.values() if collective(op))
    if len(counts) <= 1:
        return (), next(iter(counts), INSIDE_TORCH), False
    most = max(counts.values())
    common = [op for op, n in counts.items() if n == most]
    if len(common) > 1:
        return (), "", True
    return tuple(sorted(r for r, op in ops.items()
                        if collective(op) and op != common[0])), "", False
