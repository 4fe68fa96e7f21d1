"""What keeping incidents costs a node that is not hung, and what one capture costs.

    PYTHONPATH=exporter:reporter python bench/incident_cost.py [--write-result]

The incidents collector keeps the node's GPU and network series for 7 minutes (one snapshot
every 5 s) so that an incident can compare a stall with the span before it. This measures, on
a simulated H200 node (8 GPUs, 8 NICs, the daemon's own collectors reading its trees), the
memory that ring holds when full and the time each snapshot costs; then one capture of the
real 4-rank NCCL capture (tests/fixtures/spool/nccl4, stalled) on that node: the capture
thread's CPU and wall time, and the bytes written. The fault benchmark (bench/faults) measures
the capture on real jobs; this is the part it cannot: a fat node's steady cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from bench.common import write_result
from llmmon.cli import build_parser
from llmmon.collector import Context
from llmmon.collectors import discover
from llmmon.collectors.incidents import IncidentsCollector
from llmmon.collectors.ranks import RanksCollector
from llmmon.config import build_settings
from llmmon.incidents.capture import CounterRing
from llmmon.serve.assembly import build
from llmmon.simulate.cluster import Cluster, ClusterConfig
from llmmon.simulate.control import parse
from llmmon.sources import nvml_replay

ROOT = Path(__file__).resolve().parent.parent
SPOOL = ROOT / "tests" / "fixtures" / "spool" / "nccl4"
STEP = 5.0


def stalled_ranks(work: Path) -> tuple[RanksCollector, float]:
    """The ranks collector on the NCCL capture, 90 s after its last write: stalled."""
    spool = work / "spool"
    shutil.copytree(SPOOL, spool)
    newest = 0
    for path in spool.rglob("*.json"):
        written = json.loads(path.read_text())["written_ns"]
        os.utime(path, ns=(written, written))
        newest = max(newest, written)
    args = build_parser().parse_args(["serve", "--collector.disable-defaults",
                                      "--collector.ranks", f"--spool.dir={spool}",
                                      "--collector.ranks.stale-after=1h",
                                      "--collector.ranks.discover=false",
                                      f"--collector.ranks.fr-dir={work / 'fr'}",
                                      f"--collector.ranks.pipe-dir={work / 'pipe'}"])
    ranks = build(build_settings(args, discover())).collectors[0]
    assert isinstance(ranks, RanksCollector)
    now = newest / 1e9 + 1
    ranks.collect_at(Context(), now)
    ranks.collect_at(Context(), now + 90)
    return ranks, now + 90


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-result", action="store_true")
    args = parser.parse_args()
    nvml_replay.RELOAD_CHECK_S = 0.0  # each simulated tick's files read at once
    work = Path(tempfile.mkdtemp(prefix="llmmon-incident-cost-"))
    try:
        ranks, declared = stalled_ranks(work)
        cluster = Cluster(work / "sim", ClusterConfig())
        node = cluster.nodes[0]
        first = declared - 420
        cluster.set_scenarios([parse("healthy")], first)
        cluster.tick(first)
        daemon = build(build_settings(build_parser().parse_args(
            ["serve", *node.paths.serve_args(), "--collector.disable-defaults",
             "--collector.gpu", "--collector.rdma", "--collector.nic", "--collector.netdev",
             "--collector.incidents"]), discover()))
        [incidents] = [c for c in daemon.collectors if isinstance(c, IncidentsCollector)]
        incidents.attach(ranks.latest, str(work / "fr"), str(work / "pipe"),
                         daemon.sampler.digests)
        recorder = incidents.recorder
        assert recorder is not None
        # the node's 7 minutes, each snapshot's digests kept: offered once to a ring timed
        # as the daemon runs it, once to a ring whose memory tracemalloc counts
        timeline, now = [], first
        while now <= declared:
            cluster.tick(now)
            for collector in daemon.collectors:
                if collector is not incidents:
                    daemon.sampler.run_once(collector)
            timeline.append((now, daemon.sampler.digests()))
            now += STEP
        ring, offers = CounterRing(), []
        for at, digests in timeline:
            started = time.perf_counter()
            ring.offer(at, digests)
            offers.append(time.perf_counter() - started)
        tracemalloc.start()
        counted = CounterRing()
        for at, digests in timeline:
            counted.offer(at, digests)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*incidents/capture.py")])
        ring_bytes = sum(stat.size for stat in snapshot.statistics("filename"))
        tracemalloc.stop()
        del counted
        recorder.ring = ring
        series = ring.width()
        recorder.clock = lambda: declared
        process_cpu = time.process_time()
        assert recorder.observe(ranks.latest()) == ["llama-8b"]
        assert recorder.wait(60)
        process_cpu = time.process_time() - process_cpu
        [summary_path] = list((node.paths.root / "incidents").glob("*/summary.json"))
        summary = json.loads(summary_path.read_text())
        for collector in daemon.collectors:
            collector.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [
        ("GPU and network series kept per snapshot", f"{series}"),
        ("snapshots held (7 min at 5 s)", f"{len(ring)}"),
        ("memory the full ring holds", f"{ring_bytes / 2**20:.2f} MiB"),
        ("one snapshot taken (median / max)",
         f"{statistics.median(offers) * 1e3:.2f} / {max(offers) * 1e3:.2f} ms, every 5 s"),
        ("one capture: its thread's CPU", f"{summary['capture']['cpu_seconds'] * 1e3:.1f} ms"),
        ("one capture: the process's CPU meanwhile", f"{process_cpu * 1e3:.1f} ms"),
        ("one capture: wall time (no dump pipe to wait for)",
         f"{summary['capture']['wall_seconds'] * 1e3:.0f} ms"),
        ("one capture: bytes written", f"{summary['bytes'] / 1e3:.0f} kB "
         f"({', '.join(f'{k} {v / 1e3:.0f} kB' for k, v in sorted(summary['files'].items()))})"),
    ]
    table = "| what | measured |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)
    print(table)
    if args.write_result:
        print(write_result("incident-cost", __doc__.split("\n\n", 2)[2].strip() + "\n\n"
                           + table + "\n", title="What keeping incidents costs a node"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
