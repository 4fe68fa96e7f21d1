"""Series per node, measured, and the capacity table of docs/capacity.md computed from it.

Starts `llmmon serve` on the richest fixture node the tests have (8 replayed H200s, the RDMA and
NIC fixture trees, ethtool and netlink dumps, diskstats, and the spool of a 4-rank NCCL job,
copied and dated now so that its ranks are live), waits until every collector has run, and
counts the samples of one scrape, per collector from /api/v1/collectors. The table assumes a
training job on every node with one rank per GPU: the fixture job's per-rank series are scaled
from its 4 ranks to 8. Prints the table; `--write-result` writes it as the dated result
docs/benchmarks/<date>-series-count.md (bench/common.py); JSON goes to
bench/results/series_count.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from common import free_port, rss_mib, stop, wait_http, write_result

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
# (flag, fixture): the inputs of a fat 8-GPU training node; missing fixtures are reported.
INPUTS = (
    ("--path.sysfs", FIXTURES / "sys"),
    ("--path.procfs", FIXTURES / "proc"),
    ("--fake-nvml", FIXTURES / "nvml" / "h200x8"),
    ("--ethtool.dumps", FIXTURES / "ethtool"),
    ("--netlink.dump", FIXTURES / "netlink" / "links.json"),
)
SPOOL = FIXTURES / "spool" / "nccl4"
GPUS_PER_NODE = 8
CLUSTERS_GPUS = (1_000, 10_000, 100_000)
SCRAPE_INTERVAL_S = 15
# Planning figure, not a measurement: Prometheus 2.x needs roughly this much memory per
# active head series (index, chunks, labels); check yours with process_resident_memory_bytes
# / prometheus_tsdb_head_series.
BYTES_PER_SERIES = 4096
ONE_PROMETHEUS_MAX_SERIES = 2_000_000
# The GPU collector's slow calls (energy, ECC, PCIe, NVLink) run every 15 s: scrape after them.
SETTLE_S = 16


def measure() -> dict:
    used = [(flag, path) for flag, path in INPUTS if path.exists()]
    missing = [str(path.relative_to(ROOT)) for flag, path in (*INPUTS, ("", SPOOL))
               if not path.exists()]
    port = free_port()
    with tempfile.TemporaryFile() as log, tempfile.TemporaryDirectory() as work:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmmon", "serve", f"--web.listen-address=127.0.0.1:{port}",
             *(f"{flag}={path}" for flag, path in used), *_ranks_flags(Path(work))],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http(port, "/healthz")
            _settled(port)
            time.sleep(SETTLE_S)
            states = _settled(port)
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            rss, _ = rss_mib(process.pid)
        finally:
            stop(process)
    text = body.decode()
    samples = [line for line in text.splitlines() if line and line[0] != "#"]
    per_collector = {s["name"]: s["series"] for s in states}
    ranks, per_rank = _rank_series(text)
    scaled = round(per_rank / ranks * (GPUS_PER_NODE - ranks)) if ranks else 0
    return {"series_per_node": len(samples), "per_collector": per_collector,
            "exporter_self": len(samples) - sum(per_collector.values()),
            "ranks": ranks, "rank_series": per_rank,
            "series_per_node_8_ranks": len(samples) + scaled,
            "collector_status": {s["name"]: s["status"] for s in states},
            "rss_mib": round(rss, 1),
            "inputs": [str(p.relative_to(ROOT)) for p in (*(p for _, p in used), SPOOL)
                       if p.exists()],
            "missing_inputs": missing}


def _ranks_flags(work: Path) -> list[str]:
    """The fixture job's spool, copied and dated now (live ranks, never dropped from the
    fixture tree); dump pipes and dumps in the same scratch folder, not the host's."""
    if not SPOOL.exists():
        return []
    spool = work / "spool"
    shutil.copytree(SPOOL, spool / SPOOL.name)
    now = time.time()
    for path in spool.rglob("*.json"):
        os.utime(path, (now, now))
    return [f"--spool.dir={spool / SPOOL.name}", f"--collector.ranks.pipe-dir={work / 'frpipe'}",
            f"--collector.ranks.fr-dir={work / 'fr'}"]


def _rank_series(text: str) -> tuple[int, int]:
    """(ranks seen, samples labelled with a rank) in an exposition."""
    ranks, per_rank = set(), 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "rank" in sample.labels and "job_id" in sample.labels:
                ranks.add((sample.labels["job_id"], sample.labels["rank"]))
                per_rank += 1
    return len(ranks), per_rank


def _settled(port: int, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        url = f"http://127.0.0.1:{port}/api/v1/collectors"
        states = json.load(urllib.request.urlopen(url, timeout=10))["collectors"]
        if all(s["status"] != "pending" for s in states) or time.monotonic() > deadline:
            return states
        time.sleep(0.2)


def table(result: dict) -> str:
    per_node = result["series_per_node_8_ranks"]
    ranks = result["ranks"]
    lines = [
        f"Measured: {result['series_per_node']} series on the 8-GPU fixture node running a "
        f"{ranks}-rank job "
        f"({', '.join(f'{k} {v}' for k, v in sorted(result['per_collector'].items()))}, "
        f"exporter self-metrics {result['exporter_self']}); exporter RSS "
        f"{result['rss_mib']} MiB. {result['rank_series']} of them are per rank; with one "
        f"rank per GPU that makes **{per_node:,} series per 8-GPU node**, the figure below.",
    ]
    if result["missing_inputs"]:
        lines.append(f"Not yet measured (fixture absent): {', '.join(result['missing_inputs'])}.")
    lines += ["", "| GPUs | nodes | active series | samples/s at 15 s | Prometheus memory "
              "(planning) | topology |", "|---:|---:|---:|---:|---:|---|"]
    for gpus in CLUSTERS_GPUS:
        nodes = gpus // GPUS_PER_NODE
        series = nodes * per_node
        memory_gib = series * BYTES_PER_SERIES / 2**30
        topology = ("one Prometheus (pair for HA)" if series <= ONE_PROMETHEUS_MAX_SERIES / 4
                    else "one large Prometheus, or agents + remote write"
                    if series <= ONE_PROMETHEUS_MAX_SERIES
                    else "agents + remote write to Mimir/Thanos/VictoriaMetrics")
        lines.append(f"| {gpus:,} | {nodes:,} | {series:,} | {series // SCRAPE_INTERVAL_S:,} | "
                     f"{memory_gib:,.1f} GiB | {topology} |")
    return "\n".join(lines) + "\n"


def write_docs(text: str) -> None:
    """docs/benchmarks/<date>-series-count.md: the planning table, after the header that says
    when, on what and at which commit.  How it is measured: docs/capacity.md."""
    path = write_result("series-count", "How it is measured: [capacity.md](../capacity.md).\n\n"
                        + text, title="Series per node on the fixture node (planning table)")
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-result", "--write-docs", dest="write_docs", action="store_true",
                        help="Write the dated result docs/benchmarks/<date>-series-count.md.")
    args = parser.parse_args()
    result = measure()
    text = table(result)
    print(text)
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "series_count.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.write_docs:
        write_docs(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
