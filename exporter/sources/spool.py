"""The rank spool directory: bounded, symlink-safe listing and reading of reporter files.

Layout (see reporter/llmmon_reporter/layout.py): `<root>/<job>/rank_<rank>.<pid>.json` (state, every
second) and `rank_<rank>.<pid>.entries.json` (Flight Recorder entries, every ~20 s).  Anything
else — symlinks, devices, odd names, oversized files, too many files — is rejected with a
reason and never opened.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from llmmon_reporter.layout import SPOOL_FILE

Stamp = tuple[int, int, int]  # inode, mtime_ns, size: changes whenever a file is replaced


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
    kind: str  # "state" or "entries"
    path: str
    stamp: Stamp

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
    def __init__(self, root: str, max_file_bytes: int, max_files: int) -> None:
        self.root = os.path.abspath(root)
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files

    def exists(self) -> bool:
        return os.path.isdir(self.root)

    def scan(self) -> Scan:
        """Every acceptable file under the root, and why each other entry was skipped."""
        scan = Scan()
        try:
            jobs = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            return scan
        except OSError as exc:
            raise SpoolError("unreadable", self.root, exc.strerror or str(exc)) from None
        for job in jobs:
            if job.name.startswith("."):
                continue
            if job.is_symlink() or not job.is_dir(follow_symlinks=False):
                scan.rejected.append(SpoolError(
                    "symlink" if job.is_symlink() else "unexpected", job.path,
                    "not a job directory; skipped"))
                continue
            try:
                names = sorted(os.scandir(job.path), key=lambda e: e.name)
            except OSError as exc:
                scan.rejected.append(SpoolError("unreadable", job.path, str(exc.strerror)))
                continue
            for entry in names:
                if not self._admit(job.name, entry, scan):
                    return scan
        return scan

    def _admit(self, job: str, entry: os.DirEntry[str], scan: Scan) -> bool:
        """Add one directory entry to the scan; False once the file budget is spent."""
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return True  # replaced or removed while we looked: next run sees it
        if entry.name.startswith("."):
            scan.temporaries.append((entry.path, st.st_mtime))
            return True
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
        elif len(scan.files) >= self.max_files:
            scan.rejected.append(SpoolError(
                "too_many", self.root, f"more than {self.max_files} files; rest skipped"))
            return False
        else:
            kind = "state" if match.group(3) == "json" else "entries"
            scan.files.append(SpoolFile(job, int(match.group(1)), int(match.group(2)), kind,
                                        entry.path, _stamp(st)))
        return True

    def read(self, spool_file: SpoolFile) -> tuple[bytes, Stamp]:
        """The file's bytes (at most max_file_bytes), never through a symlink."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(spool_file.path, flags)
        except OSError as exc:
            raise SpoolError("unreadable", spool_file.path, str(exc.strerror)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SpoolError("unexpected", spool_file.path, "not a regular file")
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
        return b"".join(chunks), _stamp(st)

    def remove(self, path: str) -> None:
        """Delete a file of a dropped rank (best effort: the spool may be mounted read-only)."""
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))  # only succeeds once the job directory is empty
        except OSError:
            pass
