"""What the daemon remembers about each rank between spool reads.

Reporters ship snapshots; the ledger turns them into what Prometheus needs: counters that only
grow (bytes and durations, each Flight Recorder record counted once per `record_id`), the time
a group last made progress (noted here, when `last_completed` changes), the enqueue time of
each recent sequence number (for in-flight ages and enqueue lag), and staleness.

Whatever the files hold, what it keeps is bounded: `max_ranks` ranks, `max_ranks_per_job` of
one job, per rank the groups of its current state (older group names are forgotten),
`MAX_INDEXED_SEQS` enqueue times and `MAX_SERIES_KEYS` counter series; samples left out by the
series budget are counted in `cut`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from llmmon.ranks import collectives, failure
from llmmon.ranks.validate import Activity, Collective, FrDump, Group, Progress, RankEntries, \
    RankState

# Collective duration buckets (seconds): from small NCCL ops (~4 us on an H200) to stalls, a
# decade apart: 8 series per (rank, pg, coll, dtype), not 12 (the half-decades cost 64 series
# of the 2,000-series node budget, docs/capacity.md; no shipped rule reads the buckets, the
# straggler score uses the mean).
DURATION_BUCKETS = (0.0001, 0.001, 0.01, 0.1, 1.0, 10.0, 60.0)
MAX_SERIES_KEYS = 64  # (pg, coll, dtype) combinations kept per rank
MAX_INDEXED_SEQS = 4096  # enqueue times remembered per rank, shared by its groups
# Marks: the enqueue time of a rank's newest collective whose sequence number is a multiple of
# one of these, exported so that the rules compare ranks across nodes at the same collective.
MARK_STEPS = (256, 4096, 65536)
MARK_EVERY = 120.0  # seconds: the largest step whose marks come at least this often is exported
MAX_ACTIVITY = 256  # activity samples remembered per rank (21 min at the default interval)
MAX_ENQUEUES = 16  # (write time, last enqueued) per group: the pace now, at the status cadence
MAX_INSIDE = 128  # (write time, a collective in flight) per group: where the ranks wait
# Process-group names a job may bring that none of its followed ranks has, per window: a real
# job names its groups once (a node's ranks of a 4-D mesh share a few dozen); a rank renaming
# its groups on every write would make Prometheus a new set of series each scrape.
NEW_GROUPS_PER_JOB = 128
NEW_GROUPS_WINDOW = 600.0  # seconds, monotonic

RankKey = tuple[str, int]  # job_id, rank
_V = TypeVar("_V")


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        index = next((i for i, bound in enumerate(DURATION_BUCKETS) if value <= bound),
                     len(DURATION_BUCKETS))
        self.counts[index] += 1
        self.total += value


@dataclass(slots=True)
class Enqueued:
    """One collective a rank enqueued; slotted: a full index is MAX_INDEXED_SEQS per rank."""

    created_ns: int
    coll: str
    dtype: str
    nbytes: int | None

    @property
    def signature(self) -> str:
        """What the rank issued: ranks of a group must agree on it at each sequence number."""
        size = "? B" if self.nbytes is None else f"{self.nbytes} B"
        return f"{self.coll} {size} {self.dtype}".rstrip()


@dataclass
class RankTrack:
    state: RankState
    mtime: float  # when the reporter last wrote (file mtime, on the collector's clock)
    uid: int = -1  # the owner of its spool file: whose budget of ranks it counts in
    progress_noted: dict[str, tuple[int, float]] = field(default_factory=dict)
    enqueue_noted: dict[str, tuple[int, float]] = field(default_factory=dict)
    index: dict[str, dict[int, Enqueued]] = field(default_factory=dict)  # pg -> seq -> ...
    dump_groups: dict[str, Group] = field(default_factory=dict)
    counted: set[int] = field(default_factory=set)
    max_record_id: int = -1
    missed: int = 0
    collective_bytes: dict[tuple[str, str, str], float] = field(default_factory=dict)
    bus_bytes: dict[tuple[str, str], float] = field(default_factory=dict)
    durations: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    marks: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # (pg, step) ->
    # (seq, created_ns) of the newest multiple of step seen
    overflow: int = 0  # samples not counted because the series budget was spent
    # (reporter write time, its activity counters): bytes moved over a stall's window
    activity: deque[tuple[float, Activity]] = field(
        default_factory=lambda: deque(maxlen=MAX_ACTIVITY))
    # pg -> (reporter write time, last enqueued sequence) of the states read (the ring comes
    # every 20 s, the status every second: llmmon.ranks.slowdown's pace now)
    enqueues: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    # pg -> (reporter write time, whether it had enqueued more than it completed) of the states
    # read: a slow link keeps ranks inside their collectives, a slow input pipeline before them
    inside: dict[str, deque[tuple[float, bool]]] = field(default_factory=dict)
    # pg -> (the index's version, llmmon.ranks.pace.timed_gaps of it)
    timed: dict[str, tuple[tuple[int, int], list[tuple[float, float]]]] = field(
        default_factory=dict)

    @property
    def pid(self) -> int:
        return self.state.identity.pid

    def groups(self) -> dict[str, Group]:
        """The reporter's own group list, else the Flight Recorder's pg_config."""
        return self.state.groups or self.dump_groups

    def age(self, now: float) -> float:
        return max(0.0, now - self.mtime)

    def last_progress(self, pg: str) -> float | None:
        noted = self.progress_noted.get(pg)
        return noted[1] if noted else None

    def inflight_age(self, pg: str, now: float) -> float:
        """Seconds since the oldest collective not yet completed was enqueued (0: none)."""
        progress = self.state.progress.get(pg)
        if progress is None or progress.enqueued <= progress.completed:
            return 0.0
        oldest = self.index.get(pg, {}).get(progress.completed + 1)
        return max(0.0, now - oldest.created_ns / 1e9) if oldest else 0.0

    # updates ----------------------------------------------------------------------------
    def last_enqueue(self, pg: str) -> float | None:
        """When the daemon saw the rank's last enqueued sequence number change (0: never)."""
        noted = self.enqueue_noted.get(pg)
        return noted[1] if noted else None

    def note_progress(self, now: float) -> None:
        """Note changed progress; forget groups the rank no longer reports."""
        self._forget_groups()
        for pg, group in self.state.progress.items():
            noted = self.progress_noted.get(pg)
            if noted is None or noted[0] != group.completed:
                self.progress_noted[pg] = (group.completed, now)
            noted = self.enqueue_noted.get(pg)
            if noted is None or noted[0] != group.enqueued:
                # first sight is not a change (0: never seen changing), unlike completions
                self.enqueue_noted[pg] = (group.enqueued, now if noted else 0.0)

    def _forget_groups(self) -> None:
        """Drop what is kept per group for groups gone from the state: memory stays bounded
        by the groups the rank reports now."""
        progress = self.state.progress
        self.progress_noted = _reported(self.progress_noted, progress)
        self.enqueue_noted = _reported(self.enqueue_noted, progress)
        self.index = _reported(self.index, progress)
        self.marks = {key: mark for key, mark in self.marks.items() if key[0] in progress}
        self.enqueues = _reported(self.enqueues, progress)
        self.inside = _reported(self.inside, progress)
        self.timed = _reported(self.timed, progress)

    def note_enqueued(self, entries: Iterable[Collective]) -> None:
        """Enqueue times of the groups the rank reports, the newest of each in its share."""
        progress = self.state.progress
        for entry in entries:
            if not entry.is_p2p and entry.pg in progress:
                self.index.setdefault(entry.pg, {})[entry.seq] = Enqueued(
                    entry.created_ns, entry.coll, entry.dtype, entry.nbytes)
                for step in MARK_STEPS:
                    if entry.seq % step == 0 and entry.seq > self.marks.get(
                            (entry.pg, step), (-1, 0))[0]:
                        self.marks[(entry.pg, step)] = (entry.seq, entry.created_ns)
        share = MAX_INDEXED_SEQS // max(1, len(self.index))
        for seqs in self.index.values():
            if len(seqs) > share:
                for seq in sorted(seqs)[: len(seqs) - share]:
                    del seqs[seq]

    def mark(self, pg: str) -> tuple[int, int] | None:
        """(seq, created_ns) of the newest mark of the largest step whose marks come at least
        every MARK_EVERY seconds at the group's pace here (ranks of a job keep one pace, so
        every node picks the same step; the smallest while the pace is not known)."""
        seqs = self.index.get(pg)
        if not seqs or len(seqs) < 2:
            return None
        first, last = min(seqs), max(seqs)
        span = (seqs[last].created_ns - seqs[first].created_ns) / 1e9
        rate = (last - first) / span if span > 0 else 0.0
        steps = [s for s in MARK_STEPS if s <= rate * MARK_EVERY] or [MARK_STEPS[0]]
        return self.marks.get((pg, steps[-1]))

    def count(self, dump: FrDump) -> None:
        """Add every finished record not counted before to the byte and duration counters."""
        first = dump.first_record
        if first < 0:
            return
        if self.max_record_id >= 0 and first > self.max_record_id + 1:
            self.missed += first - self.max_record_id - 1  # the ring wrapped between reads
        if dump.cut_record > first:  # the reporter left the ring's older new records out
            self.missed += max(0, dump.cut_record - max(first, self.max_record_id + 1))
        self.max_record_id = max(self.max_record_id, dump.last_record)
        self.counted = {record for record in self.counted if record >= first}
        groups = self.groups()
        for entry in dump.entries:
            if entry.record_id in self.counted or not _finished(entry, dump.progress):
                continue
            self.counted.add(entry.record_id)
            self._add(entry, groups.get(entry.pg))

    def _add(self, entry: Collective, group: Group | None) -> None:
        if entry.nbytes is not None and self._admit(self.collective_bytes,
                                                    (entry.pg, entry.coll, entry.dtype)):
            key = (entry.pg, entry.coll, entry.dtype)
            self.collective_bytes[key] = self.collective_bytes.get(key, 0.0) + entry.nbytes
        if entry.duration is None or not self._admit(self.durations, (entry.pg, entry.coll)):
            return
        self.durations.setdefault((entry.pg, entry.coll), Histogram()).observe(entry.duration)
        # Bus bytes only with a duration, so rate(bus bytes) / rate(duration sum) is busbw.
        if entry.nbytes is not None and group is not None:
            key = (entry.pg, entry.coll)
            self.bus_bytes[key] = self.bus_bytes.get(key, 0.0) + \
                entry.nbytes * collectives.bus_factor(entry.coll, group.size)

    def _admit(self, series: dict, key: tuple) -> bool:  # type: ignore[type-arg]
        if key in series or len(series) < MAX_SERIES_KEYS:
            return True
        self.overflow += 1
        return False


def _reported(by_pg: dict[str, _V], progress: dict[str, Progress]) -> dict[str, _V]:
    """The entries of `by_pg` whose group is in `progress`, in their order."""
    return {pg: value for pg, value in by_pg.items() if pg in progress}


def _finished(entry: Collective, progress: dict[str, Progress]) -> bool:
    """Done and not going to change: count it now.

    With NCCL timing an entry gets `duration_ms` when the watchdog retires it; a retired entry
    is done whatever pg_status says (gloo's completed number can lag one behind for good:
    llmmon_reporter.settle); without timing, the group's completed sequence number
    says a `completed` entry is done.
    """
    if entry.duration is not None or entry.retired:
        return True
    if entry.is_p2p:
        return entry.state == "completed"
    group = progress.get(entry.pg)
    if group is not None and entry.seq > group.completed:
        return False
    timing = group is not None and group.started >= 0
    return entry.state == "completed" and not timing


# Whether this daemon sees the process (pid, start ticks) running: a rank whose process is
# seen alive takes the place of one whose process is not, once the rank budget is spent.
Alive = Callable[[int, int], bool]


class Ledger:
    def __init__(self, max_ranks: int, max_ranks_per_job: int,
                 alive: Alive | None = None, max_ranks_per_uid: int | None = None) -> None:
        self.max_ranks = max_ranks
        self.max_ranks_per_job = max_ranks_per_job
        self.max_ranks_per_uid = max_ranks if max_ranks_per_uid is None else max_ranks_per_uid
        self.alive = alive
        self.tracks: dict[RankKey, RankTrack] = {}
        self.cut: Counter[str] = Counter()  # reason -> samples left out to bound memory
        self._new_groups: dict[str, deque[float]] = {}  # job -> when each new name came

    def _admit(self, key: RankKey, state: RankState, uid: int) -> bool:
        """Room for a new rank: within the budgets (all ranks, its job's, its file owner's),
        or in the place of a rank whose process is not seen alive (the oldest report first,
        within the budget that is spent) when this one's is: spool files that any local user
        can write must not keep a real job out by coming first."""
        job_full = sum(job == key[0] for job, _ in self.tracks) >= self.max_ranks_per_job
        uid_full = uid >= 0 and sum(t.uid == uid for t in self.tracks.values()) \
            >= self.max_ranks_per_uid
        if len(self.tracks) < self.max_ranks and not job_full and not uid_full:
            return True
        who = state.identity
        if self.alive is None or not self.alive(who.pid, who.start_ticks):
            return False
        scope = [(k, t) for k, t in self.tracks.items()
                 if (not job_full or k[0] == key[0]) and (not uid_full or t.uid == uid)]
        dead = [(t.mtime, k) for k, t in scope
                if not self.alive(t.pid, t.state.identity.start_ticks)]
        if not dead:
            return False
        del self.tracks[min(dead)[1]]
        self.cut["rank_replaced"] += 1  # by one whose process is seen alive
        return True

    def _within_group_budget(self, state: RankState) -> RankState:
        """`state` without the process groups that would pass its job's budget of new names
        (NEW_GROUPS_PER_JOB per NEW_GROUPS_WINDOW); names its job already follows stay."""
        job = state.identity.job_id
        named = state.progress.keys() | state.groups.keys()
        followed = {pg for (j, _), t in self.tracks.items() if j == job
                    for pg in t.state.progress.keys() | t.state.groups.keys()}
        new = sorted(named - followed)
        if not new:
            return state
        now, came = time.monotonic(), self._new_groups.setdefault(job, deque())
        while came and came[0] < now - NEW_GROUPS_WINDOW:
            came.popleft()
        room = max(0, NEW_GROUPS_PER_JOB - len(came))
        came.extend([now] * min(room, len(new)))
        refused = set(new[room:])
        if not refused:
            return state
        self.cut["group_churn"] += len(refused)
        inflight = state.inflight and dataclasses.replace(
            state.inflight, entries=tuple(e for e in state.inflight.entries
                                          if e.pg not in refused))
        return dataclasses.replace(
            state, progress={pg: p for pg, p in state.progress.items() if pg not in refused},
            groups={pg: g for pg, g in state.groups.items() if pg not in refused},
            inflight=inflight)

    def observe_state(self, state: RankState, mtime: float, now: float, uid: int = -1) -> bool:
        """Take a rank's newest state (`uid`: its file's owner, -1 unknown); False when the
        rank budget (all, its job's or its owner's) is spent.  The in-flight dump is indexed,
        not kept."""
        state = self._within_group_budget(failure.failed_in(state))
        key = (state.identity.job_id, state.identity.rank)
        track = self.tracks.get(key)
        if track is None or track.pid != state.identity.pid:
            if track is None and not self._admit(key, state, uid):
                return False
            # A new process for this rank: its record ids and sequences start over, but the
            # daemon's own byte and duration counters carry on (they never go backwards).
            previous = track
            track = self.tracks[key] = RankTrack(state, mtime)
            if previous is not None:
                track.collective_bytes, track.bus_bytes = (previous.collective_bytes,
                                                           previous.bus_bytes)
                track.durations = previous.durations
        track.state, track.mtime = dataclasses.replace(state, inflight=None), mtime
        track.uid = uid
        track.note_progress(now)
        for pg, group in state.progress.items():
            seen = track.enqueues.setdefault(pg, deque(maxlen=MAX_ENQUEUES))
            if not seen or seen[-1][0] < state.written_ns / 1e9:
                seen.append((state.written_ns / 1e9, group.enqueued))
                track.inside.setdefault(pg, deque(maxlen=MAX_INSIDE)).append(
                    (state.written_ns / 1e9, group.enqueued > group.completed))
        if state.activity is not None and (not track.activity
                                           or track.activity[-1][1] != state.activity):
            track.activity.append((state.written_ns / 1e9, state.activity))
        if state.inflight is not None:
            track.note_enqueued(state.inflight.entries)
        if state.exit is not None and state.exit.collective is not None:
            track.note_enqueued((state.exit.collective,))
        return True

    def counted(self, job_id: str, rank: int, pid: int) -> set[int]:
        """Record ids already counted for this process: its next dump need not parse them."""
        track = self.tracks.get((job_id, rank))
        return track.counted if track is not None and track.pid == pid else set()

    def observe_entries(self, entries: RankEntries) -> None:
        track = self.tracks.get((entries.job_id, entries.rank))
        if track is None or track.pid != entries.pid:
            return  # entries of a process whose state we do not follow
        track.dump_groups = entries.dump.groups or track.dump_groups
        track.note_enqueued(entries.dump.entries)
        overflow = track.overflow
        track.count(entries.dump)
        if track.overflow > overflow:
            self.cut["series"] += track.overflow - overflow

    def expire(self, now: float, drop_after: float) -> list[RankTrack]:
        """Forget ranks that have not reported for `drop_after` seconds; return them."""
        gone = [key for key, track in self.tracks.items() if track.age(now) > drop_after]
        dropped = [self.tracks.pop(key) for key in gone]
        for job in self._new_groups.keys() - {job for job, _ in self.tracks}:
            del self._new_groups[job]
        return dropped

    def jobs(self) -> dict[str, list[RankTrack]]:
        by_job: dict[str, list[RankTrack]] = {}
        for (job, _), track in sorted(self.tracks.items()):
            by_job.setdefault(job, []).append(track)
        return by_job

    def enqueue_lag(self, tracks: list[RankTrack], pg: str) -> dict[int, float]:
        """rank -> its enqueue time of the newest sequence all these ranks enqueued, minus the
        median enqueue time of that sequence (seconds; positive = later than its peers)."""
        indexed = [t for t in tracks if t.index.get(pg)]
        if len(indexed) < 2:
            return {}
        common = set.intersection(*(set(t.index[pg]) for t in indexed))
        if not common:
            return {}
        seq = max(common)
        times = {t.state.identity.rank: t.index[pg][seq].created_ns for t in indexed}
        median = statistics.median_low(times.values()) + statistics.median_high(times.values())
        # in integer nanoseconds: a float of Unix-epoch nanoseconds keeps only ~256 ns
        return {rank: (2 * created - median) / 2e9 for rank, created in times.items()}
