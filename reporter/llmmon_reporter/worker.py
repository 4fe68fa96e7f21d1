"""The reporter thread: reads the Flight Recorder and allocator on cadences, writes the spool.

Rules it keeps, because it runs inside someone's training job:
- one low-priority daemon thread; nothing runs on the training thread except `step()`;
- it waits for torch.distributed to be initialised by the job and never imports torch itself;
- no collectives, no CUDA synchronisation, no CUDA calls that could create a context;
- every failure is caught and counted; it backs off exponentially and, after repeated
  failures, disables itself and says so in its file (and once in the log).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from llmmon_reporter import activity, blocked, entrylog, exitstatus, flight, groupids, identity, \
    layout, native, spoolfile
from llmmon_reporter.dumppipe import DumpPipe
from llmmon_reporter.timeslice import TimeSlice
from llmmon_reporter.settle import Settled
from llmmon_reporter.stepstats import StepStats

log = logging.getLogger("llmmon.reporter")

MAX_FAILURES = 10  # consecutive; with the default cadence that is ~2.5 minutes of retries
MAX_BACKOFF = 60.0  # seconds, and at most 30 status intervals


def _seconds(env: Mapping[str, str], key: str, default: float) -> float:
    try:
        value = float(env.get(key, default))
    except ValueError:
        return default
    return value if value > 0 else default


@dataclass(frozen=True)
class Cadence:
    """How often the reporter writes status, in-flight collectives and Flight Recorder entries:
    the default cadences at which its cost to the training thread meets its targets
    (docs/reporter.md); LLMMON_*_INTERVAL environment variables override them."""

    status: float = 1.0
    inflight: float = 5.0
    entries: float = 20.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Cadence:
        return cls(_seconds(env, "LLMMON_STATUS_INTERVAL", cls.status),
                   _seconds(env, "LLMMON_INFLIGHT_INTERVAL", cls.inflight),
                   _seconds(env, "LLMMON_ENTRIES_INTERVAL", cls.entries))


def _progress(status: bytes) -> dict[str, tuple[int, int]]:
    """pg -> (last enqueued, last completed) from a ~250-byte status dump."""
    groups = json.loads(status).get("pg_status") or {}
    return {str(pg): (int(s["last_enqueued_collective"]), int(s["last_completed_collective"]))
            for pg, s in groups.items()}


class _Session:
    """What the reporter learns once the job's default process group exists."""

    def __init__(self, torch: Any, env: Mapping[str, str], spool: str, pace: TimeSlice) -> None:
        dist = torch.distributed
        self.torch = torch
        self.c10d = dist.distributed_c10d
        self.nccl = "nccl" in str(dist.get_backend()).lower()
        api = flight.choose_api(torch._C._distributed_c10d, self.nccl)
        if api is None:
            raise RuntimeError("this torch has no Flight Recorder JSON dump (torch < 2.5)")
        self.flight = flight.FlightRecorder(torch._C._distributed_c10d, api,
                                            native.load(torch.__file__, api, env), pace)
        rank = dist.get_rank()
        self.identity = identity.identity(env, rank, dist.get_world_size())
        self.identity["start_ticks"] = activity.start_ticks()
        self.rank, self.pid = rank, os.getpid()
        self.env = env
        self.dir = layout.job_dir(spool, self.identity["job_id"])
        self.state_name = layout.state_name(rank, self.pid)
        self.log = entrylog.EntryLog(self.dir, layout.log_name(rank, self.pid), self.identity)
        self.device: int | None = None
        self.pgs: dict[str, dict[str, Any]] = {}
        self.pg_ids = groupids.GroupIds()
        self._pg_count = -1
        dump_prefix = (env.get("TORCH_FR_DUMP_TEMP_FILE")
                       or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"))
        self.dump_path = f"{dump_prefix}{rank}.json" if dump_prefix else None
        self.pipe: DumpPipe | None = None

    def open_pipe(self) -> None:
        """ProcessGroupNCCL opens its own dump pipe; other backends get ours."""
        prefix = self.env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
        if prefix and self.dump_path and not self.nccl:
            self.pipe = DumpPipe(f"{prefix}{self.rank}.pipe")

    def refresh(self) -> None:
        """Group metadata when the set of groups changed; the GPU once CUDA is up."""
        count = len(self.c10d._world.pg_names)
        if count != self._pg_count:
            self.pgs, self._pg_count = flight.process_groups(self.c10d), count
        if self.device is None and self.torch.cuda.is_initialized():
            self.device = identity.cuda_device(self.torch, self.env, self.identity["local_rank"])
            self.identity.update(identity.gpu(self.torch, self.device))

    def memory(self) -> dict[str, int] | None:
        if self.device is None:
            return None
        stats = self.torch.cuda.memory_stats(self.device)
        return {key: int(stats.get(key, 0)) for key in layout.MEMORY_KEYS}


class Reporter:
    """One reporter thread writing into `spool`; `llmmon_reporter.start()` makes one per
    process (benchmarks build their own to switch it on and off)."""

    def __init__(self, spool: str, cadence: Cadence, steps: StepStats,
                 env: Mapping[str, str] | None = None) -> None:
        self.spool = spool
        self.cadence = cadence
        self.steps = steps
        self.env = os.environ if env is None else env  # read live: jobs set MASTER_* late
        self.started_ns = time.time_ns()
        self.ticks = 0
        self.errors_total = 0
        self.failures = 0
        self.last_error = ""
        self.disabled_reason = ""
        self.dumps_written = 0
        self._session: _Session | None = None
        self._previous: dict[str, tuple[int, int]] = {}
        self._settled = Settled()
        self._inflight: bytes | None = None
        self._status: bytes | None = None  # the last status dump, for the exit record
        self._meter = activity.Meter()
        self._pace = TimeSlice()
        self._activity: dict[str, Any] | None = None
        self._stack: list[dict[str, Any]] | None = None
        self._blocked: list[dict[str, Any]] | None = None  # what `_stack` is waiting in
        self._exit: dict[str, Any] | None = None
        self._next_inflight = 0.0
        self._next_entries = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._cycle = threading.Condition()
        self._force_requested = 0
        self._force_served = 0
        self._thread = threading.Thread(target=self._run, name="llmmon-reporter", daemon=True)

    # control, from any thread ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def close(self) -> None:
        """At interpreter exit: stop, write the state once more with how the process ended
        (so the daemon reads a job's end as an end, not a hang) and what was in flight, delete
        the (large) entries file; the small state file stays until the daemon drops the rank
        (and its file)."""
        self.stop(1.0)
        if self._session is None or self._thread.is_alive():
            return
        self._session.log.remove()
        try:
            self._exit = exitstatus.record()
            self._last_look(self._session)
            self._write_state(self._status, None)
        except Exception:
            pass  # the spool may be gone; the daemon still sees the pid vanish

    def _last_look(self, session: _Session) -> None:
        """Progress and what was in flight as the process ends, not as of the last tick: a
        rank that dies in a collective its peers disagree with leaves it here, the daemon's
        evidence of a desync.  gloo counts a collective that raised as completed and retires
        its record, so an exception's exit record also carries the newest record (the
        collective it raised in, when the exception came from one: the daemon decides)."""
        try:
            if session.torch.distributed.is_initialized():
                self._status = session.flight.status()
                self._read_inflight(session, self._settled.apply(_progress(self._status)))
                if self._exit is not None and self._exit["how"] == "exception":
                    records = session.flight.ring(_numbered).get("entries") or ()
                    self._exit["collective"] = max(records, key=lambda e: e["record_id"],
                                                   default=None)
        except Exception:
            pass  # the last tick's view stands

    def _read_inflight(self, session: _Session, progress: dict[str, tuple[int, int]]) -> None:
        """The records not yet final, read after `progress`; settles the gloo groups they
        show done."""
        self._inflight = session.flight.active()
        session.pg_ids.learn(json.loads(self._inflight).get("entries") or ())
        if not session.nccl:  # NCCL's watchdog completes a group's work in order
            self._settled.observe(progress, self._inflight)

    def flush(self, timeout: float = 10.0) -> bool:
        """Run a full tick (entries included) now; True once one finished in time."""
        with self._cycle:
            self._force_requested += 1
            target = self._force_requested
            self._wake.set()
            self._cycle.wait_for(
                lambda: self._force_served >= target or not self._thread.is_alive(), timeout)
            return self._force_served >= target

    def health(self) -> dict[str, Any]:
        return {
            # a disabled reporter is not running, even in the moment its thread takes to end
            "running": self._thread.is_alive() and not self.disabled_reason,
            "connected": self._session is not None,
            "fr_api": self._session.flight.api if self._session else None,
            "fr_native": self._session.flight.native if self._session else None,
            "ticks": self.ticks,
            "errors_total": self.errors_total,
            "last_error": self.last_error,
            "disabled": bool(self.disabled_reason),
            "disabled_reason": self.disabled_reason,
            "dumps_written": self.dumps_written,
        }

    # the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (OSError, AttributeError):
            pass
        while not self._stop.is_set():
            with self._cycle:
                serving = self._force_requested
            delay = self.cadence.status
            try:
                self.tick(serving > self._force_served)
                self.failures = 0
            except Exception as exc:  # the trainer must never see our problems
                delay = self._failed(exc)
            with self._cycle:
                self._force_served = serving
                self._cycle.notify_all()
            if self.disabled_reason:
                break
            self._wake.wait(delay)
            self._wake.clear()
        if self._session is not None and self._session.pipe is not None:
            self._session.pipe.close()

    def _failed(self, exc: Exception) -> float:
        self.errors_total += 1
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:500]
        if self.failures >= MAX_FAILURES:
            self.disabled_reason = (f"disabled after {self.failures} consecutive failures; "
                                    f"last: {self.last_error}")
            log.warning("llmmon reporter %s", self.disabled_reason)
            try:
                if self._session is not None:  # free the big file first: the spool may be full
                    self._session.log.remove()
                self._write_state(None, None)
            except Exception:
                pass  # the spool itself may be what is broken
        return min(self.cadence.status * 2 ** self.failures, 30 * self.cadence.status,
                   MAX_BACKOFF)

    def _connect(self) -> _Session | None:
        torch, dist = sys.modules.get("torch"), sys.modules.get("torch.distributed")
        if _importing(torch) or _importing(dist) or not dist.is_available() \
                or not dist.is_initialized():
            return None
        session = _Session(sys.modules["torch"], self.env, self.spool, self._pace)
        self._session = session
        try:
            session.open_pipe()
        except OSError as exc:  # no dumps on request, but everything else still works
            self.errors_total += 1
            self.last_error = f"dump pipe: {exc}"[:500]
        return session

    def tick(self, force: bool = False) -> None:
        """The thread's loop body: read what is due and write the files (raises on failure).

        Benchmarks call it on their own thread, with the thread not started.
        """
        self._pace.start()
        session = self._session or self._connect()
        if session is None:
            return  # the job has not initialised torch.distributed yet
        if not session.torch.distributed.is_initialized():
            return  # destroyed at the end of training: the files go stale, as they should
        now = time.monotonic()
        session.refresh()
        status = session.flight.status()
        progress = self._settled.apply(_progress(status))
        if session.pg_ids.unknown(progress):
            session.pg_ids.learn(session.flight.ring(groupids.pair).get("entries") or ())
        stuck = any(enqueued > completed and self._previous.get(pg, (0, -1))[1] == completed
                    for pg, (enqueued, completed) in progress.items())
        # Nothing of ours completed since the last tick (waiting, or behind its peers): what
        # is the training thread doing?  A healthy job completes something every tick.
        idle = all(self._previous.get(pg, (0, -1))[1] == completed
                   for pg, (_, completed) in progress.items())
        self._previous, self._status = progress, status
        self._activity = self._meter.read()
        # The daemon's dump request (a stalled group, or an SRE's) asks for the stack too, even of
        # a rank that still completes collectives (a rank whose peers on other nodes wait).
        requested = session.pipe is not None and session.pipe.requested()
        if idle or force or requested:
            thread = self._meter.thread_id
            self._stack = activity.stack(thread)
            self._blocked = blocked.blocked(sys._current_frames().get(thread),
                                            session.torch.distributed)
        else:
            self._stack = self._blocked = None
        if not (stuck or force and any(e > c for e, c in progress.values())):
            self._inflight = None
        elif force or now >= self._next_inflight:
            self._read_inflight(session, progress)
            self._next_inflight = now + self.cadence.inflight
        if not os.path.isdir(self.spool):
            # The node daemon creates the spool; without it there is no one to report to.
            raise FileNotFoundError(f"spool directory {self.spool} does not exist")
        spoolfile.own_directory(session.dir)
        if force or now >= self._next_entries:
            self._write_entries(session)
            self._next_entries = now + self.cadence.entries
        self._write_state(status, session.memory())
        self.ticks += 1
        if requested:
            self._dump(session)

    # files ---------------------------------------------------------------------------
    def _write_state(self, status: bytes | None, memory: dict[str, int] | None) -> None:
        session = self._session
        if session is None:
            return
        header = {
            "schema": layout.SCHEMA,
            "kind": "state",
            "written_ns": time.time_ns(),
            "identity": session.identity,
            "reporter": {
                "started_ns": self.started_ns,
                "ticks": self.ticks,
                "errors_total": self.errors_total,
                "last_error": self.last_error,
                "disabled": bool(self.disabled_reason),
                "disabled_reason": self.disabled_reason,
                "fr_api": session.flight.api,
                "fr_native": session.flight.native,
                "cadence": {"status": self.cadence.status, "inflight": self.cadence.inflight,
                            "entries": self.cadence.entries},
            },
            "pgs": session.pgs,
            "pg_ids": session.pg_ids.names,
            "settled": self._settled.seqs,
            "memory": memory,
            "step": self.steps.snapshot(),
            "activity": self._activity,
            "stack": self._stack,
            "blocked": self._blocked,
            "exit": self._exit,
        }
        data = spoolfile.compose(header, {"status": status, "inflight": self._inflight})
        spoolfile.write_atomic(session.dir, session.state_name, data)
        self._meter.own_written += len(data)

    def _write_entries(self, session: _Session) -> None:
        self._meter.own_written += session.log.write(session.flight.ring, time.time_ns())

    def _dump(self, session: _Session) -> None:
        assert session.dump_path is not None
        directory, name = os.path.split(session.dump_path)
        os.makedirs(directory, exist_ok=True)
        dump = session.flight.full()
        spoolfile.write_atomic(directory, name, dump)
        self._meter.own_written += len(dump)  # ~1 MB: not the trainer's I/O (it would read busy)
        self.dumps_written += 1


def _numbered(entry: Any) -> dict[str, Any] | None:
    """A record's fields the daemon reads, if it has a record id to order it by."""
    ok = isinstance(entry, dict) and type(entry.get("record_id")) is int
    return entrylog.project(entry) if ok else None


def _importing(module: Any) -> bool:
    """Absent, or still executing its import on the training thread (half-defined)."""
    return module is None or bool(getattr(getattr(module, "__spec__", None), "_initializing",
                                          False))
