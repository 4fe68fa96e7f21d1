"""The kernel log as `/dev/kmsg` serves it: one record per read, never blocking.

Each record is `PRIORITY,SEQUENCE,MICROSECONDS,FLAGS[,...];MESSAGE`, followed by continuation
lines that start with a space (`SUBSYSTEM=pci`, `DEVICE=+pci:0000:18:00.0`).  The timestamp
counts microseconds since boot on the clock `CLOCK_MONOTONIC` reads.  On the character device
each read() returns one record and EAGAIN at the end of the buffer (opened non-blocking, so a
start-up read never waits for new messages); EPIPE means the ring overwrote the record we were
about to read, and reading simply goes on.  A regular file (a test fixture, or a saved copy
of the device) holds the same records one per line.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

RECORD_MAX = 8192  # larger than the kernel's CONSOLE_EXT_LOG_MAX: a whole record fits


class KmsgError(OSError):
    """The kernel log cannot be read (missing, or CAP_SYSLOG/dmesg_restrict), with its path."""


@dataclass(frozen=True)
class KmsgRecord:
    sequence: int
    seconds: float  # since boot, CLOCK_MONOTONIC
    message: str


def _parse(text: str) -> KmsgRecord | None:
    """One record's first line; None for what is not a record (e.g. a continuation line)."""
    header, sep, message = text.partition(";")
    fields = header.split(",")
    if not sep or len(fields) < 3 or not all(f.isdigit() for f in fields[:3]):
        return None
    return KmsgRecord(int(fields[1]), int(fields[2]) / 1e6, message.rstrip("\n"))


def _device_records(fd: int) -> list[str]:
    records = []
    while True:
        try:
            chunk = os.read(fd, RECORD_MAX)
        except BlockingIOError:
            return records
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # overwritten under us: the next read continues
                continue
            raise
        if not chunk:
            return records
        records.append(chunk.decode("utf-8", "replace").split("\n", 1)[0])


def read_kmsg(path: str) -> list[KmsgRecord]:
    """Every record in the kernel log buffer now; raises KmsgError if it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise KmsgError(exc.errno, f"{path}: {exc.strerror}") from None
    try:
        if stat.S_ISCHR(os.fstat(fd).st_mode):
            lines = _device_records(fd)
        else:
            with os.fdopen(os.dup(fd), encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
    except OSError as exc:
        raise KmsgError(exc.errno, f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    return [record for record in map(_parse, lines) if record is not None]
