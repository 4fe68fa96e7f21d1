"""Files a process wrote inside its own mount namespace, read through /proc/<pid>/root.

A rank in a container writes its NCCL log (NCCL_DEBUG_FILE) to a path that means something
only in that container; /proc/<pid>/root resolves it there, as `nsenter` would, without
entering the namespace (that needs the rights to read its environment, CAP_SYS_PTRACE).  A
directory the pod shares with the host at the same path (the dump directory) is read from
the host (`base` "/") where the process's root is out of reach.  The path and the file are the
job's, so both are hostile: the file
is opened without following a final symbolic link and without blocking (a FIFO), must be a
regular file owned by the process's own user (so a job cannot point the daemon at another
user's file), and at most `max_bytes` of it are read.
"""

from __future__ import annotations

import fnmatch
import os
import stat

from llmmon.sources.fs import RootedFS, SourceError

MAX_LISTED = 4096  # directory entries looked at when a name has a wildcard


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
    """The process's own view of the file system, where its paths mean what they mean to it."""
    return procfs.path(str(pid), "root")


def find(base: str, pattern: str) -> list[str]:
    """Paths (absolute, as seen from `base`: a process's root, or / for a directory shared
    with the host at the same path) that match `pattern`, whose last component may hold `*`
    (a host name the daemon does not know); at most MAX_LISTED entries are looked at."""
    directory, name = os.path.split(pattern)
    if not os.path.isabs(pattern) or "*" in directory:
        return []
    if "*" not in name:
        return [pattern]
    try:
        with os.scandir(_under(base, directory)) as entries:
            names = [e.name for _, e in zip(range(MAX_LISTED), entries)]
    except OSError:
        return []
    return [os.path.join(directory, n) for n in sorted(names) if fnmatch.fnmatchcase(n, name)]


def signature(base: str, path: str) -> tuple[int, int]:
    """(size, modification time in ns) of the file, not following a final symbolic link: a
    log is parsed again only when this changes."""
    full = _under(base, path)
    try:
        info = os.lstat(full)
    except OSError as exc:
        raise SourceError(f"{full}: {exc.strerror or exc}") from None
    return info.st_size, info.st_mtime_ns


def read_owned(base: str, path: str, uid: int, max_bytes: int) -> str:
    """The first `max_bytes` of a regular file owned by `uid`, as seen from `base`."""
    full = _under(base, path)
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SourceError(f"{full}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SourceError(f"{full}: not a regular file")
        if info.st_uid != uid:
            raise SourceError(f"{full}: owned by uid {info.st_uid}, not the process's {uid}")
        chunks, left = [], max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise SourceError(f"{full}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _under(base: str, path: str) -> str:
    return os.path.join(base, path.lstrip("/"))
