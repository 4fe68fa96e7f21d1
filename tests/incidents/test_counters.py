"""What an incident says of the node: counter deltas over the stall against the span before it,
gauges as means, and the kernel log since the stall, from a saved log."""

from __future__ import annotations

import time
from pathlib import Path

from llmmon.incidents.capture import CounterRing, gpus, kernel_log, network

PORT = (("device", "mlx5_0"), ("port", "1"))
GPU0 = (("gpu", "0"), ("uuid", "GPU-a"))


def _ring(start: float) -> CounterRing:
    """Two minutes at 10 s: retransmits climb during the last minute (with a counter reset),
    power drops from 700 to 100 W, XID 79 once."""
    ring = CounterRing(span=420.0, every=5.0)
    retransmits = 0.0
    for i in range(13):
        at = start + 10 * i
        stalled = at > start + 60
        retransmits = 5.0 if i == 9 else retransmits + (50.0 if stalled else 1.0)
        ring.offer(at, [
            {"llmmon_rdma_roce_adp_retransmits_total": {PORT: retransmits},
             "llmmon_rdma_port_info": {PORT: 1.0}},
            {"llmmon_gpu_power_watts": {GPU0: 100.0 if stalled else 700.0},
             "llmmon_gpu_xid_errors_total": {GPU0 + (("xid", "79"),): 1.0 if stalled else 0.0},
             "llmmon_gpu_process_info": {GPU0: 1.0},
             "llmmon_disk_read_bytes_total": {(("device", "sda"),): 1.0}}])
        ring.offer(at + 1, [{"llmmon_gpu_power_watts": {GPU0: 0.0}}])  # within `every`: dropped
    return ring


def test_the_stall_is_compared_with_as_long_a_span_before_it() -> None:
    start = 1_800_000_000.0
    ring = _ring(start)
    doc = network(ring, start + 60, start + 120)
    assert doc["spans"] == {"before": [start, start + 60], "during": [start + 60, start + 120]}
    [port] = doc["ports"]
    assert (port["kind"], port["device"], port["port"]) == ("rdma", "mlx5_0", "1")
    counter = port["counters"]["llmmon_rdma_roce_adp_retransmits_total"]
    # before: 6 steps of 1 (and the first step into the stall at its edge); during: the reset
    # counts its new value, as rate() does
    assert counter["before"] == 6.0
    assert counter["during"] == 50 + 50 + 5 + 50 + 50 + 50 - 50 + 50  # 8 steps, one a reset
    assert "llmmon_rdma_port_info" not in str(doc)

    gpu = gpus(ring, start + 60, start + 120)
    [card] = gpu["gpus"]
    assert card["values"]["llmmon_gpu_power_watts"] == {
        "before": 700.0, "during": round((6 * 100.0 + 700.0) / 7, 6)}  # the edge's sample too
    assert card["xids"] == [{"xid": "79", "count": 1.0}]
    assert not [k for k in card["values"] if "process" in k]
    assert "llmmon_disk" not in str(gpu)


def test_the_ring_forgets_beyond_its_span_and_says_what_it_covered() -> None:
    start = 1_800_000_000.0
    ring = CounterRing(span=60.0, every=5.0)
    for i in range(30):
        ring.offer(start + 10 * i, [{"llmmon_netdev_receive_drops_total":
                                     {(("netdev", "eth0"),): float(i)}}])
    doc = network(ring, start + 250, start + 290)  # 40 s of stall, 60 s kept
    assert doc["spans"]["before"] == [start + 230, start + 250]  # cut to what the ring holds
    [port] = doc["ports"]
    assert port["netdev"] == "eth0" and port["kind"] == "netdev"
    assert port["counters"]["llmmon_netdev_receive_drops_total"]["during"] == 4.0


def test_the_kernel_log_from_the_stall_on_and_a_clear_reason_when_it_cannot_be_read(
        tmp_path: Path) -> None:
    saved = tmp_path / "kmsg"
    now_boot = time.monotonic()
    saved.write_text(f"6,1,{int((now_boot - 600) * 1e6)},-;old news\n"
                     f"4,2,{int((now_boot - 20) * 1e6)},-;NVRM: Xid 79\n"
                     "  continuation line\n"
                     f"3,3,{int((now_boot - 1) * 1e6)},-;mlx5_core: <script>link down\n")
    now = time.time()
    text, problem = kernel_log(str(saved), now - 30, now)
    assert problem is None
    assert text.splitlines()[0].endswith("] NVRM: Xid 79")
    assert len(text.splitlines()) == 2 and "old news" not in text
    text, problem = kernel_log(str(tmp_path / "absent"), now - 30, now)
    assert text == "" and "kernel log" in problem and "absent" in problem


def test_a_ring_younger_than_the_stall_has_no_span_before_it() -> None:
    start = 1_800_000_000.0
    ring = CounterRing(span=420.0, every=5.0)
    for i in range(4):  # the daemon started 30 s ago; the job has been stalled for 100 s
        ring.offer(start + 70 + 10 * i, [{"llmmon_netdev_receive_drops_total":
                                          {(("netdev", "eth0"),): float(i)}}])
    doc = network(ring, start, start + 100)
    assert doc["spans"] == {"before": [start, start], "during": [start, start + 100]}
    counter = doc["ports"][0]["counters"]["llmmon_netdev_receive_drops_total"]
    assert counter == {"before": None, "during": 3.0}
