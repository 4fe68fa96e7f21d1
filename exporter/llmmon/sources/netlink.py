"""Per-interface link statistics (rtnetlink IFLA_STATS64): live through pyroute2, or from an
`ip -s -s -j link show` capture for tests, the simulator and support cases.

Both yield the kernel's `rtnl_link_stats64` field names as pyroute2 decodes them (`rx_bytes`,
`tx_dropped`, ...).  rtnetlink is network-namespace scoped: in a pod this needs hostNetwork.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Protocol

from llmmon.sources import pyroute
from llmmon.sources.fs import RootedFS, SourceError

MAX_DUMP_BYTES = 16 << 20
# `ip -j` names that are not `<direction>_<name>` in rtnl_link_stats64.
_IP_JSON_NAMES = {("rx", "multicast"): "multicast", ("tx", "collisions"): "collisions"}


@dataclass(frozen=True)
class Link:
    name: str
    stats: dict[str, int] | None  # None: the kernel sent no IFLA_STATS64


class LinkSource(Protocol):
    def links(self) -> list[Link]: ...


class Rtnetlink:
    """One RTM_GETLINK dump per call, on a fresh socket (no state survives a failed run)."""

    def links(self) -> list[Link]:
        netlink_error = pyroute.module("pyroute2.netlink.exceptions").NetlinkError
        try:
            with pyroute.module("pyroute2").IPRoute() as ipr:
                messages = list(ipr.get_links())
        except (OSError, netlink_error) as exc:
            raise SourceError(f"rtnetlink link dump: {exc}") from None
        return [Link(msg.get_attr("IFLA_IFNAME"), msg.get_attr("IFLA_STATS64"))
                for msg in messages]


class IpJsonDump:
    """A file holding the output of `ip -s -s -j link show`."""

    def __init__(self, path: str) -> None:
        self.path = path

    def links(self) -> list[Link]:
        directory, name = os.path.split(os.path.abspath(self.path))
        text = RootedFS(directory).read_text(name, max_bytes=MAX_DUMP_BYTES)
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SourceError(f"{self.path}: not JSON: {exc}") from None
        if not isinstance(data, list):
            raise SourceError(f"{self.path}: expected the list `ip -j link show` prints")
        return [self._link(entry) for entry in data if isinstance(entry, dict)]

    @staticmethod
    def _link(entry: dict[str, Any]) -> Link:
        stats64 = entry.get("stats64")
        if not isinstance(stats64, dict):
            return Link(str(entry.get("ifname", "")), None)
        stats = {}
        for direction in ("rx", "tx"):
            for key, value in (stats64.get(direction) or {}).items():
                if isinstance(value, int):
                    stats[_IP_JSON_NAMES.get((direction, key), f"{direction}_{key}")] = value
        return Link(str(entry.get("ifname", "")), stats)
