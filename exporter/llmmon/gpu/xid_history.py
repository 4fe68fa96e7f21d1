"""XIDs that happened before the daemon started, from the kernel log.

The NVML event set only delivers XIDs raised after it was registered, so an XID from before
the daemon started (or while it was down, or restarting) would be lost.  The driver also logs
every XID to the kernel ring buffer as

    NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.

(older drivers omit `PCI:`).  `history()` reads that buffer once, before the event set is
registered, so each XID is counted by exactly one of the two: what the buffer held at the read
by this module, what came later by NVML.  An XID raised in the moment between the read and
the registration is missed; none is counted twice.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass

from llmmon.sources.kmsg import KmsgRecord

XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})"
                      r"(?:\.[0-7])?\): (\d+)\b")


def pci_key(address: str) -> str:
    """`domain:bus:device` of a PCI address in NVML's (00000000:18:00.0) or the log's form."""
    domain, bus, device = address.split(":")[:3]
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.split('.')[0].lower()}"


@dataclass(frozen=True)
class XidHistory:
    counts: Counter[tuple[str, int]]  # (pci_key, xid) -> events in the kernel log
    last: dict[tuple[str, int], float]  # (pci_key, xid) -> wall-clock time of the last one


def history(records: list[KmsgRecord]) -> XidHistory:
    """Count the NVRM Xid records; boot-relative times become wall-clock times."""
    boot = time.time() - time.monotonic()
    counts: Counter[tuple[str, int]] = Counter()
    last: dict[tuple[str, int], float] = {}
    for record in records:
        match = XID_LINE.search(record.message)
        if match is None:
            continue
        domain, bus, device, xid = match.groups()
        key = (pci_key(f"{domain}:{bus}:{device}"), int(xid))
        counts[key] += 1
        last[key] = max(last.get(key, 0.0), boot + record.seconds)
    return XidHistory(counts, last)
