"""A synchronous data-parallel (FSDP) training job: its collectives, steps and allocator memory.

Every step issues all-gathers then reduce-scatters of 1 GiB in the default process group.  A
collective starts on each rank when that rank enqueues it (the common schedule plus a little
jitter, plus lateness for a straggler) and completes for everyone once the last rank arrived
and the data moved, so each rank's recorded duration includes its wait for the latest peer, as
Flight Recorder durations do under TORCH_NCCL_ENABLE_TIMING=1.  The numbers give an 8B-model
step of ~1.9 s at ~42 % MFU on H200s.  Times are wall-clock: the daemon compares them with its
own clock.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from llmmon_reporter.stepstats import STEP_BUCKETS

STEP_SECONDS = 1.9
COLLECTIVES_PER_STEP = 8  # half all-gathers (parameters), half reduce-scatters (gradients)
ELEMENTS = 1 << 29  # per collective, the unsharded tensor
DTYPE_BYTES = {"BFloat16": 2, "Half": 2, "Float": 4}
# Bus bandwidth, bytes/s: NVLink within a node, 8x400G RoCE after tuning across
# (docs/design.md#reference-bus-bandwidth).
NVLINK_BANDWIDTH, ROCE_BANDWIDTH = 400e9, 330e9
JITTER = 0.0002  # seconds of enqueue spread between healthy ranks
PARAMETERS = 8e9
TOKENS_PER_STEP = 4 * 4096  # per rank
GIB = 1 << 30
RESERVED = 100 * GIB  # PyTorch's cache of a healthy rank (of the H200's 140 GiB)
INACTIVE_SPLIT = 0.4 * GIB
RING = 200  # Flight Recorder entries kept per rank (TORCH_NCCL_TRACE_BUFFER_SIZE)
CATCH_UP_LIMIT = 5.0  # a job stalled longer than this resumes now instead of replaying
COLLECTIVES = ("nccl:_allgather_base", "nccl:_reduce_scatter_base")


@dataclass
class JobEffects:
    """What the active scenarios do to the job this tick; rebuilt every tick."""

    slowdown: float = 1.0  # step time multiplier (a starving data loader)
    starved: bool = False  # GPUs alternate compute with waiting for input
    stopped_rank: int | None = None  # stops issuing collectives: a hang
    late: dict[int, float] = field(default_factory=dict)  # rank -> seconds late to each one
    dtype: str = "BFloat16"
    nonfinite_every: int = 0  # every Nth step's loss is NaN (0: never)
    dead: bool = False  # the job's processes are gone (torchrun tore it down)
    memory: dict[int, tuple[float, float]] = field(default_factory=dict)  # reserved, split
    retries: Counter[int] = field(default_factory=Counter)  # new allocator retries per rank
    ooms: Counter[int] = field(default_factory=Counter)


@dataclass
class Rank:
    rank: int
    local_rank: int
    node: int  # index of the node it runs on
    uuid: str  # of its GPU, so the daemon joins rank and GPU
    pid: int
    enqueued: int = 0
    started: int = 0
    completed: int = 0
    next_record: int = 0
    ring_size: int = RING
    ring: deque[dict[str, Any]] = field(init=False)
    pending: dict[str, Any] | None = None  # the collective it waits in while the job hangs
    steps: int = 0
    tokens: float = 0.0
    flops: float = 0.0
    nonfinite: int = 0
    step_counts: list[int] = field(default_factory=lambda: [0] * (len(STEP_BUCKETS) + 1))
    step_seconds: float = 0.0
    retries: int = 0
    ooms: int = 0
    memory: tuple[float, float, float] = (RESERVED, 0.8 * RESERVED, INACTIVE_SPLIT)

    def __post_init__(self) -> None:
        self.ring = deque(maxlen=self.ring_size)

    def restart(self, pid: int) -> None:
        """A new process for this rank: its reporter and allocator start from scratch."""
        fresh = Rank(self.rank, self.local_rank, self.node, self.uuid, pid,
                     ring_size=self.ring_size)
        self.__dict__.update(fresh.__dict__)


@dataclass
class _InFlight:
    seq: int
    done: float
    entries: dict[int, dict[str, Any]]  # rank -> entry, appended to its ring once done


class Job:
    def __init__(self, job_id: str, ranks: list[Rank], now: float, seed: int = 0) -> None:
        self.job_id = job_id
        self.ranks = ranks
        self.world_size = len(ranks)
        self.bandwidth = (NVLINK_BANDWIDTH if len({r.node for r in ranks}) == 1
                          else ROCE_BANDWIDTH)
        self.alive = True
        self.state = "running"  # running | starved | hung | dead
        self.slowdown = 1.0
        self.seq = 0
        self.in_step = 0
        self.step_started = now
        self.next_at = now
        self.blocked: tuple[int, int] | None = None  # (seq, rank that never enqueued it)
        self._inflight: list[_InFlight] = []
        self._random = random.Random(seed)
        self._restarts = 0

    def rank_on(self, node: int, local_rank: int) -> Rank:
        for rank in self.ranks:
            if rank.node == node and rank.local_rank == local_rank:
                return rank
        raise ValueError(f"job {self.job_id} has no local rank {local_rank} on node {node}")

    def bus_bytes_per_second(self) -> float:
        """Average collective traffic of one rank while the job progresses."""
        if self.state not in ("running", "starved"):
            return 0.0
        per_step = COLLECTIVES_PER_STEP * ELEMENTS * 2 * (self.world_size - 1) / self.world_size
        return per_step / (STEP_SECONDS * self.slowdown)

    # the tick --------------------------------------------------------------------------
    def advance(self, now: float, effects: JobEffects) -> None:
        self.slowdown = effects.slowdown
        if effects.dead:
            self.alive, self.state, self._inflight, self.blocked = False, "dead", [], None
            return
        if not self.alive:
            self._restart(now)
        if self.blocked is not None:
            if effects.stopped_rank == self.blocked[1]:
                self._memory(effects, now)
                return
            self._release(now, effects)
        if now - self.next_at > CATCH_UP_LIMIT:
            self.next_at = self.step_started = now
        while self.next_at <= now:
            if effects.stopped_rank is not None:
                self._hang(effects.stopped_rank, now)
                break
            self._collective(effects)
        self._resolve(now)
        self._memory(effects, now)
        if self.blocked is None:
            self.state = "starved" if effects.starved else "running"

    def _restart(self, now: float) -> None:
        """torchrun brings the job back: new processes, sequence numbers from zero."""
        self._restarts += 1
        for rank in self.ranks:
            rank.restart(rank.pid + 1000 * self._restarts)
        self.alive, self.state, self.seq, self.in_step = True, "running", 0, 0
        self.next_at = self.step_started = now

    def _entry(self, rank: Rank, seq: int, coll: str, dtype: str, created: float,
               duration: float | None) -> dict[str, Any]:
        shard, whole = [ELEMENTS // self.world_size], [ELEMENTS]
        gather = "allgather" in coll
        entry: dict[str, Any] = {
            "record_id": rank.next_record, "pg_id": 0, "process_group": ["0", "default_pg"],
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": coll,
            "time_created_ns": int(created * 1e9),
            "input_sizes": [shard if gather else whole], "input_dtypes": [dtype],
            "output_sizes": [whole if gather else shard], "output_dtypes": [dtype],
            "state": "started", "retired": False, "timeout_ms": 600000, "is_p2p": False,
            "thread_name": "pt_main_thread", "thread_id": str(140000000000000 + rank.pid),
            "frames": []}
        rank.next_record += 1
        if duration is not None:
            entry.update(state="completed", retired=True, duration_ms=duration * 1000,
                         time_discovered_started_ns=int(created * 1e9),
                         time_discovered_completed_ns=int((created + duration) * 1e9))
        return entry

    def _transfer(self, dtype: str) -> float:
        size = ELEMENTS * DTYPE_BYTES.get(dtype, 2)
        return size * (self.world_size - 1) / self.world_size / self.bandwidth

    def _collective(self, effects: JobEffects) -> None:
        self.seq += 1
        coll = COLLECTIVES[self.in_step * 2 // COLLECTIVES_PER_STEP]
        arrive = {r.rank: self.next_at + self._random.uniform(0, JITTER)
                  + effects.late.get(r.rank, 0.0) for r in self.ranks}
        transfer = self._transfer(effects.dtype)
        done = max(arrive.values()) + transfer
        entries = {}
        for rank in self.ranks:
            rank.enqueued = rank.started = self.seq
            entries[rank.rank] = self._entry(rank, self.seq, coll, effects.dtype,
                                             arrive[rank.rank], done - arrive[rank.rank])
        self._inflight.append(_InFlight(self.seq, done, entries))
        self.in_step += 1
        if self.in_step == COLLECTIVES_PER_STEP:
            self._step(done, effects)
        compute = STEP_SECONDS * effects.slowdown / COLLECTIVES_PER_STEP - transfer
        self.next_at = done + max(compute, 0.0)

    def _step(self, end: float, effects: JobEffects) -> None:
        elapsed = end - self.step_started
        self.step_started, self.in_step = end, 0
        for rank in self.ranks:
            rank.steps += 1
            rank.step_counts[bisect.bisect_left(STEP_BUCKETS, elapsed)] += 1
            rank.step_seconds += elapsed
            rank.tokens += TOKENS_PER_STEP
            rank.flops += 6 * PARAMETERS * TOKENS_PER_STEP
            if effects.nonfinite_every and rank.steps % effects.nonfinite_every == 0:
                rank.nonfinite += 1

    def _resolve(self, now: float) -> None:
        """Collectives whose data has moved are completed, and enter the ring."""
        while self._inflight and self._inflight[0].done <= now:
            finished = self._inflight.pop(0)
            for rank in self.ranks:
                rank.completed = finished.seq
                rank.ring.append(finished.entries[rank.rank])

    def _hang(self, culprit: int, now: float) -> None:
        """Every rank but `culprit` enqueues the next collective and waits in it."""
        self._resolve(float("inf"))
        self.seq += 1
        coll = COLLECTIVES[self.in_step * 2 // COLLECTIVES_PER_STEP]
        for rank in self.ranks:
            if rank.rank != culprit:
                rank.enqueued = rank.started = self.seq
                rank.pending = self._entry(rank, self.seq, coll, "BFloat16", now, None)
        self.blocked, self.state = (self.seq, culprit), "hung"

    def _release(self, now: float, effects: JobEffects) -> None:
        """The culprit finally enqueues; the collective everyone waited in completes."""
        assert self.blocked is not None
        seq, _ = self.blocked
        transfer = self._transfer(effects.dtype)
        entries = {}
        for rank in self.ranks:
            created = rank.pending["time_created_ns"] / 1e9 if rank.pending else now
            rank.enqueued = rank.started = seq
            entries[rank.rank] = self._entry(rank, seq, rank.pending["profiling_name"]
                                             if rank.pending else COLLECTIVES[0],
                                             effects.dtype, created, now + transfer - created)
            rank.pending = None
        self._inflight.append(_InFlight(seq, now + transfer, entries))
        self.blocked = None
        self.next_at = now + transfer

    def _memory(self, effects: JobEffects, now: float) -> None:
        """Allocated memory rises through the forward pass and falls through the backward."""
        phase = ((now - self.step_started) / (STEP_SECONDS * effects.slowdown)) % 1.0
        swing = 1 - abs(2 * phase - 1)
        for rank in self.ranks:
            reserved, split = effects.memory.get(rank.rank, (RESERVED, INACTIVE_SPLIT))
            rank.memory = (reserved, RESERVED * (0.72 + 0.22 * swing), split)
            rank.retries += effects.retries.get(rank.rank, 0)
            rank.ooms += effects.ooms.get(rank.rank, 0)

    def load(self) -> str:
        """What the job's GPUs do: busy, starved, idle (hung, context held) or off."""
        return {"running": "busy", "starved": "starved", "hung": "idle"}.get(self.state, "off")
