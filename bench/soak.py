"""A compressed soak: one hour of a fat simulated node under the unmodified exporter.

The fat node is the cardinality budget's (docs/design.md#budgets): 8 GPUs, 8 RDMA ports, 16
disks and an 8-rank job.  `--compression N` plays the hour in 3600/N wall seconds: every duration of the
exporter (collector intervals, the GPU collector's slow calls, the ranks collector's stale,
drop and stall windows) and of the simulator (ticks, Flight Recorder entries, scenario clocks)
is divided by N, and Prometheus-style scrapes (OpenMetrics, gzip, one keep-alive connection)
come every 15/N s, so the daemon does an hour's collections and scrapes.  Two things keep
their real pace: the 20 Hz instant-power sampler, and the training job's steps (the hour
sees 1/N of its steps).  Scenarios rotate every ten (compressed) minutes, the job dying and
coming back with new processes on the way, so the daemon also sees series come and go.

Reports RSS and CPU (percent of one core, as measured: N times the uncompressed load) at the
start and end and in between, scrape latency p50/p99 and the largest series count, and writes
bench/results/soak.json.  `--compression 20` takes three minutes.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import rss_mib
from scrape import PROMETHEUS_HEADERS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmmon.simulate import control  # noqa: E402 (after the checkout is on the path)
from llmmon.simulate.cluster import ClusterConfig  # noqa: E402
from llmmon.simulate.runner import Simulation  # noqa: E402

HOUR = 3600.0
SEGMENT = 600.0  # scenario rotation, uncompressed seconds
ROTATION = (["healthy"], ["starvation"], ["thermal", "pfc-storm"],
            ["oom:ramp=120,retry=240,oom=420"], ["fp16:nan_after=60", "straggler"],
            ["link-flap:every=60"], ["hang"], ["gpu-lost"], ["healthy"])
BUDGET = 3000
# Exporter durations (seconds, uncompressed) divided by the compression.
DURATIONS = {"--collector.gpu.interval": 5, "--collector.gpu.slow-interval": 15,
             "--collector.rdma.interval": 5, "--collector.nic.interval": 5,
             "--collector.netdev.interval": 5, "--collector.disk.interval": 5,
             "--collector.ranks.interval": 5, "--collector.topology.interval": 60,
             "--collector.ranks.stale-after": 30, "--collector.ranks.drop-after": 600,
             "--collector.ranks.stall-after": 60, "--collector.ranks.dump-after": 180}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(conn: http.client.HTTPConnection) -> tuple[float, int]:
    """One Prometheus-style scrape: milliseconds and the number of series."""
    started = time.perf_counter()
    conn.request("GET", "/metrics", headers=PROMETHEUS_HEADERS)
    response = conn.getresponse()
    body = response.read()
    elapsed = (time.perf_counter() - started) * 1000
    if response.status != 200:
        raise RuntimeError(f"scrape answered {response.status}")
    text = gzip.decompress(body).decode()
    return elapsed, sum(1 for line in text.splitlines() if line and line[0] != "#")


def soak(work: Path, hours: float, compression: float, samples: int,
         scrape_interval: float) -> dict:
    tick = max(1.0 / compression, 0.25)  # inputs change at least once per collector run
    config = ClusterConfig(nodes=1, disks=16, speed=compression, tick=tick,
                           entries_interval=max(20.0 / compression, tick))
    simulation = Simulation(work, config, [])
    flags = [f"{flag}={seconds / compression:g}s" for flag, seconds in DURATIONS.items()]
    simulation.serve("127.0.0.1", 0, [*flags, "--collector.topology", "--log.level=warning"])
    exporter = simulation.exporters[0]
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=10)
    wall = hours * HOUR / compression
    started = time.monotonic()
    next_tick = next_scrape = next_sample = next_segment = started
    segment = 0
    last_cpu, last_time = cpu_seconds(exporter.process.pid), started
    timings, series, curve = [], [], []
    try:
        while (now := time.monotonic()) < started + wall:
            if now >= next_segment:
                specs = [control.parse(s) for s in ROTATION[segment % len(ROTATION)]
                         if s != "healthy"]
                control.write(simulation.control.path, specs)
                segment += 1
                next_segment += SEGMENT / compression
            if now >= next_tick:
                simulation.step(time.time())
                next_tick += tick
            if now >= next_scrape:
                elapsed, count = scrape(conn)
                timings.append(elapsed)
                series.append(count)
                next_scrape += scrape_interval / compression
            if now >= next_sample:
                cpu = cpu_seconds(exporter.process.pid)
                rss, _ = rss_mib(exporter.process.pid)
                window = now - last_time
                curve.append({"hour_fraction": round((now - started) / wall, 3),
                              "rss_mib": round(rss, 1),
                              "cpu_percent": round(100 * (cpu - last_cpu) / window, 1)
                              if window > 0 else None,
                              "series": series[-1] if series else None})
                last_cpu, last_time = cpu, now
                next_sample += wall / samples
            time.sleep(max(min(next_tick, next_scrape, next_sample) - time.monotonic(), 0))
        rss, peak = rss_mib(exporter.process.pid)
    finally:
        conn.close()
        simulation.close()
    timings.sort()
    return {"hours": hours, "compression": compression, "wall_seconds": round(wall, 1),
            "scrape_interval_seconds": scrape_interval,
            "scrapes": len(timings),
            "scrape_ms": {"p50": round(statistics.median(timings), 2),
                          "p99": round(timings[max(int(len(timings) * 0.99) - 1, 0)], 2),
                          "max": round(timings[-1], 2)},
            "series": {"max": max(series), "last": series[-1], "budget": BUDGET},
            "rss_mib": {"start": curve[1]["rss_mib"] if len(curve) > 1 else None,
                        "end": round(rss, 1), "peak": round(peak, 1)},
            "cpu_percent": {"start": curve[1]["cpu_percent"] if len(curve) > 1 else None,
                            "end": curve[-1]["cpu_percent"]},
            "curve": curve}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=1.0, help="simulated hours (default 1)")
    parser.add_argument("--compression", type=float, default=20.0,
                        help="simulated seconds per wall second (default 20: 3 minutes)")
    parser.add_argument("--samples", type=int, default=12,
                        help="resource samples over the run (default 12)")
    parser.add_argument("--scrape-interval", type=float, default=15.0, metavar="SECONDS",
                        help="uncompressed seconds between scrapes (default 15, Prometheus'; "
                             "smaller for more latency samples at a real pace)")
    args = parser.parse_args()
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="llmmon-soak-", dir=shm))
    try:
        result = soak(work, args.hours, args.compression, args.samples, args.scrape_interval)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.hours:g} h at x{args.compression:g} ({result['wall_seconds']:g} s), "
          f"{result['scrapes']} scrapes")
    print(f"{'hour':>6}{'RSS MiB':>10}{'CPU %':>8}{'series':>8}")
    for point in result["curve"]:
        cpu = "-" if point["cpu_percent"] is None else f"{point['cpu_percent']:.1f}"
        print(f"{point['hour_fraction']:>6.2f}{point['rss_mib']:>10.1f}{cpu:>8}"
              f"{point['series'] or 0:>8}")
    print(f"scrape ms p50 {result['scrape_ms']['p50']} p99 {result['scrape_ms']['p99']} "
          f"max {result['scrape_ms']['max']}; series max {result['series']['max']} "
          f"(budget {BUDGET}); RSS {result['rss_mib']['start']} -> {result['rss_mib']['end']} "
          f"MiB; CPU {result['cpu_percent']['start']} -> {result['cpu_percent']['end']} %")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    ok = result["scrape_ms"]["p99"] < 10 and result["series"]["max"] <= BUDGET
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
