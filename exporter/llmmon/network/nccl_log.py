"""What a rank's own NCCL_DEBUG=INFO log says about its network: version, net, devices, GDR, paths.

NCCL prints every INFO line as `host:pid:tid [cudaDev] NCCL INFO <message>` (2.4 to 2.30; newer
versions may put a timestamp first, launchers put `[1,0]<stdout>:`, `[155] ` or a log shipper's
columns first).  Only lines with that `:pid:tid [dev] NCCL INFO ` shape count, so prose that
quotes a message ("look for NCCL INFO NET/IB : Using ...") does not.  The version alone comes
without the prefix on stdout (`NCCL version 2.21.5+cuda12.4`), so that form is taken when it
starts a line (after at most a short launcher prefix) and carries NCCL's own `+cuda` suffix,
which PyTorch's error messages ("..., NCCL version 2.4.8") do not, and ends the line.

The text is untrusted and may be huge: the work is bounded by a cap on the characters read
(the head and the tail of a longer text: the start says how NCCL initialised, the end what the
newest communicators use), on the NCCL lines read and on each line's length; every set kept is
capped too.  Nothing here raises on any str.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CHARS = 4 << 20          # characters of text looked at (half from the head, half the tail)
MAX_LINES = 100_000          # NCCL lines read
MAX_LINE = 4096              # characters of one message looked at
MAX_DEVICES = 64
MAX_PATHS = 32
MAX_NAME = 64                # a net or device name longer than this is cut
_PREFIX_BACK = 96            # how far before "NCCL INFO" the `:pid:tid [dev] ` shape is looked for
_VERSION_BACK = 64           # the longest launcher prefix before a bare "NCCL version"

_INFO_PREFIX = re.compile(r"\S:\d{1,10}:\d{1,10} \[-?\d{1,6}\] $")
_VERSION = re.compile(r"(\d{1,3}\.\d{1,3}\.\d{1,3})[^\s+]{0,16}\+cuda\d{1,3}\.\d{1,3}\s*$")
_DEVICE = re.compile(r"\[\d{1,4}\] ?([^\s\[\]{},;=]+)")
_NET_USING = re.compile(r"NET/([^\s:]{1,64}) ?: Using(.*)")
_CHANNEL = re.compile(r"(?:Channel|Ring|CollNet) \d{1,4}(?:/\d{1,4})? ?: ")
_NET_VIA = re.compile(r"NET/(.{1,64}?)/\d{1,4}(?:\(\d{1,6}\))?(/GDRDMA)?")
_APPLIED = re.compile(r"(NCCL_[A-Z0-9_]{1,64}) set by environment to (.{0,1024}?)(\.?)\s*$")
_INTEGER_VALUE = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|[0-9]+)")
MAX_APPLIED = 64
_COLLNET_VIA = re.compile(r"COLLNET/(.{1,64}?)/\d{1,4}(/GDRDMA)?")


@dataclass(frozen=True)
class NcclLog:
    """One rank's NCCL log, reduced to what the network checks need."""

    version: str                    # "2.21.5"; '' when no version line was seen
    net: str                        # "IB", "Socket" or a plugin's name ("AWS Libfabric"); ''
    net_devices: tuple[str, ...]    # ("mlx5_0:1/RoCE", ...) or ("eth0:10.0.0.1<0>", ...)
    gdr: bool | None                # GPUDirect RDMA used; None when the log does not say
    paths: frozenset[str]           # "P2P/IPC", "SHM", "NET/IB/GDRDMA", ... (no channel ids)
    lines: int                      # NCCL lines read
    # What NCCL says it applied ("NCCL_IB_HCA set by environment to mlx5_0", subsystem ENV):
    # the environment and /etc/nccl.conf, whose values NCCL puts in its environment.
    applied: tuple[tuple[str, str], ...] = ()


EMPTY = NcclLog(version="", net="", net_devices=(), gdr=None, paths=frozenset(), lines=0)


class _State:
    """What the lines said so far; every collection bounded."""

    def __init__(self) -> None:
        self.version = ""
        self.using_network = ""         # the last "Using network X" (2.6 and newer)
        self.channel_net = ""           # the last net a NET channel line went through
        self.devices: dict[str, dict[str, None]] = {}   # "IB" -> ordered set of devices
        self.paths: dict[str, None] = {}
        self.net_channels = False
        self.net_gdr = False
        self.gdr_enabled = False
        self.gdr_disabled = False
        self.lines = 0
        self.applied: dict[str, str] = {}

    def add_path(self, path: str) -> None:
        if path not in self.paths and len(self.paths) < MAX_PATHS:
            self.paths[path] = None

    def message(self, msg: str) -> None:
        """One INFO message (the text after "NCCL INFO ")."""
        if msg.startswith("NCCL version "):
            self.bare_version(msg[13:])
        elif msg.startswith("Using network "):
            name = msg[14:].strip()[:MAX_NAME]
            if name:
                self.using_network = name
        elif msg.startswith("NET/"):
            self.net_line(msg)
        elif msg.startswith(("Channel ", "Ring ", "CollNet ")):
            self.channel(msg)
        elif msg.startswith("NVLS comm ") or msg.startswith("Connected NVLS"):
            self.add_path("NVLS")
        elif msg.startswith("Connected collnet"):
            self.add_path("CollNet")
        elif msg.startswith("NCCL_") and " set by environment to " in msg:
            self.setting(msg)
        if "GPU Direct RDMA Enabled for " in msg:
            self.gdr_enabled = True
        elif "GPU Direct RDMA Disabled for " in msg:
            self.gdr_disabled = True

    def setting(self, msg: str) -> None:
        """`NCCL_IB_DISABLE set by environment to 0.`: integer settings end in a full stop."""
        match = _APPLIED.match(msg)
        if not match:
            return
        name, value, stop = match.groups()
        if stop and not _INTEGER_VALUE.fullmatch(value):
            value += stop
        if name in self.applied or len(self.applied) < MAX_APPLIED:
            self.applied[name] = value

    def bare_version(self, rest: str) -> None:
        match = _VERSION.match(rest)
        if match and not self.version:
            self.version = match.group(1)

    def net_line(self, msg: str) -> None:
        """`NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:...`: the devices of that net."""
        match = _NET_USING.match(msg)
        if not match:
            return
        name, listed = match.group(1), match.group(2).split("; OOB", 1)[0]
        if name not in self.devices:
            if len(self.devices) >= 8:
                return
            self.devices[name] = {}
        known = self.devices[name]
        for device in _DEVICE.findall(listed):
            if len(known) >= MAX_DEVICES:
                break
            known.setdefault(device[:MAX_NAME], None)

    def channel(self, msg: str) -> None:
        """`Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA` and its older forms."""
        if not _CHANNEL.match(msg):
            return
        at = msg.find(" via ")
        if at < 0:
            return                      # a ring's order ("Channel 00/02 : 0 1 2 3"), no transport
        self.add_path_of(msg[at + 5:])

    def add_path_of(self, via: str) -> None:
        if via.startswith("NET/"):
            match = _NET_VIA.match(via)
            if not match:
                return
            name, gdr = match.group(1), bool(match.group(2))
            self.net_channels = True
            self.net_gdr = self.net_gdr or gdr
            self.channel_net = name
            self.add_path(f"NET/{name}/GDRDMA" if gdr else f"NET/{name}")
        elif via.startswith("COLLNET/"):
            match = _COLLNET_VIA.match(via)
            if match:
                self.net_channels = True
                self.net_gdr = self.net_gdr or bool(match.group(2))
            self.add_path("CollNet")
        elif via.startswith("P2P/"):
            kind = via[4:].split("/", 1)[0].strip()
            if kind:
                self.add_path("P2P/" + kind[:MAX_NAME])
        elif via.startswith("SHM/") or via.startswith("direct shared memory"):
            self.add_path("SHM")

    def result(self) -> NcclLog:
        net = self.using_network or self.channel_net
        if not net:
            if self.devices.get("IB"):
                net = "IB"              # 2.4/2.5 set up sockets for bootstrap whatever they use
            elif self.devices.get("Socket"):
                net = "Socket"
        devices = self.devices.get(net) or {}
        if not devices and net.startswith("IB"):
            devices = self.devices.get("IB") or {}   # IBext plugins print NET/IB's line
        if self.net_channels:
            gdr: bool | None = self.net_gdr
        elif self.gdr_enabled:
            gdr = True
        elif self.gdr_disabled:
            gdr = False
        else:
            gdr = None
        return NcclLog(version=self.version, net=net, net_devices=tuple(devices), gdr=gdr,
                       paths=frozenset(self.paths), lines=self.lines,
                       applied=tuple(sorted(self.applied.items())))


def _bounded(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    half = MAX_CHARS // 2
    return text[:half] + "\n" + text[-half:]


def parse(text: str) -> NcclLog:
    """The NcclLog of one rank's log text; EMPTY for anything that is not one, never raises."""
    if not isinstance(text, str) or not text:
        return EMPTY
    text = _bounded(text)
    state = _State()
    size = len(text)
    pos = 0                             # the start of the line being looked at
    while state.lines < MAX_LINES:
        hit = text.find("NCCL ", pos)
        if hit < 0:
            break
        newline = text.rfind("\n", pos, hit)
        start = pos if newline < 0 else newline + 1
        end = text.find("\n", hit)
        if end < 0:
            end = size
        if _line(text, start, hit, end, state):
            state.lines += 1
        pos = end + 1
    return state.result()


def _line(text: str, start: int, hit: int, end: int, state: _State) -> bool:
    """Read the line text[start:end]; hit is its first "NCCL ". True if it is NCCL's own."""
    limit = min(end, start + MAX_LINE)
    while 0 <= hit < limit:
        after = text[hit + 5:hit + 13]
        if after.startswith("INFO ") or after.startswith("WARN "):
            before = text[max(start, hit - _PREFIX_BACK):hit]
            if after.startswith("INFO ") and _INFO_PREFIX.search(before):
                state.message(text[hit + 10:min(end, hit + 10 + MAX_LINE)].rstrip("\r"))
                return True
            if after.startswith("WARN ") and "] " in before:
                return True             # NCCL's warnings: counted, not read
        elif after.startswith("version ") and hit - start <= _VERSION_BACK:
            if end - hit < 96 and _VERSION.match(text, hit + 13, end):
                state.bare_version(text[hit + 13:end])
                return True
        hit = text.find("NCCL ", hit + 5, limit)
    return False
