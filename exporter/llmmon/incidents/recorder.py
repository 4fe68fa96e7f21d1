"""Once per incident, on its own: a job's stall or abnormal end becomes a directory on the node.

A job opens an incident the first time the daemon's verdict says it is stalled (or a rank of
it ended abnormally) and closes it when the job completes again or is gone; a job that stalls
again later opens another. The capture runs in its own thread (it waits for the ranks' Flight
Recorder dumps), writes under `.tmp-<id>` and renames the directory into place once whole. The
directory is bounded (bytes per incident, and in all, and a count: the oldest of ours go).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from llmmon.incidents import capture, layout
from llmmon.ranks import dimension, dumps, stall
from llmmon.sources.fs import RootedFS
from llmmon.sources.marked import made_by_us

log = logging.getLogger("llmmon.incidents")
DUMP_WAIT = 12.0  # seconds a capture waits for the dumps it asked for
DUMP_SETTLE = 1.0  # a dump unchanged this long is whole
POLL = 0.25


@dataclass(frozen=True)
class Limits:
    max_bytes: int  # one incident
    max_total_bytes: int  # every incident of ours
    keep: int  # incidents of ours


@dataclass(frozen=True)
class Sources:
    """Where the rest of the daemon keeps what an incident takes."""

    procfs: RootedFS
    fr_dir: str
    pipe_dir: str
    kmsg_path: str
    node: str


@dataclass
class Written:
    """What the recorder did, for its metrics."""

    by_trigger: dict[str, int] = field(default_factory=lambda: {t: 0 for t in layout.TRIGGERS})
    failed: int = 0
    withdrawn: int = 0  # waiting incidents of jobs that completed again
    kept: int = 0
    bytes: int = 0
    newest: dict[str, str] = field(default_factory=dict)  # job -> its newest incident here


class Recorder:
    def __init__(self, root: str, limits: Limits, sources: Sources,
                 ring: capture.CounterRing | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.limits = limits
        self.sources = sources
        self.ring = ring or capture.CounterRing()
        self.clock = clock
        self.written = Written()
        self._open: dict[str, str] = {}  # job -> trigger of its open incident
        self._waited: dict[str, str] = {}  # job -> its written incident while it only waits
        self._recovered: set[str] = set()  # jobs whose waiting incident is to be withdrawn
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def observe(self, evidence: stall.Evidence) -> list[str]:
        """Open an incident for each job newly stalled or ended abnormally; close those of jobs
        that recovered or left. Returns the jobs whose capture started."""
        now = self.clock()
        started = []
        current = {job.job_id: job for job in evidence.jobs}
        withdrawn = []
        with self._lock:
            for job_id in list(self._open):
                job = current.get(job_id)
                if job is None or (capture.trigger(job) is None and job.end is None):
                    if job is not None and self._open[job_id] == "waiting":
                        self._recovered.add(job_id)  # it completes again: only a long wait
                        withdrawn += [self._waited.pop(job_id)] if job_id in self._waited else []
                    del self._open[job_id]
            for job_id, job in current.items():
                trigger = capture.trigger(job)
                if trigger == "stalled" and self._open.get(job_id) == "waiting":
                    self._open[job_id] = trigger  # judged stalled here too: kept for good
                    self._waited.pop(job_id, None)
                if trigger is None or job_id in self._open:
                    continue
                self._recovered.discard(job_id)
                self._open[job_id] = trigger
                thread = threading.Thread(target=self._capture, args=(job, trigger, now),
                                          name=f"incident {job_id}", daemon=True)
                self._threads[job_id] = thread
                started.append(job_id)
        for job_id in started:
            self._threads[job_id].start()
        for incident in withdrawn:
            self._withdraw(incident)
        return started

    def _withdraw(self, incident: str) -> None:
        """Remove the incident of a job that only waited for another node's rank, and then
        completed again: that rank was busy (a checkpoint), not hung."""
        shutil.rmtree(os.path.join(self.root, incident), ignore_errors=True)
        log.info("incident %s withdrawn: its job completed again (its ranks here only waited "
                 "for a busy rank on another node)", incident)
        with self._lock:
            self.written.withdrawn += 1
        self.prune()

    def wait(self, timeout: float) -> bool:
        """Tests and shutdown: whether every capture started so far has finished."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads.values())

    # the capture --------------------------------------------------------------------------
    def _capture(self, job: stall.JobEvidence, trigger: str, declared: float) -> None:
        try:
            incident = self._write(job, trigger, declared)
        except OSError as exc:  # a full disk, a directory the daemon may not write
            log.error("job %s: the incident could not be written under %s "
                      "(--collector.incidents.dir): %s", job.job_id, self.root, exc)
            self._failed()
            return
        except Exception:  # one incident's failure is logged and counted, never the daemon's
            log.exception("job %s: the incident could not be written", job.job_id)
            self._failed()
            return
        log.warning("job %s: incident %s written (%s)", job.job_id, incident,
                    os.path.join(self.root, incident))
        with self._lock:
            self.written.by_trigger[trigger] += 1
            self.written.newest[job.job_id] = incident
            recovered = trigger == "waiting" and job.job_id in self._recovered
            if trigger == "waiting" and not recovered and \
                    self._open.get(job.job_id) == "waiting":
                self._waited[job.job_id] = incident
        if recovered:  # the job completed again while the capture waited for its dumps
            self._withdraw(incident)
        else:
            self.prune()

    def _failed(self) -> None:
        with self._lock:
            self.written.failed += 1

    def _write(self, job: stall.JobEvidence, trigger: str, declared: float) -> str:
        start = capture.onset(job, declared)
        incident = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(declared))}-" \
                   f"{layout.slug(job.job_id)}-{secrets.token_hex(3)}"
        os.makedirs(self.root, 0o750, exist_ok=True)
        tmp = os.path.join(self.root, layout.TMP_PREFIX + incident)
        _mkdir(tmp)
        try:
            return self._fill(tmp, incident, job, trigger, declared, start)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _fill(self, tmp: str, incident: str, job: stall.JobEvidence, trigger: str,
              declared: float, start: float) -> str:
        cpu, wall = time.thread_time(), time.monotonic()
        _create(os.path.join(tmp, layout.MARKER), b"")
        budget = _Budget(tmp, self.limits.max_bytes)
        local = [r.rank for r in job.ranks if r.alive]
        asked_at = self.clock()
        asked = dumps.request(self.sources.pipe_dir, job.job_id, local) if local else {}
        who = capture.culprit(job)
        budget.json(layout.RANKS, job.json())
        budget.json(layout.STACKS, capture.stacks(job))
        budget.json(layout.COLLECTIVES, capture.collectives(job))
        budget.json(layout.ENV, capture.environments(job, self.sources.procfs))
        budget.json(layout.GPUS, capture.gpus(self.ring, start, declared))
        budget.json(layout.NETWORK, capture.network(self.ring, start, declared))
        text, problem = capture.kernel_log(self.sources.kmsg_path, start, self.clock())
        if problem:
            budget.errors.append(problem)
        budget.text(layout.KMSG, text)
        collected = self._collect_dumps(budget, job.job_id, asked, asked_at, who.ranks)
        summary = {
            "schema": layout.SCHEMA, "id": incident, "job_id": job.job_id,
            "node": self.sources.node, "trigger": trigger, "onset": round(start, 3),
            "declared": round(declared, 3), "completed": None,
            "verdict": who.text, "culprit": who.json(),
            "local_ranks": [r.rank for r in job.ranks],
            "stalled_groups": [{"pg": g.pg, "pg_desc": g.meta.desc if g.meta else "",
                                "dimension": dimension.of(g.meta.desc) if g.meta else "",
                                "stalled_seconds": g.stalled_seconds}
                               for g in job.groups if g.stalled],
            "end": job.end, "dumps": collected}
        summary["completed"] = round(self.clock(), 3)
        # what the capture cost this node: its thread's CPU, and its wall time (mostly the
        # wait for the dumps)
        summary["capture"] = {"cpu_seconds": round(time.thread_time() - cpu, 4),
                              "wall_seconds": round(time.monotonic() - wall, 3)}
        summary.update(files=dict(budget.files), bytes=sum(budget.files.values()),
                       left_out=budget.left_out, errors=budget.errors)
        _create(os.path.join(tmp, layout.SUMMARY), _dumps(summary))
        os.rename(tmp, os.path.join(self.root, incident))
        return incident

    def _collect_dumps(self, budget: _Budget, job_id: str, asked: dict[int, str],
                       asked_at: float, culprits: tuple[int, ...]) -> dict[str, str]:
        """Copy each asked rank's dump once it is whole (culprits first), waiting DUMP_WAIT."""
        result = {str(rank): how for rank, how in asked.items()}
        waiting = sorted((r for r, how in asked.items() if how == "requested"),
                         key=lambda r: (r not in culprits, r))
        deadline = time.monotonic() + DUMP_WAIT
        seen: dict[int, tuple[str, int, float]] = {}
        while waiting:
            for rank in list(waiting):
                path = _dump_path(self.sources.fr_dir, job_id, rank, asked_at)
                if path is None:
                    continue
                size = os.lstat(path).st_size
                if seen.get(rank, ("", -1, 0.0))[:2] != (path, size):
                    seen[rank] = (path, size, time.monotonic())
                    continue
                if time.monotonic() - seen[rank][2] < DUMP_SETTLE:
                    continue
                name = f"{layout.FR_DIR}/{os.path.basename(path)}"
                result[str(rank)] = "collected" if budget.copy(name, path) else "over budget"
                waiting.remove(rank)
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(POLL)
        for rank in waiting:
            result[str(rank)] = f"requested, none came in {DUMP_WAIT:.0f} s"
        return result

    # bounds -------------------------------------------------------------------------------
    def prune(self) -> None:
        """Remove our oldest incidents beyond the count or the total; count what is kept."""
        ours = sorted(layout_ours(self.root))
        sizes = {name: _tree_bytes(os.path.join(self.root, name)) for name in ours}
        total = sum(sizes.values())
        while ours and (len(ours) > self.limits.keep or total > self.limits.max_total_bytes):
            oldest = ours.pop(0)
            shutil.rmtree(os.path.join(self.root, oldest), ignore_errors=True)
            total -= sizes[oldest]
            log.info("incident %s removed: over --collector.incidents.keep or max-total-bytes",
                     oldest)
        with self._lock:
            self.written.kept, self.written.bytes = len(ours), total
            kept = set(ours)
            self.written.newest = {job: name for job, name in self.written.newest.items()
                                   if name in kept}

    def snapshot(self) -> Written:
        with self._lock:
            return Written(dict(self.written.by_trigger), self.written.failed,
                           self.written.withdrawn, self.written.kept, self.written.bytes,
                           dict(self.written.newest))


class _Budget:
    """The files of one incident, written while they fit in its byte budget."""

    def __init__(self, directory: str, limit: int) -> None:
        self.directory = directory
        self.limit = limit
        self.files: dict[str, int] = {}
        self.left_out: list[str] = []
        self.errors: list[str] = []

    def _room(self, name: str, size: int) -> bool:
        if sum(self.files.values()) + size > self.limit:
            self.left_out.append(f"{name}: {size} bytes over the incident's "
                                 f"{self.limit} (--collector.incidents.max-bytes)")
            return False
        return True

    def json(self, name: str, document: Any) -> None:
        self.text(name, _dumps(document).decode())

    def text(self, name: str, text: str) -> None:
        data = text.encode("utf-8", "replace")
        if self._room(name, len(data)):
            _create(os.path.join(self.directory, name), data)
            self.files[name] = len(data)

    def copy(self, name: str, source: str) -> bool:
        """Copy a dump the ranks' user wrote: never through a link, at most what fits."""
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            self.errors.append(f"{name}: {exc.strerror}")
            return False
        with os.fdopen(fd, "rb") as src:
            if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                self.errors.append(f"{name}: not a regular file")
                return False
            size = os.fstat(src.fileno()).st_size
            if not self._room(name, size):
                return False
            if not os.path.isdir(os.path.join(self.directory, layout.FR_DIR)):
                _mkdir(os.path.join(self.directory, layout.FR_DIR))
            data = src.read(size)
        _create(os.path.join(self.directory, name), data)
        self.files[name] = len(data)
        return True


def _dump_path(fr_dir: str, job_id: str, rank: int, since: float) -> str | None:
    """The rank's dump written since the request: where the rank writes it, or in a set the
    ranks collector already moved it into."""
    job_dir = os.path.join(fr_dir, job_id)
    places = [job_dir]
    try:
        places += [e.path for e in os.scandir(job_dir)
                   if e.name.startswith(dumps.SET_PREFIX) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return None
    for place in places:
        for name in (f"rank_{rank}.json", f"rank_{rank}"):
            path = os.path.join(place, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_mtime >= since - 1.0:
                return path
    return None


def layout_ours(root: str) -> list[str]:
    """The complete incidents under `root` that this daemon wrote (owner and marker)."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    return [entry.name for entry in entries
            if layout.ID.match(entry.name) and made_by_us(entry.path, layout.MARKER)]


def _tree_bytes(path: str) -> int:
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def _create(path: str, data: bytes) -> None:
    """A new file of the daemon's user and group, 0640 whatever the umask (systemd's 0077)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o640)
        out.write(data)


def _mkdir(path: str) -> None:
    os.mkdir(path, 0o750)
    os.chmod(path, 0o750)


def _dumps(document: Any) -> bytes:
    return json.dumps(document, indent=1, sort_keys=True, default=str,
                      ensure_ascii=False).encode("utf-8", "replace")
