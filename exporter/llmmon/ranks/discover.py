"""Training ranks that run without the reporter, found in procfs.

Most of a fleet's jobs were launched by people who will never add llmmon to their image or
command: Megatron, DeepSpeed, NeMo and torchtitan under torchrun, srun or a Kubernetes
operator.  Their ranks still carry torch's distributed environment (torchrun's RANK,
WORLD_SIZE, LOCAL_RANK, GROUP_RANK, TORCHELASTIC_RUN_ID, MASTER_ADDR/MASTER_PORT; Slurm's
SLURM_PROCID and SLURM_NTASKS for ranks srun starts itself), so the daemon finds them in
/proc/<pid>/environ and follows them as the reporter's ranks are followed: the same state
document (`ranks.validate.parse_state` checks it, so a hostile environment is cleaned the same
way), with the job id from the reporter's own rule (a rank seen both ways is one rank, and the
reporter's evidence wins), CPU and I/O from procfs, and the stack from py-spy.

What cannot be known from outside is left out: no process group, collective or memory
numbers, no GPU unless `uuid_of` names one.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from llmmon.ranks.validate import Notes, RankState, SchemaError, parse_state
from llmmon.sources import procenv, procstat
from llmmon.sources.fs import RootedFS
from llmmon.sources.pyspy import StackFrame
from llmmon_reporter import identity
from llmmon_reporter.layout import SCHEMA

# What marks a process as a torchrun (or torch.distributed.launch) worker, beside RANK and
# WORLD_SIZE, which other frameworks set too.
TORCH_MARKS = ("LOCAL_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR")
RECHECK = 30.0  # seconds before a process that is not a rank has its environment read again
MAX_CANDIDATES = 1024  # ranks followed from procfs at most (a node runs a few dozen)
SEEN_FROM_OUTSIDE = "none: seen from outside (procfs, py-spy)"  # the state's reporter.fr_api


@dataclass(frozen=True)
class Found:
    """A training rank's process, as procfs shows it."""

    pid: int
    start_ticks: int
    uid: int
    job_id: str
    rank: int
    world_size: int
    local_rank: int
    pod: str
    namespace: str


def rank_of(env: Mapping[str, str], loads_torch: Callable[[], bool]) -> tuple[int, int] | None:
    """(rank, world size) of a torch.distributed process, or None.  torchrun's workers carry
    RANK and WORLD_SIZE with one of TORCH_MARKS; a Slurm task without them (srun starting the
    ranks, the script reading SLURM_PROCID) counts only once it has torch loaded (`loads_torch`,
    a read of its maps), so a Slurm job's shell or data script is not a rank."""
    rank, world = env.get("RANK", ""), env.get("WORLD_SIZE", "")
    if rank.isdigit() and world.isdigit():
        if not any(env.get(mark) for mark in TORCH_MARKS):
            return None
    else:
        rank, world = env.get("SLURM_PROCID", ""), env.get("SLURM_NTASKS", "")
        if not (rank.isdigit() and world.isdigit() and env.get("SLURM_JOB_ID")) \
                or not loads_torch():
            return None
    if not int(rank) < int(world) <= 1 << 20:
        return None
    return int(rank), int(world)


def job_of(env: Mapping[str, str], ppid: int) -> str:
    """The reporter's job id rule (llmmon_reporter.identity.job_id), for another process:
    LLMMON_JOB, the torchelastic run id, the Slurm job, the rendezvous endpoint, else the host
    and the parent (the launcher) of the process."""
    found = identity.job_from_env(env)
    if found:
        return found
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if addr and port:
        return identity.rendezvous_job(f"{addr}:{port}")
    return f"{env.get('HOSTNAME') or socket.gethostname()}-{ppid}"


@dataclass
class Scanner:
    """Finds the ranks in procfs.  A rank's environment is read once (it is the one it
    started with) and its stat every scan; another process is looked at again only after
    RECHECK (it may have been read between fork and exec, which keep the start time, when it
    still had its launcher's environment), so a scan of a node's thousands of processes reads
    the new ones and the ranks."""

    procfs: RootedFS
    known: dict[int, tuple[int, Found | None, float]] = field(default_factory=dict)  # pid ->
    # (start ticks, the rank it is or None, when read)

    def scan(self, now: float, skip: Iterable[int] = ()) -> list[Found]:
        """The training ranks among the processes, but those in `skip` (followed through the
        reporter).  A rank's children inherit its environment (DataLoader workers, compile
        workers): only the topmost process of a (job, rank) is the rank."""
        skipped = set(skip)
        seen: dict[int, tuple[Found, int]] = {}  # pid -> (found, ppid)
        known: dict[int, tuple[int, Found | None, float]] = {}
        for pid in procenv.pids(self.procfs):
            cached = self.known.get(pid)
            if cached and cached[1] is None and now - cached[2] < RECHECK:
                known[pid] = cached  # not a rank, looked at lately: not even its stat is read
                continue
            stat = procstat.read(self.procfs, pid)
            if stat is None or stat.ended:
                continue
            if cached and cached[0] == stat.start_ticks and cached[1] is not None:
                known[pid] = cached
            else:
                known[pid] = (stat.start_ticks, self._found(pid, stat), now)
            found = known[pid][1]
            if found is not None and pid not in skipped and len(seen) < MAX_CANDIDATES:
                seen[pid] = (found, stat.ppid)
        self.known = known
        out: dict[tuple[str, int], Found] = {}
        for found, ppid in seen.values():
            parent = seen.get(ppid)
            if parent is not None and (parent[0].job_id, parent[0].rank) == (found.job_id,
                                                                              found.rank):
                continue  # a worker process of the rank
            key = (found.job_id, found.rank)
            if key not in out or out[key].start_ticks < found.start_ticks:
                out[key] = found  # a restarted rank: the newer process
        return sorted(out.values(), key=lambda f: (f.job_id, f.rank))

    def _found(self, pid: int, stat: procstat.ProcStat) -> Found | None:
        env = procenv.environ(self.procfs, pid)
        if env is None:
            return None
        where = rank_of(env, lambda: procenv.maps_mention(self.procfs, pid, "libtorch"))
        if where is None:
            return None
        rank, world = where
        return Found(pid, stat.start_ticks, procenv.owner(self.procfs, pid),
                     job_of(env, stat.ppid), rank, world, identity.local_rank(env, rank),
                     env.get("POD_NAME", "").strip() or env.get("HOSTNAME")
                     or socket.gethostname(), env.get("POD_NAMESPACE", ""))


@dataclass
class Seen:
    """What the daemon noted of a process between scans (procfs counts, it does not date)."""

    main: procstat.ProcStat | None = None  # its main (training) thread
    moved: procenv.ProcIO | None = None
    cpu_active: float = 0.0  # when the main thread's CPU time last moved
    io_active: float = 0.0  # when its I/O counters last moved

    def observe(self, main: procstat.ProcStat | None, moved: procenv.ProcIO | None,
                now: float) -> None:
        if main is not None and (self.main is None or main.cpu_seconds != self.main.cpu_seconds):
            self.cpu_active = now
        if moved is not None and (self.moved is None or (moved.read_bytes, moved.written_bytes)
                                  != (self.moved.read_bytes, self.moved.written_bytes)):
            self.io_active = now
        self.main, self.moved = main or self.main, moved or self.moved


@dataclass
class Follower:
    """Turns each scan into the state documents the reporter would have written."""

    procfs: RootedFS
    seen: dict[tuple[int, int], Seen] = field(default_factory=dict)  # (pid, start) ->

    def observe(self, found: list[Found], now: float) -> dict[int, Seen]:
        """Read each rank's main thread and I/O now (pid -> what is noted of it); processes
        no longer found are forgotten."""
        live = {(rank.pid, rank.start_ticks) for rank in found}
        self.seen = {k: v for k, v in self.seen.items() if k in live}
        out = {}
        for rank in found:
            seen = self.seen.setdefault((rank.pid, rank.start_ticks), Seen())
            # the training thread is the process' first: its CPU, not gloo's or NCCL's threads'
            seen.observe(procstat.read(self.procfs, rank.pid, rank.pid),
                         procenv.io(self.procfs, rank.pid), now)
            out[rank.pid] = seen
        return out

    def states(self, found: list[Found], now: float,
               stacks: Mapping[int, tuple[StackFrame, ...]],
               notes: Notes) -> list[tuple[Found, RankState]]:
        """Each rank's state as of `now`, as last observed (`stacks`: pid -> the stack to
        show, if any).  A document the parser refuses (a hostile environment) is left out and
        noted."""
        out = []
        for rank in found:
            seen = self.seen.get((rank.pid, rank.start_ticks)) or Seen()
            doc = _document(rank, seen, now, stacks.get(rank.pid))
            try:
                out.append((rank, parse_state(json.dumps(doc).encode(), notes)))
            except SchemaError as exc:
                notes.drop(f"pid {rank.pid}: {exc}")
        return out


def _document(rank: Found, seen: Seen, now: float,
              stack: tuple[StackFrame, ...] | None) -> dict[str, object]:
    doc: dict[str, object] = {
        "schema": SCHEMA, "kind": "state", "written_ns": int(now * 1e9),
        "identity": {"job_id": rank.job_id, "rank": rank.rank, "local_rank": rank.local_rank,
                     "world_size": rank.world_size, "pod": rank.pod,
                     "namespace": rank.namespace, "pid": rank.pid, "uuid": "",
                     "gpu_name": "", "allocator_config": "", "start_ticks": rank.start_ticks},
        "reporter": {"fr_api": SEEN_FROM_OUTSIDE}}
    if seen.main is not None and seen.moved is not None:
        doc["activity"] = {
            "cpu_seconds": seen.main.cpu_seconds, "read_bytes": seen.moved.read_bytes,
            "written_bytes": seen.moved.written_bytes,
            "voluntary_switches": seen.moved.voluntary_switches,
            "involuntary_switches": seen.moved.involuntary_switches,
            "cpu_active_ns": int(seen.cpu_active * 1e9),
            "io_active_ns": int(seen.io_active * 1e9)}
    if stack:
        doc["stack"] = [{"file": f.file, "line": f.line, "function": f.function,
                         "module": f.module} for f in stack]
    return doc
