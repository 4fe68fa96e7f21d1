"""The nic collector over `ethtool -S` dumps shaped like mlx5 (ConnectX-7, ~700 stats), ice
and bnxt_en, through the real dump parser and the per-driver mapping tables."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from llmmon.network import nic_mappings
from llmmon.collector import Context
from llmmon.collectors.nic import MAPPINGS, Mapping, NicCollector
from llmmon.exposition import render
from llmmon.sources.ethtool import DumpDirectory, parse_dump
from tests.conftest import FIXTURES, compare_golden
from tests.core.helpers import make_collector, run


def collector(dumps: Path, sysfs: Path = FIXTURES / "sys", **options: object) -> NicCollector:
    return make_collector(NicCollector, FIXTURES / "proc", sysfs, dumps=str(dumps), **options)


def key(name: str, **labels: str) -> tuple[str, tuple]:
    return (name, tuple(sorted(labels.items())))


def test_golden_exposition() -> None:
    every = tuple("01234567")  # the golden keeps every priority's series
    text = render(collector(FIXTURES / "ethtool", priorities=every).collect(Context()))[0].decode()
    compare_golden("nic.prom", text)


def test_dump_parser_reads_what_ethtool_prints() -> None:
    stats = DumpDirectory(str(FIXTURES / "ethtool")).read("ens1f0np0")
    assert stats.problems == []
    assert len(stats.values) == 682
    values = dict(stats.values)
    assert values["tx_pause_storm_warning_events"] == 2  # trailing space stripped
    bnxt = dict(DumpDirectory(str(FIXTURES / "ethtool")).read("ens3f0np0").values)
    assert bnxt["[0]: rx_ucast_packets"] == 6535001  # names may contain ': '


def test_pfc_pause_and_storm_mapping() -> None:
    samples, ctx, _ = run(collector(FIXTURES / "ethtool"))
    assert ctx.error_count == 0
    assert ctx.watched == 4
    pfc = "llmmon_nic_pfc_pause_frames_total"
    assert samples[key(pfc, netdev="ens1f0np0", priority="3", direction="rx")] == 1200
    assert samples[key(pfc, netdev="ens1f0np0", priority="3", direction="tx")] == 40
    # Microseconds to seconds.
    assert samples[key("llmmon_nic_pfc_pause_seconds_total", netdev="ens1f0np0",
                       priority="3", direction="rx")] == 0.35
    assert samples[key("llmmon_nic_pause_storm_events_total", netdev="ens1f0np0",
                       severity="warning")] == 2
    assert samples[key("llmmon_nic_pcie_outbound_stalled_ratio", netdev="ens1f0np0",
                       op="write")] == 0.37
    # mlx5 lists pause counters only for priorities with PFC on: absent means off.
    assert key(pfc, netdev="ens1f0np0", priority="0", direction="rx") not in samples
    assert not any(n == pfc and dict(l)["netdev"] == "ens1f1np1" for n, l in samples)
    # ice and bnxt_en, through their own tables.
    assert samples[key(pfc, netdev="ens2f0", priority="3", direction="rx")] == 702
    assert samples[key(pfc, netdev="ens3f0np0", priority="3", direction="rx")] == 512
    assert samples[key("llmmon_nic_pfc_pause_seconds_total", netdev="ens3f0np0",
                       priority="3", direction="rx")] == 0.12
    assert samples[key("llmmon_nic_receive_discards_total", netdev="ens2f0")] == 211
    infos = {dict(l)["netdev"]: dict(l)["mapping"]
             for n, l in samples if n == "llmmon_nic_info"}
    assert infos == {"ens1f0np0": "mlx5_core", "ens1f1np1": "mlx5_core", "ens2f0": "ice",
                     "ens3f0np0": "bnxt_en"}


def test_every_rule_matches_a_real_driver_name() -> None:
    """A rule that matches nothing in its driver's dump is a typo, not a mapping."""
    names = {driver: set() for driver in nic_mappings.TABLES}
    for netdev, driver in (("ens1f0np0", "mlx5_core"), ("ens2f0", "ice"),
                           ("ens3f0np0", "bnxt_en")):
        names[driver] |= {n for n, _ in DumpDirectory(str(FIXTURES / "ethtool")).read(netdev)
                          .values}
    names["mlx5_core"] |= {"rx_global_pause", "tx_global_pause_duration"}  # global pause on
    names["ice"] |= {"port-rx-xoff_prio-3_events"}  # the out-of-tree driver's names
    unmatched = [(driver, rule.pattern) for driver, rules in nic_mappings.TABLES.items()
                 for rule in rules
                 if not any(re.fullmatch(rule.pattern, n) for n in names[driver])]
    assert unmatched == []


def test_mapping_rules_must_name_the_labels_of_their_metric() -> None:
    with pytest.raises(ValueError, match="do not match llmmon_nic_pfc_pause_frames_total"):
        Mapping("broken", (nic_mappings.Rule(r"rx_prio(?P<priority>\d)_pause",
                                             nic_mappings.PFC_FRAMES),))
    assert MAPPINGS["ice"].resolve("port-rx-xoff_prio-5_events")[1] == ("5", "rx")


def test_unknown_driver_uses_the_mlx5_table(dumps: Path, sys_tree: Path) -> None:
    driver = sys_tree / "devices/pci0000:15/0000:15:01.0/0000:17:00.0/driver"
    driver.unlink()
    os.symlink("../../../../bus/pci/drivers/mlx5_core_sf", driver)
    samples, _, _ = run(collector(dumps, sys_tree))
    assert samples[key("llmmon_nic_info", netdev="ens1f0np0", driver="mlx5_core_sf",
                       mapping="mlx5_core")] == 1
    assert samples[key("llmmon_nic_pfc_pause_frames_total", netdev="ens1f0np0", priority="3",
                       direction="rx")] == 1200


def test_allow_list_and_priorities() -> None:
    samples, _, _ = run(collector(FIXTURES / "ethtool"))
    assert not any(n == "llmmon_nic_driver_stat" for n, _ in samples)
    # Per-priority traffic: only the lossless RoCE class by default (the series budget).
    default = {dict(l)["priority"] for n, l in samples if n == "llmmon_nic_priority_bytes_total"}
    assert default == {"3"}
    samples, _, _ = run(collector(FIXTURES / "ethtool", extra_stats="^rx_vport_rdma_",
                                  priorities=("3",)))
    extra = {dict(l)["stat"] for n, l in samples if n == "llmmon_nic_driver_stat"}
    assert "rx_vport_rdma_unicast_bytes" in extra and len(extra) == 4
    prios = {dict(l)["priority"] for n, l in samples if n == "llmmon_nic_priority_bytes_total"}
    assert prios == {"3"}
    pfc = {dict(l)["priority"] for n, l in samples if n == "llmmon_nic_pfc_pause_frames_total"}
    assert pfc == {str(p) for p in range(8)}  # pause counters ignore the option


def test_bad_dumps_lose_only_their_lines(dumps: Path) -> None:
    good = (dumps / "ens1f0np0").read_text()
    (dumps / "ens1f0np0").write_text(
        good + "     rx_prio3_pause: 5\n"        # listed twice: first kept
        + "     garbage line\n"
        + "     tx_prio3_pause: lots\n")
    (dumps / "ens2f0").unlink()
    (dumps / "ens2f0").mkdir()                    # unreadable
    samples, ctx, _ = run(collector(dumps))
    assert ctx.error_count == 4
    assert set(ctx.errors) == {"ens1f0np0:dump", "ens1f0np0:rx_prio3_pause", "ens2f0"}
    assert samples[key("llmmon_nic_pfc_pause_frames_total", netdev="ens1f0np0",
                       priority="3", direction="rx")] == 1200
    assert samples[key("llmmon_nic_pfc_pause_frames_total", netdev="ens1f0np0",
                       priority="3", direction="tx")] == 40
    assert ctx.watched == 3
    assert parse_dump("NIC statistics:\n     a: 1\n  : 2\nb 3\n", "x").problems == [
        "x:3: not 'name: value': ': 2'", "x:4: not 'name: value': 'b 3'"]


def test_missing_dump_directory_is_an_error(tmp_path: Path) -> None:
    samples, ctx, _ = run(collector(tmp_path / "nowhere"))
    assert samples == {}
    assert list(ctx.errors) == ["interfaces"]


def test_excluded_interfaces_are_never_read(dumps: Path) -> None:
    (dumps / "ens2f0").unlink()
    os.mkfifo(dumps / "ens2f0")  # a read would block forever
    c = collector(dumps, device_exclude="^ens2")
    done: list = []
    worker = threading.Thread(target=lambda: done.append(run(c)), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():
        with open(dumps / "ens2f0", "w"):
            pass
        pytest.fail("an excluded interface was read")
    samples, ctx, _ = done[0]
    assert ctx.error_count == 0
    assert {dict(l)["netdev"] for n, l in samples if n == "llmmon_nic_info"} == {
        "ens1f0np0", "ens1f1np1", "ens3f0np0"}
