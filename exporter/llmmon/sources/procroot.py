"""Files a process wrote inside its own mount namespace, read through /proc/<pid>/root.

A rank in a container writes its NCCL log (NCCL_DEBUG_FILE) to a path that means something
only in that container; /proc/<pid>/root resolves it there, as `nsenter` would, without
entering the namespace (that needs the rights to read its environment, CAP_SYS_PTRACE).  A
directory the pod shares with the host at the same path (the dump directory) is read from
the host where the process's root is out of reach.  The path and the file are the job's, so
both are hostile: the path is walked one name at a time from the base without following any
symbolic link and without `..` (a link the job planted cannot lead the daemon out of the
job's files), the file is opened without blocking (a FIFO), must be a regular file owned by
the process's own user, and at most `max_bytes` of it are read.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from dataclasses import dataclass

from llmmon.sources.fs import RootedFS, SourceError

MAX_LISTED = 4096  # directory entries looked at when a name has a wildcard


class Missing(SourceError):
    """The path does not exist (yet): a job whose NCCL has not started, or that writes none."""


def _error(path: str, exc: OSError) -> SourceError:
    kind = Missing if exc.errno in (errno.ENOENT, errno.ENOTDIR) else SourceError
    return kind(f"{path}: {exc.strerror or exc}")


def ns_pid(procfs: RootedFS, pid: int) -> int:
    """The process's id in its own PID namespace (what NCCL's %p expands to): the last
    NSpid field of its status; `pid` itself where the kernel has no NSpid (before 4.1)."""
    try:
        text = procfs.read_text(str(pid), "status", max_bytes=16384)
    except SourceError:
        return pid
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            if fields and fields[-1].isdigit():
                return int(fields[-1])
    return pid


def root(procfs: RootedFS, pid: int) -> str:
    """The process's own view of the file system, where its absolute paths mean what they
    mean to it."""
    return procfs.path(str(pid), "root")


def cwd(procfs: RootedFS, pid: int) -> str:
    """The process's working directory, where its relative paths start."""
    return procfs.path(str(pid), "cwd")


@dataclass(frozen=True)
class Found:
    """A regular file in a directory the job named."""

    directory: str  # relative to the base, '' for the base itself
    name: str
    size: int
    mtime_ns: int


def newest(base: str, directory: str, pattern: str) -> Found | None:
    """The newest regular file in `directory` (relative to `base`) whose name matches
    `pattern` (`*` matches any run of characters: a host name the daemon does not know);
    None when there is none.  At most MAX_LISTED entries are looked at."""
    fd = _open_dir(base, directory)
    try:
        if "*" in pattern:
            with os.scandir(fd) as entries:
                names = [e.name for _, e in zip(range(MAX_LISTED), entries)
                         if fnmatch.fnmatchcase(e.name, pattern)]
        else:
            names = [pattern]
        found = []
        for name in names:
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append(Found(directory, name, info.st_size, info.st_mtime_ns))
    except OSError as exc:
        raise _error(_under(base, directory), exc) from None
    finally:
        os.close(fd)
    return max(found, key=lambda f: (f.mtime_ns, f.name), default=None)


def read_owned(base: str, found: Found, uid: int, max_bytes: int) -> str:
    """The first `max_bytes` of the file, which must still be a regular file owned by `uid`."""
    fd = _open_dir(base, found.directory)
    full = _under(base, os.path.join(found.directory, found.name))
    try:
        try:
            file_fd = os.open(found.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                              | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            raise SourceError(f"{full}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        info = os.fstat(file_fd)
        if not stat.S_ISREG(info.st_mode):
            raise SourceError(f"{full}: not a regular file")
        if info.st_uid != uid:
            raise SourceError(f"{full}: owned by uid {info.st_uid}, not the process's {uid}")
        chunks, left = [], max_bytes
        while left > 0:
            chunk = os.read(file_fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise SourceError(f"{full}: {exc.strerror or exc}") from None
    finally:
        os.close(file_fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _open_dir(base: str, directory: str) -> int:
    """A descriptor of `directory` under `base`, walked one name at a time without following
    any symbolic link and without `..`: a path the job names cannot leave `base`."""
    parts = [p for p in directory.split("/") if p and p != "."]
    if ".." in parts:
        raise SourceError(f"{directory}: '..' in a path the job names")
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _error(base, exc) from None
    try:
        for part in parts:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as exc:
        os.close(fd)
        raise _error(_under(base, directory), exc) from None
    return fd


def _under(base: str, path: str) -> str:
    return os.path.join(base, path.lstrip("/"))
