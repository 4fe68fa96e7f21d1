"""The netdev collector: golden output from an `ip -s -s -j link` capture, bad input, and a
real veth pair in a network namespace with a known number of bytes pushed across it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmmon.collector import Context
from llmmon.collectors.netdev import NetdevCollector
from llmmon.exposition import render
from tests.conftest import FIXTURES, ROOT, compare_golden, pythonpath
from tests.core.helpers import make_collector, run
from tests.network.netns_probe import FRAME_BYTES, FRAMES

LINKS = FIXTURES / "netlink" / "links.json"


def collector(sysfs: Path = FIXTURES / "sys", dump: Path = LINKS,
              **options: object) -> NetdevCollector:
    return make_collector(NetdevCollector, FIXTURES / "proc", sysfs, dump=str(dump), **options)


def key(name: str, netdev: str) -> tuple[str, tuple]:
    return (name, (("netdev", netdev),))


def test_golden_exposition() -> None:
    text = render(collector().collect(Context()))[0].decode()
    compare_golden("netdev.prom", text)


def test_stats_and_link_attributes() -> None:
    samples, ctx, _ = run(collector())
    assert ctx.error_count == 0
    assert ctx.watched == 5  # lo and the veth are excluded by default
    assert not any(dict(l)["netdev"] in ("lo", "veth3a1f9c2") for _, l in samples)
    assert samples[key("llmmon_netdev_receive_bytes_total", "ens1f0np0")] == 8123456789012
    assert samples[key("llmmon_netdev_receive_drops_total", "ens2f0")] == 211
    assert samples[key("llmmon_netdev_receive_missed_total", "ens1f0np0")] == 17
    assert samples[key("llmmon_netdev_speed_bytes_per_second", "ens1f0np0")] == 400000 * 125000
    assert samples[key("llmmon_netdev_carrier_changes_total", "ens1f1np1")] == 7
    assert samples[key("llmmon_netdev_up", "ens1f1np1")] == 0
    assert samples[key("llmmon_netdev_mtu_bytes", "ibp42s0")] == 2044
    # speed -1 (running, no carrier) is unknown: absent.
    assert key("llmmon_netdev_speed_bytes_per_second", "ens1f1np1") not in samples


def test_bad_input(tmp_path: Path, sys_tree: Path) -> None:
    links = json.loads(LINKS.read_text())
    del links[1]["stats64"]                      # ens1f0np0 without IFLA_STATS64
    links.append(dict(links[2], ifname="ens9"))  # only in netlink, not in this sysfs
    dump = tmp_path / "links.json"
    dump.write_text(json.dumps(links))
    (sys_tree / "class/net/ens2f0/carrier_changes").write_text("many\n")
    (sys_tree / "class/net/ens3f0np0/speed").unlink()  # EINVAL while down: absent, no error
    samples, ctx, _ = run(collector(sys_tree, dump))
    assert set(ctx.errors) == {"ens1f0np0", "ens9", "ens2f0/carrier_changes"}
    assert "another network namespace" in ctx.errors["ens9"]
    assert samples[key("llmmon_netdev_up", "ens1f0np0")] == 1
    assert samples[key("llmmon_netdev_up", "ens2f0")] == 1
    assert key("llmmon_netdev_carrier_changes_total", "ens2f0") not in samples
    dump.write_text("{not json")
    samples, ctx, _ = run(collector(sys_tree, dump))
    assert samples == {} and list(ctx.errors) == ["links"]


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace holding a veth pair va/vb, up, with IPv6 off so nothing but the
    test's frames crosses it; deleted afterwards."""
    name = f"llmmon-test-{os.getpid()}"
    commands = [
        ["ip", "netns", "add", name],
        ["ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
         "net.ipv6.conf.default.disable_ipv6=1"],
        ["ip", "-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb"],
        ["ip", "-n", name, "link", "set", "va", "up"],
        ["ip", "-n", name, "link", "set", "vb", "up"],
    ]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True, timeout=30)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)


def values(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_veth_pair_in_a_namespace(netns: str) -> None:
    probe = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, str(ROOT / "tests/network/netns_probe.py")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=pythonpath()))
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout)
    before, after, down = (values(result[k]) for k in ("before", "after", "down"))
    sent = FRAMES * FRAME_BYTES
    delta = {k: after[k] - before[k] for k in before if k[0].endswith("_total")}
    assert delta[key("llmmon_netdev_transmit_bytes_total", "va")] == sent
    assert delta[key("llmmon_netdev_receive_bytes_total", "vb")] == sent
    assert delta[key("llmmon_netdev_transmit_packets_total", "va")] == FRAMES
    assert delta[key("llmmon_netdev_receive_packets_total", "vb")] == FRAMES
    assert delta[key("llmmon_netdev_receive_bytes_total", "va")] == 0
    assert after[key("llmmon_netdev_up", "va")] == 1
    assert after[key("llmmon_netdev_speed_bytes_per_second", "va")] == 10000 * 125000
    # vb down: va loses its carrier, one more carrier change, no longer up.
    assert down[key("llmmon_netdev_up", "va")] == 0
    assert down[key("llmmon_netdev_carrier_changes_total", "va")] == \
        after[key("llmmon_netdev_carrier_changes_total", "va")] + 1
    # The veth's real `ethtool -S` through the ioctl backend, and through the nic collector.
    ethtool = dict(result["ethtool"])
    assert ethtool["peer_ifindex"] == result["vb_ifindex"]
    assert "rx_queue_0_xdp_packets" in ethtool
    assert after[("llmmon_nic_driver_stat", (("netdev", "va"), ("stat", "peer_ifindex")))] == \
        result["vb_ifindex"]
    assert after[("llmmon_nic_info", (("driver", ""), ("mapping", "mlx5_core"),
                                      ("netdev", "va")))] == 1
