"""Cost of the rdma and nic collectors on a node with 8 RDMA ports and 8 mlx5 netdevs, beside
node_exporter's infiniband collector on the same sysfs tree.

The tree holds 8 ConnectX-7 RoCE ports with the full hw_counters set (copies of the fixture's
mlx5_0) and 8 `ethtool -S` dumps of ~680 mlx5 statistics each (file backend).  Measured:
- collector cost: one llmmon run (collect + render) in-process, --runs times; node_exporter's own
  `node_scrape_collector_duration_seconds{collector="infiniband"}` over --runs scrapes;
- scrape latency of `llmmon serve` (rdma + nic: cached bytes) and of node_exporter (which reads
  sysfs during every scrape), --runs scrapes each on one keep-alive connection.
Prints a table and writes JSON to bench/results/network_collectors.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import free_port, scrape_times, stop, wait_http

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmmon.collector import Context  # noqa: E402
from llmmon.collectors.nic import NicCollector  # noqa: E402
from llmmon.collectors.rdma import RdmaCollector  # noqa: E402
from llmmon.exposition import render  # noqa: E402
from tests.core.helpers import make_collector  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
TEMPLATE = FIXTURES / "sys" / "class" / "infiniband" / "mlx5_0"
_DURATION = re.compile(r'^node_scrape_collector_duration_seconds\{collector="infiniband"\} (\S+)$',
                       re.M)


def build_node(workdir: Path, ports: int) -> tuple[Path, Path]:
    """A sysfs tree with `ports` RDMA devices (one port each) and their netdevs, and a dump
    directory with one mlx5 `ethtool -S` capture per netdev."""
    sysfs, dumps = workdir / "sys", workdir / "ethtool"
    dumps.mkdir(parents=True)
    template = TEMPLATE.resolve()
    for i in range(ports):
        bus = 0x10 * (i + 1)
        pci = (sysfs / "devices" / f"pci0000:{bus:02x}" / f"0000:{bus:02x}:01.0"
               / f"0000:{bus + 1:02x}:00.0")
        device, netdev = f"mlx5_{i}", f"ens{i + 1}f0np0"
        shutil.copytree(template, pci / "infiniband" / device, symlinks=True)
        (pci / "infiniband" / device / "device").unlink()
        os.symlink("../..", pci / "infiniband" / device / "device")
        (pci / "infiniband" / device / "ports/1/gid_attrs/ndevs/0").write_text(netdev + "\n")
        (pci / "numa_node").write_text(f"{i // 4}\n")
        (pci / "net" / netdev).mkdir(parents=True)
        for link, target in ((sysfs / "class/infiniband" / device, pci / "infiniband" / device),
                             (sysfs / "class/net" / netdev, pci / "net" / netdev)):
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(target, link.parent), link)
        shutil.copy(FIXTURES / "ethtool" / "ens1f0np0", dumps / netdev)
    return sysfs, dumps


def summary(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {"median_ms": round(statistics.median(ordered), 3),
            "p99_ms": round(ordered[max(int(len(ordered) * 0.99) - 1, 0)], 3)}


def collector_cost(collector: object, runs: int) -> dict[str, float]:
    samples, series = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        families = list(collector.collect(Context()))  # type: ignore[attr-defined]
        render(families)
        samples.append((time.perf_counter() - started) * 1000)
        series = sum(len(f.samples) for f in families)
    return {**summary(samples), "series": series}


def node_exporter_cost(binary: str, sysfs: Path, runs: int) -> dict[str, object]:
    port = free_port()
    proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}",
                             "--collector.disable-defaults", "--collector.infiniband",
                             f"--path.sysfs={sysfs}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(port, "/metrics")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        durations, body = [], ""
        for _ in range(runs):
            conn.request("GET", "/metrics")
            body = conn.getresponse().read().decode()
            match = _DURATION.search(body)
            if match is None:
                raise RuntimeError("node_exporter reported no infiniband collector duration")
            durations.append(float(match.group(1)) * 1000)
        conn.close()
        scrape = scrape_times(port, "/metrics", runs, {})
    finally:
        stop(proc)
    series = sum(1 for line in body.splitlines() if line.startswith("node_infiniband_"))
    return {"collector": {**summary(durations), "series": series}, "scrape": scrape.__dict__}


def llmmon_scrape(sysfs: Path, dumps: Path, runs: int) -> dict[str, object]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llmmon", "serve",
                             f"--web.listen-address=127.0.0.1:{port}",
                             "--collector.disable-defaults", "--collector.rdma", "--collector.nic",
                             f"--path.sysfs={sysfs}", f"--ethtool.dumps={dumps}",
                             "--log.level=warning"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(port, "/metrics")
        time.sleep(1.0)  # first collection
        return scrape_times(port, "/metrics", runs, {}).__dict__
    finally:
        stop(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--ports", type=int, default=8)
    args = parser.parse_args()
    result: dict[str, object] = {"ports": args.ports, "runs": args.runs}
    with tempfile.TemporaryDirectory() as tmp:
        sysfs, dumps = build_node(Path(tmp), args.ports)
        rdma = make_collector(RdmaCollector, FIXTURES / "proc", sysfs)
        nic = make_collector(NicCollector, FIXTURES / "proc", sysfs, dumps=str(dumps))
        result["llmmon_rdma"] = collector_cost(rdma, args.runs)
        result["llmmon_nic"] = collector_cost(nic, args.runs)
        result["llmmon_scrape"] = llmmon_scrape(sysfs, dumps, args.runs)
        binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
        if binary:
            result["node_exporter_infiniband"] = node_exporter_cost(binary, sysfs, args.runs)
    print(f"{args.ports} RDMA ports with full hw_counters, {args.ports} mlx5 netdevs "
          f"(~680 ethtool stats each), {args.runs} runs")
    print(f"{'collector cost':<34}{'median ms':>10}{'p99 ms':>9}{'series':>8}")
    rows = [("llmmon rdma (collect+render)", result["llmmon_rdma"]),
            ("llmmon nic, file backend", result["llmmon_nic"])]
    if "node_exporter_infiniband" in result:
        rows.append(("node_exporter infiniband", result["node_exporter_infiniband"]["collector"]))
    for name, row in rows:
        print(f"{name:<34}{row['median_ms']:>10.2f}{row['p99_ms']:>9.2f}{row['series']:>8}")
    print(f"{'scrape latency':<34}{'median ms':>10}{'p99 ms':>9}{'bytes':>8}")
    scrapes = [("llmmon serve (rdma + nic)", result["llmmon_scrape"])]
    if "node_exporter_infiniband" in result:
        scrapes.append(("node_exporter infiniband", result["node_exporter_infiniband"]["scrape"]))
    for name, row in scrapes:
        print(f"{name:<34}{row['median_ms']:>10.2f}{row['p99_ms']:>9.2f}{row['bytes']:>8}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "network_collectors.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
