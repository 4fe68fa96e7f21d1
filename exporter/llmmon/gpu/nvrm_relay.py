"""A relay of the kernel log's NVRM records into a file the unprivileged exporter can read.

In Kubernetes the exporter's container cannot open /dev/kmsg: the device is outside a
container's device allow-list unless the container is privileged, and CAP_SYSLOG does not reach
a non-root process.  The kernel-log overlay runs this relay as a privileged native sidecar that
does nothing else: it copies the driver's records (`NVRM:` lines only; the rest of the kernel
log stays out of the exporter's reach) into a file on a volume the exporter mounts read-only,
and the exporter reads that file at start as it would read /dev/kmsg.

The file holds records in /dev/kmsg's own form, sorted by sequence number, after one header
line with the boot they belong to.  At start the relay merges what the ring buffer holds with
what the file already held for the same boot (a relay restart keeps records the ring has
overwritten since), and writes the whole file through a rename, so the exporter never reads
half of it; then it appends each new NVRM record as it arrives, and past `max_records` rewrites
the newest half.  When the kernel log cannot be read the file says why in its header, and the
exporter reports that error instead of counting nothing as a clean read.
"""

from __future__ import annotations

import logging
import os
import select
import threading

from llmmon.sources.kmsg import RELAY_ERROR as ERROR
from llmmon.sources.kmsg import KmsgError, is_device, open_kmsg, parse, read_lines

HEADER = "# llmmon kmsg-relay boot_id="
log = logging.getLogger("llmmon.kmsg_relay")


def boot_id(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(64).strip()
    except OSError:
        return ""


def nvrm(lines: list[str]) -> dict[int, str]:
    """The driver's records among `lines`, by sequence number."""
    found = {}
    for line in lines:
        record = parse(line)
        if record is not None and "NVRM:" in record.message:
            found[record.sequence] = line
    return found


def saved(out: str, boot: str) -> dict[int, str]:
    """The records the file already holds, if it was written in this boot."""
    try:
        with open(out, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    if not lines or lines[0] != HEADER + boot:
        return {}
    return nvrm(lines[1:])


def write_whole(out: str, header: str, records: dict[int, str]) -> None:
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(header + "\n")
        handle.writelines(records[seq] + "\n" for seq in sorted(records))
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)


class Relay:
    def __init__(self, source: str, out: str, boot_id_path: str,
                 max_records: int = 10000, interval: float = 1.0) -> None:
        self.source, self.out = source, out
        self.boot = boot_id(boot_id_path)
        self.max_records, self.interval = max_records, interval
        self.records: dict[int, str] = {}
        self._fd: int | None = None

    def start(self) -> int:
        """Merge the ring buffer into the file, written whole; the number of records held.
        Raises KmsgError (after writing the error into the file) if the log cannot be read."""
        try:
            self._fd = open_kmsg(self.source)
            current = nvrm(read_lines(self._fd, self.source, partial=False))
        except KmsgError as exc:
            write_whole(self.out, ERROR + str(exc), {})
            raise
        self.records = {**saved(self.out, self.boot), **current}
        self._trim(self.max_records)
        write_whole(self.out, HEADER + self.boot, self.records)
        return len(self.records)

    def follow(self, stop: threading.Event) -> None:
        """Append each new NVRM record until `stop` is set."""
        assert self._fd is not None, "start() first"
        device = is_device(self._fd)
        poller = select.poll()
        if device:
            poller.register(self._fd, select.POLLIN)
        while not stop.is_set():
            if device:
                poller.poll(self.interval * 1000)
            else:  # a saved copy being appended to: look again every interval
                stop.wait(self.interval)
            new = {seq: line for seq, line in nvrm(read_lines(
                self._fd, self.source, partial=False)).items() if seq not in self.records}
            if new:
                self._append(new)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, new: dict[int, str]) -> None:
        self.records.update(new)
        if len(self.records) > self.max_records:
            self._trim(self.max_records // 2)
            write_whole(self.out, HEADER + self.boot, self.records)
            return
        with open(self.out, "a", encoding="utf-8") as handle:
            handle.writelines(new[seq] + "\n" for seq in sorted(new))
        log.info("relayed %d new NVRM record(s)", len(new))

    def _trim(self, keep: int) -> None:
        for seq in sorted(self.records)[:-keep or None]:
            del self.records[seq]


def check(out: str, boot_id_path: str) -> str:
    """'' when the file is written for this boot (the sidecar's startup probe), else why not.
    A file that records an error is ready too: the exporter reports that error."""
    try:
        with open(out, encoding="utf-8", errors="replace") as handle:
            first = handle.readline().rstrip("\n")
    except OSError as exc:
        return f"{out}: {exc.strerror}"
    if first.startswith(ERROR) or first == HEADER + boot_id(boot_id_path):
        return ""
    return f"{out}: not written in this boot yet"
