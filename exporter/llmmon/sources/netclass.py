"""Network interfaces under /sys/class/net: their names and whether each is up.

What NCCL's socket transport and bootstrap can use is an interface that is up; the netdev
collector reads traffic through rtnetlink, this only the sysfs state.
"""

from __future__ import annotations

from llmmon.sources.fs import RootedFS, SourceError

CLASS = "class/net"
MAX_INTERFACES = 4096  # a node with thousands of veths still costs a bounded read
IFF_UP = 0x1


def interfaces(sysfs: RootedFS) -> list[str]:
    """Interface names, sorted, at most MAX_INTERFACES."""
    return sysfs.listdir(CLASS)[:MAX_INTERFACES]


def operstate(sysfs: RootedFS, name: str) -> str:
    """RFC 2863 state as the kernel writes it (`up`, `down`, `unknown`, ...); '' unreadable."""
    try:
        return sysfs.read_value(CLASS, name, "operstate")[:32]
    except SourceError:
        return ""


def is_up(sysfs: RootedFS, name: str) -> bool:
    """operstate `up`, or `unknown` on an administratively up interface: loopback and some
    virtual drivers never report an operational state, yet carry traffic."""
    state = operstate(sysfs, name)
    if state == "up":
        return True
    if state != "unknown":
        return False
    try:
        return bool(sysfs.read_int(CLASS, name, "flags") & IFF_UP)
    except SourceError:
        return False


def process_interfaces(procfs: RootedFS, pid: int) -> list[str] | None:
    """The interfaces of a process's own network namespace (its /proc/<pid>/net/dev), or
    None when it shares the daemon's (procfs `self`) or that cannot be told: then /sys/class/net
    is what it sees."""
    try:
        theirs = procfs.readlink(str(pid), "ns", "net")
        ours = procfs.readlink("self", "ns", "net")
    except SourceError:
        return None
    if theirs == ours:
        return None
    try:
        text = procfs.read_text(str(pid), "net", "dev", max_bytes=1 << 20)
    except SourceError:
        return None
    names = [line.split(":", 1)[0].strip() for line in text.splitlines()[2:] if ":" in line]
    return sorted(n for n in names if n)[:MAX_INTERFACES]
