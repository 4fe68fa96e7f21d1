"""TCP counters of one network namespace: /proc/<pid>/net/snmp (`Tcp:`) and net/netstat
(`TcpExt:`) of a process in it.

gloo and NCCL's socket transport move a job's collectives over TCP, and a lossy or congested
link between nodes shows first as retransmitted segments and retransmission timeouts.  The
files are per network namespace, so a rank's own /proc/<pid>/net holds its pod's counters
even when the daemon runs in the host's namespace.  Each file is pairs of lines: a header of
field names and a line of values, both starting with the same `Prefix:`.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmon.sources.fs import RootedFS, SourceError

MAX_BYTES = 64 << 10


@dataclass(frozen=True)
class TcpStats:
    sent: int  # Tcp OutSegs (retransmissions excluded, as the kernel counts them)
    retransmitted: int  # Tcp RetransSegs
    timeouts: int | None  # TcpExt TCPTimeouts (retransmission timer expiries); None: absent


def pairs(text: str, prefix: str, where: str) -> dict[str, int]:
    """The `prefix` block of an snmp/netstat file as {field: value}; SourceError if malformed."""
    lines = [line.split() for line in text.splitlines() if line.startswith(prefix + ":")]
    if not lines:
        return {}
    if len(lines) != 2 or len(lines[0]) != len(lines[1]):
        raise SourceError(f"{where}: {prefix} block is not a header and a value line of equal "
                          f"length ({[len(line) for line in lines]} fields)")
    values: dict[str, int] = {}
    for name, value in zip(lines[0][1:], lines[1][1:]):
        try:
            values[name] = int(value)
        except ValueError:
            raise SourceError(f"{where}: {prefix} {name} is not a number: {value[:20]!r}") \
                from None
    return values


def read(procfs: RootedFS, pid: int) -> TcpStats:
    """The counters of `pid`'s network namespace; SourceError when unreadable or malformed."""
    where = procfs.path(str(pid), "net", "snmp")
    tcp = pairs(procfs.read_text(str(pid), "net", "snmp", max_bytes=MAX_BYTES), "Tcp", where)
    missing = [k for k in ("OutSegs", "RetransSegs") if k not in tcp]
    if missing:
        raise SourceError(f"{where}: no Tcp {', '.join(missing)}")
    try:
        extended = pairs(procfs.read_text(str(pid), "net", "netstat", max_bytes=MAX_BYTES),
                         "TcpExt", procfs.path(str(pid), "net", "netstat"))
    except SourceError:
        extended = {}  # the timeouts are a detail; the retransmissions are the evidence
    return TcpStats(tcp["OutSegs"], tcp["RetransSegs"], extended.get("TCPTimeouts"))


def namespace(procfs: RootedFS, pid: int | str) -> str:
    """The process' network namespace (`net:[inode]`); SourceError when it cannot be read."""
    return procfs.readlink(str(pid), "ns", "net")
