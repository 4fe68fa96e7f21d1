"""Each rank's NCCL settings and log, read from outside its process and kept while it lives.

The settings are the rank's environment (procfs, read once per process; where it cannot be
read, again after ENV_RETRY, and meanwhile the copy the reporter sends), with what NCCL's log
says it applied on top (`NCCL_IB_HCA set by environment to ...`: the environment and
/etc/nccl.conf, which the environment alone does not show).  The log is NCCL_DEBUG_FILE as
NCCL expands it, in the rank's own mount namespace or in the dump directory the node shares
with its pods (llmmon.sources.procroot says how a path the job names is walked).

A log on a network file system can hang whoever reads it, so every read runs in a thread of
its own that the collector waits on for at most a deadline shared by all ranks: a rank whose
read has not returned keeps its last result and is not read again until it returns, and the
other ranks are read as usual.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from llmmon.network import nccl_log
from llmmon.network.nccl_settings import NcclSettings
from llmmon.sources import procenv, procroot
from llmmon.sources.fs import RootedFS, SourceError

ENV_RETRY = 60.0  # seconds before an environment that could not be read is tried again


@dataclass(frozen=True)
class Process:
    """A rank's process as the ranks collector knows it."""

    pid: int
    start_ticks: int
    reported_env: Mapping[str, str] | None  # the reporter's NCCL_* copy; None: no reporter


@dataclass
class RankRead:
    """What was read of one rank's process."""

    environ: dict[str, str] | None = None  # from procfs; None: not readable (yet)
    env_tried: float = 0.0
    reported: dict[str, str] | None = None  # the reporter's NCCL_* copy
    log: nccl_log.NcclLog | None = None
    log_key: tuple[object, ...] | None = None  # where, size and time of the file last parsed
    error: str = ""  # the last log read's problem, '' when it went well
    reading: threading.Thread | None = None
    since: float = 0.0  # when the read in flight started (monotonic)
    told: set[str] = field(default_factory=set)  # problems already counted

    @property
    def env(self) -> dict[str, str] | None:
        return self.environ if self.environ is not None else self.reported

    @property
    def settings(self) -> NcclSettings | None:
        """The environment's settings with what the log says NCCL applied on top."""
        if self.env is None:
            return None
        applied = dict(self.log.applied) if self.log is not None else {}
        return NcclSettings.from_env({**self.env, **applied})

    def stuck_for(self, now: float) -> float:
        """Seconds the log read in flight has run (0: none in flight)."""
        return now - self.since if self.reading is not None and self.reading.is_alive() else 0.0


@dataclass
class RankReader:
    procfs: RootedFS
    shared_dir: str  # the dump directory: the same path on the host and in the pods
    max_bytes: int
    ranks: dict[tuple[int, int], RankRead] = field(default_factory=dict)

    def read(self, processes: Iterable[Process], now: float,
             deadline: float) -> dict[tuple[int, int], RankRead]:
        """Every process's read, its log read again where it changed; waits at most until
        `deadline` (monotonic) for the logs.  Processes no longer given are forgotten."""
        out: dict[tuple[int, int], RankRead] = {}
        for process in processes:
            read = out[(process.pid, process.start_ticks)] = \
                self.ranks.get((process.pid, process.start_ticks)) or RankRead()
            if read.environ is None and (not read.env_tried
                                         or now - read.env_tried >= ENV_RETRY):
                read.env_tried = now
                read.environ = procenv.environ(self.procfs, process.pid)
            read.reported = None if process.reported_env is None else dict(process.reported_env)
            template = (read.env or {}).get("NCCL_DEBUG_FILE", "")
            if template and not read.stuck_for(time.monotonic()):
                read.reading = threading.Thread(
                    target=self._read_log, args=(process, read, template, dict(read.env or {})),
                    name=f"nccl-log-{process.pid}", daemon=True)
                read.since = time.monotonic()
                read.reading.start()
        for read in out.values():
            if read.reading is not None:
                read.reading.join(max(0.0, deadline - time.monotonic()))
        self.ranks = out
        return out

    def _read_log(self, process: Process, read: RankRead, template: str,
                  env: Mapping[str, str]) -> None:
        """Find the rank's log, parse it if it changed; runs in its own thread."""
        try:
            found = self._find(process, template, env)
            if found is None:
                read.error = ""
                return
            base, file = found
            key = (base, file.directory, file.name, file.size, file.mtime_ns)
            last = read.log_key
            head_parsed = (last is not None and last[:3] == key[:3]
                           and min(file.size, int(last[3])) >= self.max_bytes)  # type: ignore
            if key == last or head_parsed:
                return  # unchanged, or its head (all that is read of it) parsed already
            text = procroot.read_owned(base, file, procenv.owner(self.procfs, process.pid),
                                       self.max_bytes)
            read.log, read.log_key, read.error = nccl_log.parse(text), key, ""
        except SourceError as exc:
            read.error = str(exc)

    def _find(self, process: Process, template: str,
              env: Mapping[str, str]) -> tuple[str, procroot.Found] | None:
        """(base, file): the newest file the template names, in the rank's root (or its
        working directory, for a relative path), else in the shared dump directory; with
        the host name the rank's environment gives, else any."""
        pid = procroot.ns_pid(self.procfs, process.pid)
        host = host_name(env)
        paths = [expand_debug_file(template, pid, h) for h in dict.fromkeys([host, "*"])]
        problem: SourceError | None = None
        for path in paths:
            directory, pattern = os.path.split(path)
            if not pattern:
                return None
            bases = [(procroot.root(self.procfs, process.pid) if os.path.isabs(path)
                      else procroot.cwd(self.procfs, process.pid), directory)]
            shared = self.shared_dir.rstrip("/")
            if shared and os.path.isabs(path) and (directory == shared
                                                    or directory.startswith(shared + "/")):
                bases.append((shared, directory[len(shared):]))
            for base, relative in bases:
                try:
                    file = procroot.newest(base, relative, pattern)
                except procroot.Missing:
                    continue
                except SourceError as exc:
                    problem = exc
                    continue
                if file is not None:
                    return base, file
        if problem is not None:
            raise problem
        return None


def host_name(env: Mapping[str, str]) -> str:
    """What NCCL's %h expands to: NCCL_HOSTNAME, else the host name up to its first dot (the
    rank's HOSTNAME, as its shell and Kubernetes set it); '*' when neither is known."""
    name = env.get("NCCL_HOSTNAME") or env.get("HOSTNAME") or ""
    name = name.split(".")[0]
    return name if name and "/" not in name else "*"


def expand_debug_file(template: str, pid: int, host: str = "*") -> str:
    """NCCL_DEBUG_FILE as NCCL expands it: %h the host name, %p the process id, %% a per cent
    sign; any other % stays."""
    out, i = [], 0
    while i < len(template):
        char = template[i]
        if char == "%" and i + 1 < len(template):
            nxt = template[i + 1]
            out.append({"h": host, "p": str(pid), "%": "%"}.get(nxt, char + nxt))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)
