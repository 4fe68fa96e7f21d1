"""NFS client statistics from /proc/<pid>/mountstats (the kernel's nfs_show_stats and
rpc_clnt_show_stats output), parsed line by line so one odd line loses only itself.

Which mounts a process sees depends on its mount namespace: in a pod, /proc/self shows the
pod's own mounts; with hostPID, /proc/1/mountstats shows the host's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# per-op: operations, transmissions, major timeouts, bytes sent, bytes received,
# queue ms, RTT ms, execute ms, [errors (kernel 5.6+)]
OP_FIELDS = 8
_DEVICE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)")
_OP = re.compile(r"^\s*([A-Z][A-Z0-9_]*):(.*)$")
_ESCAPE = re.compile(r"\\([0-7]{3})")
U63 = 1 << 63  # larger values are negative kernel times printed unsigned


@dataclass
class Mount:
    export: str
    mountpoint: str
    fstype: str
    options: dict[str, str] = field(default_factory=dict)
    bytes: list[int] = field(default_factory=list)
    operations: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class Mountstats:
    mounts: list[Mount]
    problems: list[str]


def _unescape(path: str) -> str:
    """Mount paths escape space, tab, newline and backslash as octal (`\\040`)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), path)


def parse(text: str, where: str) -> Mountstats:
    """NFS mounts (fstype nfs, nfs4) with their options, byte counters and per-op stats."""
    result = Mountstats([], [])
    mount: Mount | None = None
    for number, line in enumerate(text.splitlines(), 1):
        device = _DEVICE.match(line)
        if device:
            export, mountpoint, fstype = device.groups()
            mount = None
            if fstype.startswith("nfs"):
                mount = Mount(_unescape(export), _unescape(mountpoint), fstype)
                result.mounts.append(mount)
            continue
        if mount is None or not line.strip():
            continue
        key, _, rest = line.strip().partition(":")
        try:
            if key == "opts":
                mount.options = dict(o.partition("=")[::2] for o in rest.strip().split(","))
            elif key == "bytes":
                mount.bytes = [int(v) for v in rest.split()]
            else:
                op = _OP.match(line)
                if op:
                    values = [int(v) for v in op.group(2).split()]
                    if len(values) < OP_FIELDS:
                        raise ValueError(f"{len(values)} values, expected {OP_FIELDS} or more")
                    mount.operations[op.group(1)] = values
        except ValueError as exc:
            result.problems.append(f"{where}:{number}: {mount.mountpoint}: {exc}: "
                                   f"{line.strip()[:80]!r}")
    return result
