"""Runs inside the test's network namespace (`ip netns exec NS python netns_probe.py`), where
/sys/class/net, rtnetlink and the ethtool ioctl all see that namespace's veth pair.

It collects with the live backends, sends FRAMES raw Ethernet frames of FRAME_BYTES from va to
vb, collects again, takes vb down, collects a third time, and prints the three expositions and
va's `ethtool -S` statistics and vb's ifindex as JSON for the test to check.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from llmmon.collector import Context
from llmmon.collectors.netdev import NetdevCollector
from llmmon.collectors.nic import NicCollector
from llmmon.exposition import render
from llmmon.sources.ethtool import Ioctl
from llmmon.sources.fs import RootedFS
from tests.core.helpers import make_collector

FRAMES, FRAME_BYTES = 50, 1000
ETHERTYPE = 0x88B5  # IEEE 802 local experimental: no protocol stack answers it


def collect(collectors: list) -> str:
    return "".join(render(c.collect(Context()))[0].decode() for c in collectors)


def mac(interface: str) -> bytes:
    with open(f"/sys/class/net/{interface}/address") as handle:
        return bytes.fromhex(handle.read().strip().replace(":", ""))


def main() -> None:
    collectors = [
        make_collector(NetdevCollector, "/proc", "/sys", device_exclude="^lo$"),
        make_collector(NicCollector, "/proc", "/sys", all_interfaces=True,
                       extra_stats="^peer_ifindex$"),
    ]
    before = collect(collectors)
    frame = mac("vb") + mac("va") + ETHERTYPE.to_bytes(2, "big")
    frame += bytes(FRAME_BYTES - len(frame))
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
        raw.bind(("va", 0))
        for _ in range(FRAMES):
            raw.send(frame)
    after = collect(collectors)
    subprocess.run(["ip", "link", "set", "vb", "down"], check=True)
    down = collect(collectors)
    stats = Ioctl(RootedFS("/sys"), all_interfaces=True).read("va")
    with open("/sys/class/net/vb/ifindex") as handle:
        vb_ifindex = int(handle.read())
    json.dump({"before": before, "after": after, "down": down, "ethtool": stats.values,
               "vb_ifindex": vb_ifindex}, sys.stdout)


if __name__ == "__main__":
    main()
