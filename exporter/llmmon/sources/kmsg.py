"""The kernel log as `/dev/kmsg` serves it: one record per read, never blocking.

Each record is `PRIORITY,SEQUENCE,MICROSECONDS,FLAGS[,...];MESSAGE`, followed by continuation
lines that start with a space (`SUBSYSTEM=pci`, `DEVICE=+pci:0000:18:00.0`).  The timestamp
counts microseconds since boot on the clock `CLOCK_MONOTONIC` reads.  On the character device
each read() returns one record and EAGAIN at the end of the buffer (opened non-blocking, so a
start-up read never waits for new messages); EPIPE means the ring overwrote the record we were
about to read, and reading simply goes on.  A regular file (a test fixture, a saved copy
of the device, or the kernel-log relay's copy of the NVRM records) holds the same records one
per line; lines that are not records (`#` comments) are skipped.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

RECORD_MAX = 8192  # larger than the kernel's CONSOLE_EXT_LOG_MAX: a whole record fits
# The first line of a relayed copy (gpu/kmsg_relay.py) whose relay could not read the log.
RELAY_ERROR = "# llmmon kmsg-relay error: "


class KmsgError(OSError):
    """The kernel log cannot be read (missing, or CAP_SYSLOG/dmesg_restrict), with its path."""


@dataclass(frozen=True)
class KmsgRecord:
    sequence: int
    seconds: float  # since boot, CLOCK_MONOTONIC
    message: str


def parse(text: str) -> KmsgRecord | None:
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


def open_kmsg(path: str) -> int:
    """A non-blocking descriptor on the kernel log (the device or a saved copy)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise KmsgError(exc.errno, f"{path}: {exc.strerror}") from None


def is_device(fd: int) -> bool:
    return stat.S_ISCHR(os.fstat(fd).st_mode)


def read_lines(fd: int, path: str, partial: bool = True) -> list[str]:
    """The record lines readable now from `fd`: the device's next records, or a file's lines
    from its offset on; `partial=False` leaves a file's unfinished last line for the next
    read (a file still being appended to)."""
    try:
        if is_device(fd):
            return _device_records(fd)
        data = bytearray()
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    except OSError as exc:
        raise KmsgError(exc.errno, f"{path}: {exc.strerror}") from None
    end = len(data) if partial else data.rfind(b"\n") + 1
    if end < len(data):
        os.lseek(fd, end - len(data), os.SEEK_CUR)
    return data[:end].decode("utf-8", "replace").splitlines()


def read_kmsg(path: str) -> list[KmsgRecord]:
    """Every record in the kernel log buffer now; raises KmsgError if it cannot be read."""
    fd = open_kmsg(path)
    try:
        lines = read_lines(fd, path)
    finally:
        os.close(fd)
    if lines and lines[0].startswith(RELAY_ERROR):
        raise KmsgError(errno.EIO, f"{path}: relayed: {lines[0][len(RELAY_ERROR):]}")
    return [record for record in map(parse, lines) if record is not None]
