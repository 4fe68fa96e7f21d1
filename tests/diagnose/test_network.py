"""Network checklist: RDMA vs TCP traffic, GPU-NIC affinity and GPUDirect on the topology
fixtures, PFC pauses and storms from ethtool dumps, late ranks, bus bandwidth from timed
Flight Recorder entries."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.diagnose.node import check, edit_json, subjects, texts

GIB = 1 << 30


def test_misconfigured_topology(node) -> None:
    report = node(sysfs=FIXTURES / "topology" / "misconfigured" / "sys").start().report()
    affinity = check(report, "network.gpu_nic_affinity")
    assert affinity["verdict"] == "suspect"
    assert subjects(affinity, "gpu") == {str(gpu) for gpu in range(8)}
    assert {e["text"].split(" is ")[1].split(",")[0] for e in affinity["evidence"]} == \
        {"NODE", "SYS"}
    assert affinity["runbook"].endswith("/docs/diagnose.md#gpu-nic-affinity")
    assert check(report, "network.gpudirect")["verdict"] == "suspect"


def test_misconfigured_topology_with_dmabuf_has_gpudirect(node) -> None:
    """No nvidia_peermem, but Linux 6.8 and the open GPU kernel module: NCCL uses DMA-BUF."""
    built = node(sysfs=FIXTURES / "topology" / "misconfigured" / "sys")
    dmabuf = FIXTURES / "topology" / "dmabuf" / "proc"
    for name in ("sys/kernel/osrelease", "driver/nvidia/version"):
        (built.proc / name).parent.mkdir(parents=True, exist_ok=True)
        (built.proc / name).write_text((dmabuf / name).read_text())
    gpudirect = check(built.start().report(), "network.gpudirect")
    assert gpudirect["verdict"] == "ok" and "DMA-BUF" in gpudirect["summary"]


def test_hgx_topology(node) -> None:
    report = node(sysfs=FIXTURES / "topology" / "hgx" / "sys").start().report()
    affinity = check(report, "network.gpu_nic_affinity")
    assert affinity["verdict"] == "ok" and "PIX 8" in affinity["summary"]
    assert check(report, "network.gpudirect")["verdict"] == "ok"


def _send_over_tcp(links: Path) -> None:
    def grow(doc: list) -> None:
        link = next(link for link in doc if link["ifname"] == "ens2f0")
        link["stats64"]["tx"]["bytes"] += 2 * GIB
    edit_json(links, grow)


def test_tcp_fallback_of_a_multi_node_job(node) -> None:
    job = node()
    job.edit_ranks(lambda doc, rank: doc["identity"].update(world_size=8))
    job.start()
    report = job.report(lambda: _send_over_tcp(job.links))
    found = check(report, "network.rdma_in_use")
    assert found["verdict"] == "suspect"
    assert "multi-node job(s) llama-8b" in texts(found)
    values = found["evidence"][0]["values"]
    assert values["rdma_bytes_per_second"] == 0 and values["tcp_bytes_per_second"] > 10e6


def test_tcp_traffic_without_a_multi_node_job_is_ok(node) -> None:
    local = node().start()
    found = check(local.report(lambda: _send_over_tcp(local.links)), "network.rdma_in_use")
    assert found["verdict"] == "ok"


def _pause_storm(dumps: Path) -> None:
    path = dumps / "ens1f0np0"
    text = path.read_text()
    text = text.replace("tx_prio3_pause_duration: 9000", "tx_prio3_pause_duration: 60009000")
    text = text.replace("tx_pause_storm_error_events: 0", "tx_pause_storm_error_events: 1")
    path.write_text(text)


def test_pause_storm(node) -> None:
    fabric = node().start()
    found = check(fabric.report(lambda: _pause_storm(fabric.ethtool)), "network.pfc_ecn")
    assert found["verdict"] == "suspect"
    assert "ens1f0np0 priority 3 paused (tx)" in texts(found)
    assert "ens1f0np0: 1 pause-storm error events" in texts(found)
    assert found["alerts"] == ["RDMAPFCStorm", "RDMACongestion"]
    assert found["runbook"].endswith("#rdmapfcstorm")


def _timed_allreduces(doc: dict, rank: int) -> None:
    """Ten more 1 GiB bf16 all-reduces in group 0, as a timed NCCL job records them; rank 3
    arrives late and so waits least."""
    entries = doc["dump"]["entries"]
    template = next(e for e in entries if e["profiling_name"] == "nccl:all_reduce"
                    and e["pg_id"] == 0)
    top = max(e["record_id"] for e in entries)
    for n in range(1, 11):
        entry = copy.deepcopy(template)
        entry.update(record_id=top + n, input_sizes=[[GIB // 2]], output_sizes=[[GIB // 2]],
                     retired=True, duration_ms=5.0 if rank == 3 else 20.0)
        entries.append(entry)


def test_bus_bandwidth_and_late_rank_from_timings(node) -> None:
    job = node().start()
    report = job.report(lambda: job.edit_ranks(_timed_allreduces, "entries"))

    found = check(report, "network.busbw")
    assert found["verdict"] == "suspect"
    group0 = next(e for e in found["evidence"] if e["subject"]["pg"] == "0")
    values = group0["values"]
    # bus bytes 1 GiB x 2(n-1)/n = 1.5 GiB per all-reduce; 20 ms on ranks 0-2, 5 ms on rank 3
    assert abs(values["busbw_bytes_per_second"] - 4 * 1.5 * GIB / 0.065) < 1e3
    assert values["mean_message_bytes"] == GIB
    assert values["reference_low"] == 380e9 and "NVLink" in group0["text"]

    late = check(report, "network.straggler")
    scores = [e for e in late["evidence"] if "straggler_score" in e["values"]]
    # a ratio of rates Prometheus computed: equal to the last bit only most of the time
    assert [(e["subject"]["rank"], e["values"]["straggler_score"]) for e in scores] == \
        [("3", pytest.approx(0.75))]


def test_reference_needs_large_messages(node) -> None:
    job = node().start()

    def small(doc: dict, rank: int) -> None:
        _timed_allreduces(doc, rank)
        for entry in doc["dump"]["entries"][-10:]:
            entry.update(input_sizes=[[1 << 20]], output_sizes=[[1 << 20]])

    found = check(job.report(lambda: job.edit_ranks(small, "entries")), "network.busbw")
    assert found["verdict"] == "unknown"
    assert "(no reference: messages under 134 MB)" in texts(found)
    assert json.dumps(found)  # evidence stays JSON
