"""What the NCCL checklist costs a node: one nccl collector run, cold and steady, and the parse.

    PYTHONPATH=exporter:reporter python bench/nccl_cost.py [--runs N] [--write-result]

On the simulated budget node of a job over two nodes (8 GPUs, 8 RoCE rails with 16-entry GID
tables, 8 ranks each with its environment and an NCCL 2.21 log), read by the daemon's own
collectors: the ranks and topology collectors run first, then the nccl collector's run (collect
and render) is timed cold (every rank's environment and log read and parsed, the node's ports,
GID tables and interfaces read) and steady (the logs unchanged, the node's facts cached, as in
most 15 s runs), --runs times each. The parser alone is timed on the largest real log of the
fixtures and on 1 MiB of real log lines (the collector reads at most that of each log by
default). The series the collector adds are counted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import write_result
from llmmon.cli import build_parser
from llmmon.collector import Context
from llmmon.collectors import discover
from llmmon.collectors.nccl import NcclCollector
from llmmon.config import build_settings
from llmmon.exposition import render
from llmmon.network import nccl_log
from llmmon.serve.assembly import build
from llmmon.simulate.cluster import Cluster, ClusterConfig

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "fixtures" / "nccl" / "logs"
ONLY = ("--no-collector.gpu", "--no-collector.disk", "--no-collector.nic",
        "--no-collector.netdev", "--no-collector.rdma", "--no-collector.incidents")


def timed(run, count: int) -> list[float]:
    out = []
    for _ in range(count):
        start = time.perf_counter()
        run()
        out.append(time.perf_counter() - start)
    return out


def ms(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"{statistics.median(values) * 1e3:.2f} ms median, {p99 * 1e3:.2f} ms p99"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--write-result", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmmon-nccl-bench-") as work:
        cluster = Cluster(Path(work), ClusterConfig(nodes=2))
        now = time.time()
        for second in range(3):
            cluster.tick(now + second)
        node = cluster.nodes[0]
        argv = ["serve", *node.paths.serve_args(), "--collector.topology", *ONLY]
        daemon = build(build_settings(build_parser().parse_args(argv), discover()))
        nccl = next(c for c in daemon.collectors if isinstance(c, NcclCollector))
        for collector in daemon.collectors:
            if collector is not nccl:
                daemon.sampler.run_once(collector)

        def run() -> dict[str, int]:
            families = list(nccl.collect(Context()))
            render(families)
            return {f.name: len(f.samples) for f in families}

        def cold() -> None:
            nccl._ranks.clear()
            nccl._node = None
            run()

        series = run()
        cold_times = timed(cold, args.runs)
        steady_times = timed(run, args.runs)
        for collector in daemon.collectors:
            collector.close()
    biggest = max(LOGS.glob("*.log"), key=lambda p: p.stat().st_size)
    big_text = biggest.read_text(errors="replace")
    real = "".join(p.read_text(errors="replace") for p in sorted(LOGS.glob("*.log")))
    mib = (real * (1 + (1 << 20) // len(real)))[:1 << 20]
    rows = [
        ("the node", "8 GPUs, 8 RoCE rails (16 GID entries each), one job of 16 ranks over 2 "
                     "nodes, 8 here, each with its environment and NCCL log"),
        ("series the nccl collector adds", f"{sum(series.values())} ("
         + ", ".join(f"{name} {count}" for name, count in sorted(series.items())) + ")"),
        ("a run, cold: every environment and log read, ports and GIDs read", ms(cold_times)),
        ("a run, steady: logs unchanged, node facts cached (every 15 s)", ms(steady_times)),
        (f"parse of the largest real log ({biggest.name}, {len(big_text) / 1e3:.1f} kB)",
         ms(timed(lambda: nccl_log.parse(big_text), args.runs))),
        ("parse of 1 MiB of real log lines (the default read limit per rank)",
         ms(timed(lambda: nccl_log.parse(mib), max(args.runs // 10, 5)))),
    ]
    table = "| what | measured |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)
    print(table)
    if args.write_result:
        print(write_result("nccl-cost", __doc__.split("\n\n", 2)[2].strip() + "\n\n"
                           + table + "\n", title="What the NCCL checklist costs a node"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
