"""An incident from the daemon's own collectors: the real 4-rank NCCL capture (rank 3 never
enqueues, its peers wait in an all-gather) judged by the ranks collector, on a simulated H200
node one of whose NICs is choked by a PFC storm from the moment the job stalled. The incident compares the stall with as long a span before it, from the same series
the collectors export. Simulated time, driven tick by tick: no test waits for the clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.collectors.incidents import IncidentsCollector
from llmmon.config import build_settings
from llmmon.incidents import capture, layout
from llmmon.serve.assembly import build
from llmmon.simulate.cluster import Cluster, ClusterConfig
from llmmon.simulate.control import parse
from llmmon.sources import nvml_replay
from tests.ranks.jobs import make_collector, scrape
from tests.ranks.test_nccl_dumps import staged
from tests.simulate.conftest import work  # noqa: F401 (the fixture)

STEP = 5.0  # seconds between two reads: the incidents ring's own cadence
STORMS = 'llmmon_nic_pause_storm_events_total{severity="error"}'


def test_a_hang_under_a_pfc_storm_keeps_the_stall_against_the_span_before(
        tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(nvml_replay, "RELOAD_CHECK_S", 0.0)  # each tick's files, read at once
    spool, written = staged(tmp_path, "nccl4")
    ranks = make_collector(spool, tmp_path, stale_after="1h")
    scrape(ranks, written)
    declared = written + 90
    scrape(ranks, declared)
    [job] = ranks.latest().jobs
    onset = capture.onset(job, declared)
    assert capture.trigger(job) == "stalled" and declared - onset > 30

    cluster = Cluster(work, ClusterConfig())
    node = cluster.nodes[0]
    first = onset - 2 * (declared - onset)
    cluster.set_scenarios([parse("healthy")], first)
    cluster.tick(first)  # the node's trees exist before its daemon reads them
    args = build_parser().parse_args(["serve", *node.paths.serve_args(),
                                      "--collector.disable-defaults", "--collector.gpu",
                                      "--collector.rdma", "--collector.nic",
                                      "--collector.netdev", "--collector.incidents"])
    daemon = build(build_settings(args, discover()))
    [incidents] = [c for c in daemon.collectors if isinstance(c, IncidentsCollector)]
    incidents.attach(ranks.latest, str(tmp_path / "fr"), str(tmp_path / "pipe"),
                     daemon.sampler.digests)
    recorder = incidents.recorder
    assert recorder is not None
    try:
        now, stormed = first, False
        while now <= declared:
            if now >= onset and not stormed:
                cluster.set_scenarios([parse("hang"), parse("pfc-storm")], now)
                stormed = True
            cluster.tick(now)
            for collector in daemon.collectors:
                if collector is not incidents:
                    daemon.sampler.run_once(collector)
            recorder.ring.offer(now, daemon.sampler.digests())
            now += STEP
        recorder.clock = lambda: declared
        assert recorder.observe(ranks.latest()) == ["llama-8b"]
        assert recorder.wait(30)
    finally:
        for collector in daemon.collectors:
            collector.close()

    [incident] = [p for p in (node.paths.root / "incidents").iterdir()
                  if layout.ID.match(p.name)]
    summary = json.loads((incident / "summary.json").read_text())
    assert summary["trigger"] == "stalled" and summary["culprit"]["ranks"] == [3]
    assert (summary["onset"], summary["declared"]) == (round(onset, 3), round(declared, 3))

    gpus = json.loads((incident / "gpus.json").read_text())
    stall = declared - onset
    assert gpus["spans"] == {"before": [onset - stall, onset], "during": [onset, declared]}
    assert len(gpus["gpus"]) == 8
    for gpu in gpus["gpus"]:  # each card's series over both spans (gauges as means)
        assert gpu["uuid"].startswith("GPU-") and gpu["xids"] == []
        for name in ("llmmon_gpu_power_watts", 'llmmon_gpu_clock_hertz{clock="sm"}',
                     'llmmon_gpu_clock_event_active{reason="sw_power_cap"}'):
            assert None not in gpu["values"][name].values(), (name, gpu["values"][name])

    ports = json.loads((incident / "network.json").read_text())["ports"]
    storms = {p["netdev"]: p["counters"][STORMS] for p in ports if p["kind"] == "nic"}
    assert [name for name, pair in storms.items() if pair["during"]] == ["enp60s0np0"], storms
    assert storms["enp60s0np0"]["before"] == 0  # the minute before it was calm
    lost = {p["device"]: p["counters"]["llmmon_rdma_out_of_sequence_total"] for p in ports
            if p["kind"] == "rdma"}
    assert [d for d, pair in lost.items() if pair["during"] > 10 * pair["before"]] == \
        ["mlx5_2"], lost  # the storm's port (port=2), and no other
