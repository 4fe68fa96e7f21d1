"""The rank spool directory: bounded, symlink-safe listing and reading of reporter files.

Layout (see reporter/llmmon_reporter/layout.py): `<root>/<job>/rank_<rank>.<pid>.json` (state, every
second), `rank_<rank>.<pid>.entries.jsonl` (the entries log, appended every ~20 s) and, from
older reporters, `rank_<rank>.<pid>.entries.json` (the whole ring).  Anything
else — symlinks, devices, odd names, oversized files, too many files — is rejected with a
reason and never opened.

The spool is written by other users, so what one job directory can cost is bounded: each run
looks at the job directories newest first, at most `EXAMINED_PER_JOB` entries of each and
`EXAMINED_PER_RUN` in all; a job keeps only its `max_files_per_job` newest rank files, and the
run's `max_files` are shared round-robin, each job's newest first.  A directory full of junk
costs its own budget and never starves another job.
"""

from __future__ import annotations

import itertools
import os
import stat
from dataclasses import dataclass, field

from llmmon_reporter.layout import SPOOL_FILE

Stamp = tuple[int, int, int]  # inode, mtime_ns, size: changes whenever a file is replaced
EXAMINED_PER_RUN = 16384  # directory entries looked at per run, all job directories together
EXAMINED_PER_JOB = 1024  # ... and per job directory (a few times any real job's files)
KINDS = {"json": "state", "entries.json": "entries", "entries.jsonl": "log"}  # by file suffix


class SpoolError(Exception):
    """Why one spool entry was skipped: a short reason label, the path, a message."""

    def __init__(self, reason: str, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.reason = reason
        self.path = path


@dataclass(frozen=True)
class SpoolFile:
    job_dir: str
    rank: int
    pid: int
    kind: str  # "state", "entries" (the whole ring) or "log" (the entries log)
    path: str
    stamp: Stamp
    uid: int = -1  # the file's owner: whose budget of ranks it draws on

    @property
    def mtime(self) -> float:
        return self.stamp[1] / 1e9


@dataclass
class Scan:
    files: list[SpoolFile] = field(default_factory=list)
    rejected: list[SpoolError] = field(default_factory=list)
    temporaries: list[tuple[str, float]] = field(default_factory=list)  # path, mtime


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class SpoolSource:
    def __init__(self, root: str, max_file_bytes: int, max_files: int,
                 max_files_per_job: int) -> None:
        self.root = os.path.abspath(root)
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files
        self.max_files_per_job = max_files_per_job

    def exists(self) -> bool:
        return os.path.isdir(self.root)

    def scan(self) -> Scan:
        """Every acceptable file under the root (within budget), and why others were skipped."""
        scan = Scan()
        try:
            jobs = self._listing(self.root, EXAMINED_PER_RUN, scan)
        except FileNotFoundError:
            return scan
        except OSError as exc:
            raise SpoolError("unreadable", self.root, exc.strerror or str(exc)) from None
        per_job, budget = [], EXAMINED_PER_RUN - len(jobs)
        for job, st in sorted(jobs, key=lambda item: (-item[1].st_mtime_ns, item[0].name)):
            if job.name.startswith("."):
                continue
            if not stat.S_ISDIR(st.st_mode):
                scan.rejected.append(SpoolError(
                    "symlink" if stat.S_ISLNK(st.st_mode) else "unexpected", job.path,
                    "not a job directory; skipped"))
                continue
            if budget <= 0:
                scan.rejected.append(SpoolError(
                    "too_many", job.path, f"more than {EXAMINED_PER_RUN} spool entries; "
                                          "job directory skipped this run"))
                continue
            try:
                entries = self._listing(job.path, min(EXAMINED_PER_JOB, budget), scan)
            except OSError as exc:
                scan.rejected.append(SpoolError("unreadable", job.path, str(exc.strerror)))
                continue
            budget -= len(entries)
            files = [f for entry, found in entries
                     if (f := self._admit(job.name, entry, found, scan))]
            files.sort(key=lambda f: (f.stamp[1], f.path), reverse=True)
            if len(files) > self.max_files_per_job:
                scan.rejected.append(SpoolError(
                    "too_many", job.path, f"{len(files)} rank files; read the "
                                          f"{self.max_files_per_job} newest"))
            per_job.append(files[:self.max_files_per_job])
        rounds = (f for turn in itertools.zip_longest(*per_job) for f in turn if f is not None)
        scan.files = list(itertools.islice(rounds, self.max_files))
        if next(rounds, None) is not None:
            scan.rejected.append(SpoolError(
                "too_many", self.root, f"more than {self.max_files} files; the newest of "
                                       "each job read first, the rest skipped"))
        return scan

    @staticmethod
    def _listing(path: str, limit: int,
                 scan: Scan) -> list[tuple[os.DirEntry[str], os.stat_result]]:
        """At most `limit` entries of a directory (in directory order) with their lstat."""
        listed = []
        with os.scandir(path) as entries:
            for entry in entries:
                if len(listed) >= limit:
                    scan.rejected.append(SpoolError(
                        "too_many", path, f"more than {limit} entries; the rest not looked at"))
                    break
                try:
                    listed.append((entry, entry.stat(follow_symlinks=False)))
                except OSError:
                    pass  # replaced or removed while we looked: next run sees it
        return listed

    def _admit(self, job: str, entry: os.DirEntry[str], st: os.stat_result,
               scan: Scan) -> SpoolFile | None:
        """The rank file this directory entry is, or None (a temporary, or rejected)."""
        if entry.name.startswith("."):
            scan.temporaries.append((entry.path, st.st_mtime))
            return None
        match = SPOOL_FILE.match(entry.name)
        if stat.S_ISLNK(st.st_mode):
            scan.rejected.append(SpoolError("symlink", entry.path, "symlink; skipped"))
        elif not stat.S_ISREG(st.st_mode):
            scan.rejected.append(SpoolError("unexpected", entry.path, "not a regular file"))
        elif match is None:
            scan.rejected.append(SpoolError("unexpected", entry.path, "unexpected name"))
        elif st.st_size > self.max_file_bytes:
            scan.rejected.append(SpoolError(
                "too_large", entry.path, f"{st.st_size} bytes > {self.max_file_bytes}"))
        else:
            kind = KINDS[match.group(3)]
            return SpoolFile(job, int(match.group(1)), int(match.group(2)), kind, entry.path,
                             _stamp(st), st.st_uid)
        return None

    def read(self, spool_file: SpoolFile) -> tuple[bytes, Stamp]:
        """The file's bytes (at most max_file_bytes), never through a symlink."""
        _, data, stamp = self.read_from(spool_file, 0, 0)
        return data, stamp

    def read_from(self, spool_file: SpoolFile, offset: int, head: int
                  ) -> tuple[bytes, bytes, Stamp]:
        """The first `head` bytes and the bytes from `offset` on (at most max_file_bytes),
        from one open of the file, never through a symlink."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(spool_file.path, flags)
        except OSError as exc:
            raise SpoolError("unreadable", spool_file.path, str(exc.strerror)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SpoolError("unexpected", spool_file.path, "not a regular file")
            start = os.pread(fd, head, 0) if head else b""
            os.lseek(fd, offset, os.SEEK_SET)
            chunks, total = [], 0
            while total <= self.max_file_bytes:
                chunk = os.read(fd, min(1 << 20, self.max_file_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        finally:
            os.close(fd)
        if total > self.max_file_bytes:
            raise SpoolError("too_large", spool_file.path,
                             f"larger than {self.max_file_bytes} bytes")
        return start, b"".join(chunks), _stamp(st)

    def remove(self, path: str) -> None:
        """Delete a file of a dropped rank (best effort: the spool may be mounted read-only)."""
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))  # only succeeds once the job directory is empty
        except OSError:
            pass
