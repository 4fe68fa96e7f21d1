"""Scrape latency and memory of `llmmon serve` against node_exporter, on the same procfs tree.

Both exporters read the same diskstats (the test fixture tree, or a synthetic one with
--devices N).  node_exporter runs only its diskstats collector; llmmon only its disk collector.
Each gets --count scrapes on one keep-alive connection, plain text and as Prometheus asks
(OpenMetrics, gzip).  Prints a table and writes JSON to bench/results/scrape.json;
`--write-result` also writes the table as the dated result docs/benchmarks/<date>-scrape.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import free_port, rss_mib, scrape_times, stop, wait_http, write_result

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
              "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


def procfs_tree(devices: int, workdir: Path) -> Path:
    tree = workdir / "proc"
    shutil.copytree(ROOT / "tests" / "fixtures" / "proc", tree,
                    ignore=shutil.ignore_patterns("[0-9]*", "self"))
    if devices:
        lines = [f" 259 {i} nvme{i}n1 {1000 + i} 4 {46000 + i} 21650 1235 10 95932 1112 3 21952 "
                 "22767 3611 0 1572864 40 188 120" for i in range(devices)]
        (tree / "diskstats").write_text("\n".join(lines) + "\n")
    return tree


def measure(name: str, command: list[str], port: int, count: int) -> dict:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(port, "/metrics")
        time.sleep(1.0)  # let the first collection finish
        scrape_times(port, "/metrics", 50, {})  # warm up
        plain = scrape_times(port, "/metrics", count, {})
        prometheus = scrape_times(port, "/metrics", count, PROMETHEUS_HEADERS)
        rss, peak = rss_mib(proc.pid)
    finally:
        stop(proc)
    return {"exporter": name, "plain": plain.__dict__, "prometheus": prometheus.__dict__,
            "rss_mib": round(rss, 1), "peak_rss_mib": round(peak, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=0,
                        help="synthetic disks instead of the fixture tree's diskstats")
    parser.add_argument("--write-result", action="store_true",
                        help="write the dated result docs/benchmarks/<date>-scrape.md")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = procfs_tree(args.devices, Path(tmp))
        port = free_port()
        results.append(measure("llmmon", [
            sys.executable, "-m", "llmmon", "serve", f"--web.listen-address=127.0.0.1:{port}",
            "--collector.disable-defaults", "--collector.disk", f"--path.procfs={tree}",
            "--log.level=warning"], port, args.count))
        node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
        if node_exporter:
            port = free_port()
            results.append(measure("node_exporter", [
                node_exporter, f"--web.listen-address=127.0.0.1:{port}",
                "--collector.disable-defaults", "--collector.diskstats",
                f"--path.procfs={tree}", "--log.level=warn"], port, args.count))
    print(f"{args.count} scrapes each, diskstats of {args.devices or 'the fixture'} devices")
    print(f"{'exporter':<14}{'plain med':>10}{'p99':>8}{'prom med':>10}{'p99':>8}"
          f"{'bytes':>9}{'RSS MiB':>9}")
    for r in results:
        print(f"{r['exporter']:<14}{r['plain']['median_ms']:>10.2f}{r['plain']['p99_ms']:>8.2f}"
              f"{r['prometheus']['median_ms']:>10.2f}{r['prometheus']['p99_ms']:>8.2f}"
              f"{r['plain']['bytes']:>9}{r['rss_mib']:>9.1f}")
    if len(results) == 2:
        ours, theirs = results
        for kind in ("plain", "prometheus"):
            print(f"{kind}: llmmon/node_exporter p99 ratio "
                  f"{ours[kind]['p99_ms'] / theirs[kind]['p99_ms']:.2f}, median ratio "
                  f"{ours[kind]['median_ms'] / theirs[kind]['median_ms']:.2f}")
        print(f"RSS ratio {ours['rss_mib'] / theirs['rss_mib']:.2f}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "scrape.json").write_text(json.dumps(results, indent=2))
    if args.write_result:
        rows = [f"{args.count} scrapes each on one keep-alive connection, diskstats of "
                f"{args.devices or 'the fixture'} devices.", "",
                "| exporter | median | p99 | median, as Prometheus scrapes | p99, as Prometheus "
                "scrapes | bytes | RSS |", "|---|---:|---:|---:|---:|---:|---:|"]
        rows += [f"| {r['exporter']} | {r['plain']['median_ms']:.2f} ms | "
                 f"{r['plain']['p99_ms']:.2f} ms | {r['prometheus']['median_ms']:.2f} ms | "
                 f"{r['prometheus']['p99_ms']:.2f} ms | {r['plain']['bytes']} | "
                 f"{r['rss_mib']:.1f} MiB |" for r in results]
        path = write_result("scrape", "\n".join(rows) + "\n",
                            title="Scrape latency: llmmon against node_exporter")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
