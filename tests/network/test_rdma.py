"""The rdma collector over sysfs trees modelled on ConnectX-7 RoCE and InfiniBand NDR ports,
an Intel E810 (irdma) and a Broadcom bnxt_re device, plus every bad-input case."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from llmmon.collector import Context
from llmmon.collectors.rdma import RdmaCollector
from llmmon.exposition import render
from tests.conftest import FIXTURES, compare_golden
from tests.core.helpers import make_collector, run

PORT = "class/infiniband/{}/ports/1"


def port(name: str, device: str) -> tuple[str, tuple]:
    return (name, (("device", device), ("port", "1")))


def collector(sysfs: Path, **options: object) -> RdmaCollector:
    return make_collector(RdmaCollector, FIXTURES / "proc", sysfs, **options)


def test_golden_exposition() -> None:
    text = render(collector(FIXTURES / "sys").collect(Context()))[0].decode()
    compare_golden("rdma.prom", text)


def test_units_state_and_identity() -> None:
    samples, ctx, _ = run(collector(FIXTURES / "sys"))
    assert ctx.error_count == 0
    assert ctx.watched == 5
    # port_xmit_data / port_rcv_data count 4-byte words, whatever the link width.
    assert samples[port("llmmon_rdma_transmit_bytes_total", "mlx5_0")] == 2880761508848 * 4
    assert samples[port("llmmon_rdma_receive_bytes_total", "mlx5_2")] == 18527668 * 4
    assert samples[port("llmmon_rdma_port_rate_bytes_per_second", "mlx5_0")] == 50e9
    assert samples[port("llmmon_rdma_port_rate_bytes_per_second", "mlx5_1")] == 1.25e9
    assert samples[port("llmmon_rdma_port_state", "mlx5_1")] == 1
    assert samples[port("llmmon_rdma_port_physical_state", "mlx5_1")] == 3
    assert samples[port("llmmon_rdma_port_up", "mlx5_0")] == 1
    assert samples[port("llmmon_rdma_port_up", "mlx5_1")] == 0
    assert samples[port("llmmon_rdma_hw_counters_lifespan_seconds", "mlx5_0")] == 0.01
    # Saturated IB PMA counters are exported raw.
    assert samples[port("llmmon_rdma_transmit_wait_ticks_total", "mlx5_2")] == 2**32 - 1
    # InfiniBand link-level counters are not read on a RoCE (link_layer Ethernet) port,
    # though its sysfs has them; the PHY's own errors still are.
    roce = FIXTURES / "sys/class/infiniband/mlx5_0/ports/1"
    assert (roce / "link_layer").read_text().strip() == "Ethernet"
    assert (roce / "counters/port_xmit_wait").exists()
    assert port("llmmon_rdma_transmit_wait_ticks_total", "mlx5_0") not in samples
    assert port("llmmon_rdma_vl15_dropped_total", "mlx5_0") not in samples
    assert port("llmmon_rdma_symbol_errors_total", "mlx5_0") in samples
    assert samples[port("llmmon_rdma_symbol_errors_total", "mlx5_2")] == 2**16 - 1
    assert samples[port("llmmon_rdma_link_downed_total", "mlx5_2")] == 3
    # Retransmission and congestion hw_counters.
    assert samples[port("llmmon_rdma_out_of_sequence_total", "mlx5_0")] == 1876
    assert samples[port("llmmon_rdma_roce_adp_retransmits_total", "mlx5_0")] == 99
    assert samples[port("llmmon_rdma_implied_nak_seq_errors_total", "mlx5_0")] == 12
    assert samples[port("llmmon_rdma_cnp_handled_total", "mlx5_0")] == 771204
    assert samples[("llmmon_rdma_cqe_errors_total",
                    (("device", "mlx5_0"), ("kind", "flush"), ("port", "1"),
                     ("side", "responder")))] == 4708
    infos = {dict(labels)["device"]: dict(labels)
             for name, labels in samples if name == "llmmon_rdma_port_info"}
    assert infos["mlx5_0"] == {
        "device": "mlx5_0", "port": "1", "netdev": "ens1f0np0", "link_layer": "Ethernet",
        "pci_bus_id": "0000:17:00.0", "numa_node": "0", "hca_type": "MT4129",
        "firmware_version": "28.39.1002", "board_id": "MT_0000000838"}
    # InfiniBand: no GID netdev, the IPoIB interface of the PCI function instead.
    assert infos["mlx5_2"]["netdev"] == "ibp42s0"
    assert infos["mlx5_2"]["link_layer"] == "InfiniBand"
    # irdma has neither board_id nor hca_type: empty labels, no error.
    assert infos["irdma0"]["board_id"] == infos["irdma0"]["hca_type"] == ""
    assert infos["irdma0"]["numa_node"] == "1"


def test_counters_a_card_lacks_are_absent_not_zero() -> None:
    samples, _, _ = run(collector(FIXTURES / "sys"))
    for name in ("llmmon_rdma_out_of_sequence_total", "llmmon_rdma_icrc_errors_total",
                 "llmmon_rdma_transport_retries_exceeded_total"):
        assert port(name, "mlx5_0") in samples
        assert port(name, "mlx5_1") not in samples  # older capability set
    # InfiniBand ports have no RoCE congestion counters.
    assert port("llmmon_rdma_cnp_sent_total", "mlx5_2") not in samples
    # `N/A (no PMA)` (irdma) is absent, not zero, and not an error.
    assert port("llmmon_rdma_transmit_bytes_total", "irdma0") not in samples
    # bnxt_re has no counters/ directory at all; its state is still exported.
    assert port("llmmon_rdma_transmit_bytes_total", "bnxt_re0") not in samples
    assert samples[port("llmmon_rdma_port_up", "bnxt_re0")] == 1


def test_extra_hw_counters_are_opt_in() -> None:
    samples, _, _ = run(collector(FIXTURES / "sys"))
    assert not any(name == "llmmon_rdma_hw_counter_total" for name, _ in samples)
    samples, ctx, _ = run(collector(FIXTURES / "sys", extra_hw_counters="^(to_retransmits|"
                                                                         "roce_slow_restart)$"))
    extra = {(dict(l)["device"], dict(l)["counter"])
             for n, l in samples if n == "llmmon_rdma_hw_counter_total"}
    assert ctx.error_count == 0
    assert extra == {("bnxt_re0", "to_retransmits"),
                                  ("mlx5_0", "roce_slow_restart"),
                                  ("mlx5_1", "roce_slow_restart")}
    everything, _, _ = run(collector(FIXTURES / "sys", extra_hw_counters=".*"))
    names = {dict(l)["counter"] for n, l in everything if n == "llmmon_rdma_hw_counter_total"}
    assert {"rx_write_requests", "tcpRetransSegs", "dup_req"} <= names
    # Mapped counters and lifespan never show up twice under the catch-all.
    assert not names & {"out_of_sequence", "lifespan", "np_cnp_sent"}


def test_32_bit_counter_wrap_is_exported_raw(sys_tree: Path) -> None:
    c = collector(sys_tree)
    path = sys_tree / PORT.format("mlx5_0") / "hw_counters" / "out_of_sequence"
    path.write_text("4294967290\n")
    first, _, _ = run(c)
    path.write_text("7\n")
    second, _, _ = run(c)
    key = port("llmmon_rdma_out_of_sequence_total", "mlx5_0")
    assert (first[key], second[key]) == (4294967290, 7)  # rate() treats it as a reset


def test_bad_files_cost_only_their_own_series(sys_tree: Path) -> None:
    mlx5_0 = sys_tree / PORT.format("mlx5_0")
    (mlx5_0 / "counters" / "port_xmit_data").write_text("garbage\n")
    (mlx5_0 / "hw_counters" / "out_of_sequence").unlink()
    (mlx5_0 / "hw_counters" / "out_of_sequence").mkdir()  # unreadable even for root
    (mlx5_0 / "rate").write_text("fast\n")
    (sys_tree / PORT.format("mlx5_2") / "state").write_text("ACTIVE\n")
    (sys_tree / PORT.format("mlx5_2") / "link_layer").write_text("Omni-Path\n")
    samples, ctx, _ = run(collector(sys_tree))
    assert set(ctx.errors) == {
        "mlx5_0/ports/1/counters/port_xmit_data", "mlx5_0/ports/1/hw_counters/out_of_sequence",
        "mlx5_0/ports/1/rate", "mlx5_2/ports/1/state"}
    assert "not a counter: 'garbage'" in ctx.errors["mlx5_0/ports/1/counters/port_xmit_data"]
    assert "Is a directory" in ctx.errors["mlx5_0/ports/1/hw_counters/out_of_sequence"]
    assert port("llmmon_rdma_transmit_bytes_total", "mlx5_0") not in samples
    assert port("llmmon_rdma_port_rate_bytes_per_second", "mlx5_0") not in samples
    assert samples[port("llmmon_rdma_receive_bytes_total", "mlx5_0")] == 4631917093162 * 4
    # Without a parsable state the port's "up" is unknown, not 0.
    assert port("llmmon_rdma_port_up", "mlx5_2") not in samples
    assert samples[port("llmmon_rdma_port_physical_state", "mlx5_2")] == 5
    # An unknown link layer is exported as the kernel says it.
    infos = {dict(l)["device"]: dict(l) for n, l in samples if n == "llmmon_rdma_port_info"}
    assert infos["mlx5_2"]["link_layer"] == "Omni-Path"
    assert ctx.watched == 5


def test_vanished_device_does_not_blank_the_others(sys_tree: Path) -> None:
    link = sys_tree / "class/infiniband/mlx5_1"
    shutil.rmtree(link.resolve())  # the device left between listing and reading
    samples, ctx, _ = run(collector(sys_tree))
    assert list(ctx.errors) == ["mlx5_1"]
    assert "vanished" in ctx.errors["mlx5_1"]
    devices = {dict(l)["device"] for n, l in samples if n == "llmmon_rdma_port_up"}
    assert devices == {"mlx5_0", "mlx5_2", "irdma0", "bnxt_re0"}
    assert ctx.watched == 4


def test_excluded_devices_are_never_read(sys_tree: Path) -> None:
    # A restricted PF whose counter reads hang: the collector must not even open them.
    counters = sys_tree / PORT.format("mlx5_2") / "counters"
    (counters / "port_xmit_data").unlink()
    os.mkfifo(counters / "port_xmit_data")
    c = collector(sys_tree, device_exclude="^mlx5_2$")
    done: list = []
    worker = threading.Thread(target=lambda: done.append(run(c)), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the reader so the test process can end
        with open(counters / "port_xmit_data", "w"):
            pass
        pytest.fail("the excluded device's counters were read")
    samples, ctx, _ = done[0]
    assert ctx.error_count == 0
    assert not any(dict(l).get("device") == "mlx5_2" for _, l in samples)
    included, _, _ = run(collector(sys_tree, device_include="^mlx5_0$"))
    assert {dict(l)["device"] for _, l in included} == {"mlx5_0"}


def test_node_without_rdma_is_nothing_to_watch(tmp_path: Path) -> None:
    samples, ctx, _ = run(collector(tmp_path))
    assert samples == {}
    assert ctx.error_count == 0
    assert ctx.watched == 0


def test_pcie_link_of_each_rdma_device() -> None:
    """mlx5_2 trained down to Gen4 x8 in a Gen5 x16 slot; irdma0's link is down (Unknown
    speed: no generation series); bnxt_re0's function has no link files (absent, no error)."""
    samples, ctx, _ = run(collector(FIXTURES / "sys"))
    assert ctx.error_count == 0
    link = {(name.removeprefix("llmmon_rdma_device_pcie_link_"), dict(labels)["device"]): value
            for (name, labels), value in samples.items()
            if name.startswith("llmmon_rdma_device_pcie_link_")}
    assert link == {
        **{(kind, device): value for device in ("mlx5_0", "mlx5_1")
           for kind, value in (("generation", 5), ("max_generation", 5), ("width", 16),
                               ("max_width", 16))},
        ("generation", "mlx5_2"): 4, ("max_generation", "mlx5_2"): 5,
        ("width", "mlx5_2"): 8, ("max_width", "mlx5_2"): 16,
        ("max_generation", "irdma0"): 4, ("width", "irdma0"): 0, ("max_width", "irdma0"): 16}


def test_an_unparsable_link_width_costs_only_that_device(sys_tree: Path) -> None:
    (sys_tree / "devices/pci0000:28/0000:28:01.0/0000:2a:00.0/current_link_width").write_text("x16\n")
    samples, ctx, _ = run(collector(sys_tree))
    assert list(ctx.errors) == ["mlx5_2/pcie_link"]
    assert samples[("llmmon_rdma_device_pcie_link_width", (("device", "mlx5_0"),))] == 16
    assert samples[port("llmmon_rdma_port_up", "mlx5_2")] == 1
