"""The network collectors inside a real `llmmon serve`, configured by their generated flags,
scraped over HTTP and linted by promtool."""

from __future__ import annotations

import subprocess

import requests

from tests.conftest import FIXTURES


def test_served_exposition_passes_promtool(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(
        "--collector.disable-defaults", "--collector.rdma", "--collector.nic",
        "--collector.netdev", "--collector.topology", "--collector.nfs",
        f"--path.sysfs={FIXTURES / 'sys'}", f"--path.procfs={FIXTURES / 'proc'}",
        f"--ethtool.dumps={FIXTURES / 'ethtool'}",
        f"--netlink.dump={FIXTURES / 'netlink' / 'links.json'}",
        "--collector.topology.nvml=false", "--collector.rdma.device-exclude=^bnxt")
    states = {s["name"]: s for s in server.wait_collected()}
    assert {name: s["status"] for name, s in states.items()} == {
        "rdma": "ok", "nic": "ok", "netdev": "ok", "nfs": "ok",
        "topology": "empty"}  # NICs but no GPUs in this tree: nothing to watch, no failure
    assert states["rdma"]["watched"] == 4  # bnxt_re0 excluded by its flag
    body = requests.get(server.url + "/metrics", timeout=5).text
    for name in ("llmmon_rdma_port_up", "llmmon_nic_pfc_pause_frames_total",
                 "llmmon_netdev_carrier_changes_total", "llmmon_nfs_operations_total"):
        assert f"\n{name}{{" in body
    assert 'device="bnxt_re0"' not in body
    lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr
