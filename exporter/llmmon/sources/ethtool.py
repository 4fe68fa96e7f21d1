"""Driver statistics (`ethtool -S`): live through the SIOCETHTOOL ioctl, or from text dumps.

Live reads use pyroute2's IoctlEthtool with a fresh object per read: it caches the stat
names and sizes its buffer from them, while mlx5 changes its stat count when PFC priorities or
channels change.  A count that changes during the read discards the read.  The dump backend
reads files holding exactly what `ethtool -S <iface>` prints, one per interface and named after
it, for tests, the simulator and support cases.  Both strip names (old mlx5 kernels printed
`tx_pause_storm_warning_events ` with a trailing space).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Protocol

from llmmon.sources import pyroute
from llmmon.sources.fs import RootedFS, SourceError

HEADER = "NIC statistics:"
MAX_DUMP_BYTES = 4 << 20


class NoStatistics(SourceError):
    """The interface's driver has no statistics (EOPNOTSUPP): nothing to read, no error."""


@dataclass
class Statistics:
    """(name, value) pairs in driver order, and lines that could not be parsed."""

    values: list[tuple[str, int]]
    problems: list[str] = field(default_factory=list)


class StatisticsSource(Protocol):
    def interfaces(self) -> list[str]: ...

    def read(self, interface: str) -> Statistics: ...


def parse_dump(text: str, where: str) -> Statistics:
    """`ethtool -S` output: a header, then `name: value` lines; names may contain ': '."""
    stats = Statistics([])
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped == HEADER:
            continue
        name, sep, value = stripped.rpartition(":")
        name = name.rstrip()
        if sep and name:
            try:
                stats.values.append((name, int(value)))
                continue
            except ValueError:
                pass
        stats.problems.append(f"{where}:{number}: not 'name: value': {stripped[:80]!r}")
    return stats


class DumpDirectory:
    """`ethtool -S` captures in a directory, one file per interface."""

    def __init__(self, directory: str) -> None:
        self.files = RootedFS(directory)

    def interfaces(self) -> list[str]:
        if not os.path.isdir(self.files.root):
            raise SourceError(f"{self.files.root}: no such directory")
        return [name for name in self.files.listdir() if not name.startswith(".")]

    def read(self, interface: str) -> Statistics:
        text = self.files.read_text(interface, max_bytes=MAX_DUMP_BYTES)
        return parse_dump(text, self.files.path(interface))


class Ioctl:
    """Live statistics of the interfaces in /sys/class/net (PCI-backed ones unless `all`)."""

    def __init__(self, sysfs: RootedFS, all_interfaces: bool) -> None:
        self.sysfs = sysfs
        self.all_interfaces = all_interfaces

    def interfaces(self) -> list[str]:
        names = self.sysfs.listdir("class/net")
        if self.all_interfaces:
            return names
        return [n for n in names if os.path.exists(self.sysfs.path("class/net", n, "device"))]

    def read(self, interface: str) -> Statistics:
        ioctl = pyroute.module("pyroute2.ethtool.ioctl")
        try:
            ethtool = ioctl.IoctlEthtool(interface)
        except (OSError, ValueError) as exc:
            raise SourceError(f"{interface}: cannot open an ethtool socket: {exc}") from None
        try:
            values = ethtool.get_statistics()
            if ethtool.get_stringset_length(ioctl.ETH_SS_STATS) != len(values):
                raise SourceError(f"{interface}: stat count changed during the read; skipped")
        except ioctl.NotSupportedError:
            raise NoStatistics(f"{interface}: driver has no statistics") from None
        except ioctl.NoSuchDevice:
            raise SourceError(f"{interface}: no such device (vanished)") from None
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                raise NoStatistics(f"{interface}: driver has no statistics") from None
            raise SourceError(f"{interface}: ethtool ioctl: {exc.strerror or exc}") from None
        finally:
            ethtool.close()
        return Statistics([(name.strip(), value) for name, value in values])
