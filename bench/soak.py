"""A compressed soak: one hour of a fat simulated node under the unmodified exporter.

The fat node is the cardinality budget's (docs/design.md#budgets): 8 GPUs, 8 RDMA ports, 16
disks and an 8-rank job with 2,000-record Flight Recorder rings (`--ring`).  `--compression N`
plays the hour in 3600/N wall seconds: every duration of the exporter (collector intervals, the
GPU collector's slow calls, the ranks collector's stale, drop and stall windows) and of the
simulator (ticks, Flight Recorder entries, scenario clocks) is divided by N, and
Prometheus-style scrapes (OpenMetrics, gzip, one keep-alive connection) come every 15/N s, so
the daemon does an hour's collections and scrapes.  Two things keep their real pace: the 20 Hz
instant-power sampler, and the training job's steps (the hour sees 1/N of its steps).
Scenarios rotate every ten (compressed) minutes, the job dying and coming back with new
processes on the way, so the daemon also sees series come and go.

The first `--idle-fraction` of the run is the idle reference; for the rest a second, CPU-bound
process runs on the machine (`--no-hog` to leave it out).  node_exporter (Debian's
prometheus-node-exporter; its infiniband and diskstats collectors on the same simulated sysfs
and procfs trees) is scraped at the same cadence beside it, and its CPU measured alike.

Reports RSS and CPU over the run, scrape latency p50/p99 idle and under load, the largest
series count, and one table of the daemon's targets (pass/miss, with a previous soak's
figure beside each); writes bench/results/soak.json.  RSS and CPU are those of
`llmmon serve`'s two processes, the server and its collector process, each and summed.  CPU is
reported as measured (percent of one core during the compressed run: N times an hour's
collections and scrapes) and per uncompressed hour (CPU seconds / the simulated seconds, plus
the 20 Hz sampler's own 0.38 % from bench/gpu_collector.py, since it ran only for the compressed
time).  The other threads that keep their real pace (the XID and PID watches, the diagnoser,
the web server's own clock) are undercounted so: `--compression 1` measures them.  Each
collector's share of a core, per uncompressed hour, is what its runs took
(/api/v1/collectors' `cpu_seconds`, CPU time, not wall time); the collector process'
CPU outside its runs is reported as measured.  RSS growth is judged over the last 30 simulated
minutes (`--hours 2` shows whether a rise in the first hour levels off).
`--compression 20` takes three minutes.  `--write-result` also writes the targets table and the
collectors' runs as the dated result docs/benchmarks/<date>-soak.md (bench/common.py).
"""

from __future__ import annotations

import argparse
import gzip
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

from common import daemon_parts, free_port, pss_mib, rss_mib, stop, wait_http, write_result
from scrape import PROMETHEUS_HEADERS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmmon.collectors import discover  # noqa: E402 (after the checkout is on the path)
from llmmon.config import collector_flag, collector_options  # noqa: E402
from llmmon.simulate import control  # noqa: E402
from llmmon.simulate.cluster import ClusterConfig  # noqa: E402
from llmmon.simulate.runner import Simulation  # noqa: E402

HOUR = 3600.0
SEGMENT = 600.0  # scenario rotation, uncompressed seconds
ROTATION = (["healthy"], ["starvation"], ["thermal", "pfc-storm"],
            ["oom:ramp=120,retry=240,oom=420"], ["fp16:nan_after=60", "straggler"],
            ["link-flap:every=60"], ["hang"], ["gpu-lost"], ["healthy"])
BUDGET = 2000
SAMPLER_PERCENT = 0.38  # 20 Hz power sampling of 8 GPUs, % of one core (bench/gpu_collector.py)
# A previous measured soak (2026-12-02, the first with the collector process), beside each
# target (docs/benchmarks/2026-12-05-soak.md).
PREVIOUS = {"scrape_p99_ms": "8.81", "p99_over_idle": "1.5x",
            "rss_mib": "server 70.2 + collector 56.6 = 126.8", "rss_growth_mib": "1.1",
            "cpu_percent_hour": "1.46", "series": "1,958"}
# Exporter durations (seconds, uncompressed) divided by the compression.
DURATIONS = {"--collector.gpu.interval": 5, "--collector.gpu.slow-interval": 15,
             "--collector.rdma.interval": 5, "--collector.nic.interval": 5,
             "--collector.netdev.interval": 5, "--collector.disk.interval": 5,
             "--collector.ranks.interval": 5, "--collector.topology.interval": 60,
             "--collector.ranks.stale-after": 30, "--collector.ranks.drop-after": 600,
             "--collector.ranks.stall-after": 60, "--collector.ranks.dump-after": 180}


def minimums() -> dict[str, float]:
    """Each duration flag's smallest accepted value: a compressed one is raised to it."""
    floors = {}
    for cls in discover():
        for option in collector_options(cls):
            if option.type == "duration":
                floors[collector_flag(cls, option)] = option.parse(option.minimum)
    return floors


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU of a process (with `children`, of the children it reaped too)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def daemon_cpu(pid: int) -> float:
    """CPU of `llmmon serve`: the server, its live collector process and any it reaped."""
    parts = daemon_parts(pid)
    return cpu_seconds(pid, children=True) + sum(
        cpu_seconds(child) for name, child in parts.items() if name != "server")


def collector_process_cpu(pid: int) -> float:
    """CPU of `llmmon serve`'s collector processes, the live one and any reaped."""
    return daemon_cpu(pid) - cpu_seconds(pid)


def runs_cpu(port: int) -> dict[str, float]:
    """Each collector's runs' CPU seconds so far (/api/v1/collectors' `cpu_seconds`)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/api/v1/collectors")
        answer = json.loads(conn.getresponse().read())
        return {c["name"]: c["cpu_seconds"] for c in answer["collectors"]}
    finally:
        conn.close()


def daemon_rss(pid: int) -> dict[str, float]:
    """RSS of each part of `llmmon serve` and their sum, MiB."""
    parts = {name: rss_mib(part)[0] for name, part in daemon_parts(pid).items()}
    return {**parts, "sum": sum(parts.values())}


DURATION = re.compile(r'^llmmon_exporter_collector_duration_seconds\{collector="([a-z_]+)"\} '
                      r'([0-9.e+-]+)$', re.MULTILINE)


def scrape(conn: http.client.HTTPConnection, durations: dict[str, list[float]] | None = None
           ) -> tuple[float, int]:
    """One Prometheus-style scrape: milliseconds and the number of series; each collector's
    last run duration is appended to `durations`."""
    started = time.perf_counter()
    conn.request("GET", "/metrics", headers=PROMETHEUS_HEADERS)
    response = conn.getresponse()
    body = response.read()
    elapsed = (time.perf_counter() - started) * 1000
    if response.status != 200:
        raise RuntimeError(f"scrape answered {response.status}")
    if response.getheader("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    text = body.decode()
    for name, seconds in DURATION.findall(text) if durations is not None else ():
        durations.setdefault(name, []).append(float(seconds))
    return elapsed, sum(1 for line in text.splitlines() if line and line[0] != "#")


def node_exporter(sysfs: Path, procfs: Path) -> tuple[subprocess.Popen, int] | None:
    """node_exporter on the node's trees (infiniband, diskstats), or None when not installed."""
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        return None
    port = free_port()
    proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}",
                             "--collector.disable-defaults", "--collector.infiniband",
                             "--collector.diskstats", f"--path.sysfs={sysfs}",
                             f"--path.procfs={procfs}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(port, "/metrics")
    return proc, port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(int(len(ordered) * q) - 1, 0)] if ordered else 0.0


def soak(work: Path, hours: float, compression: float, samples: int,
         scrape_interval: float, idle_fraction: float, hog: bool, ring: int) -> dict:
    tick = max(1.0 / compression, 0.25)  # inputs change at least once per collector run
    config = ClusterConfig(nodes=1, disks=16, speed=compression, tick=tick,
                           entries_interval=max(20.0 / compression, tick), ring=ring)
    simulation = Simulation(work, config, [])
    floors = minimums()
    flags = [f"{flag}={max(seconds / compression, floors[flag]):g}s"
             for flag, seconds in DURATIONS.items()]
    simulation.serve("127.0.0.1", 0, [*flags, "--collector.topology", "--log.level=warning"])
    exporter = simulation.exporters[0]
    paths = simulation.cluster.nodes[0].paths
    peer = node_exporter(paths.sysfs, paths.procfs)
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=10)
    peer_conn = http.client.HTTPConnection("127.0.0.1", peer[1], timeout=10) if peer else None
    wall = hours * HOUR / compression
    started = time.monotonic()
    loaded_at = started + wall * idle_fraction
    hog_proc: subprocess.Popen | None = None
    next_tick = next_scrape = next_sample = next_segment = started
    segment = 0
    pids = {"llmmon": exporter.process.pid, **({"node_exporter": peer[0].pid} if peer else {})}
    measure = {"llmmon": daemon_cpu, "node_exporter": cpu_seconds}
    idle, loaded, series, curve = [], [], [], []
    durations: dict[str, list[float]] = {}
    try:  # whatever fails from here on, the daemons are stopped
        cpu_start = {name: measure[name](pid) for name, pid in pids.items()}
        collector_start = collector_process_cpu(exporter.process.pid)
        runs_start = runs_cpu(exporter.port)
        last_cpu, last_time = cpu_start["llmmon"], started
        while (now := time.monotonic()) < started + wall:
            if hog and hog_proc is None and now >= loaded_at:
                hog_proc = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
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
                elapsed, count = scrape(conn, durations)
                (idle if now < loaded_at else loaded).append(elapsed)
                series.append(count)
                if peer_conn is not None:
                    scrape(peer_conn)
                next_scrape += scrape_interval / compression
            if now >= next_sample:
                cpu = daemon_cpu(exporter.process.pid)
                rss = daemon_rss(exporter.process.pid)
                window = now - last_time
                curve.append({"hour": round(hours * (now - started) / wall, 3),
                              "rss_mib": round(rss["sum"], 1),
                              "server_rss_mib": round(rss["server"], 1),
                              "collector_rss_mib": round(rss.get("collector", 0.0), 1),
                              "cpu_percent": round(100 * (cpu - last_cpu) / window, 1)
                              if window > 0 else None,
                              "series": series[-1] if series else None})
                last_cpu, last_time = cpu, now
                next_sample += wall / samples
            time.sleep(max(min(next_tick, next_scrape, next_sample) - time.monotonic(), 0))
        elapsed_wall = time.monotonic() - started
        cpu_used = {name: measure[name](pid) - cpu_start[name] for name, pid in pids.items()}
        collector_used = collector_process_cpu(exporter.process.pid) - collector_start
        runs_end = runs_cpu(exporter.port)
        rss = daemon_rss(exporter.process.pid)
        pss = sum(pss_mib(part) for part in daemon_parts(exporter.process.pid).values())
        peak = max(point["rss_mib"] for point in curve)
        peer_rss = rss_mib(peer[0].pid)[0] if peer else None
    finally:
        if hog_proc is not None:
            stop(hog_proc)
        conn.close()
        if peer is not None:
            peer_conn.close()  # type: ignore[union-attr]
            stop(peer[0])
        simulation.close()
    last = [p["rss_mib"] for p in curve if p["hour"] >= hours - 0.5]  # the last 30 minutes
    simulated = hours * HOUR
    # A count that went down belongs to a restarted collector process: count from zero.
    runs_used = {name: end - runs_start.get(name, 0.0) if end >= runs_start.get(name, 0.0)
                 else end for name, end in runs_end.items()}
    cpu = {name: {"measured_percent": round(100 * used / elapsed_wall, 2),
                  "per_hour_percent": round(100 * used / simulated + (
                      SAMPLER_PERCENT * (1 - wall / simulated) if name == "llmmon" else 0), 2)}
           for name, used in cpu_used.items()}
    cpu["llmmon"]["collector_runs_percent"] = round(100 * sum(runs_used.values()) / simulated, 2)
    cpu["llmmon"]["collector_outside_runs_measured_percent"] = round(
        100 * (collector_used - sum(runs_used.values())) / elapsed_wall, 2)
    intervals = {flag.split(".")[1]: max(seconds / compression, floors[flag])
                 for flag, seconds in DURATIONS.items() if flag.endswith(".interval")}
    runs = {name: {"median_ms": round(1000 * statistics.median(values), 2),
                   "interval_s": round(intervals[name], 3) if name in intervals else None,
                   "cpu_percent": round(100 * runs_used.get(name, 0.0) / simulated, 3)}
            for name, values in sorted(durations.items())}
    return {"hours": hours, "compression": compression, "wall_seconds": round(wall, 1),
            "ring": ring,
            "collector_runs": runs,
            "scrape_interval_seconds": scrape_interval, "hog": hog,
            "scrapes": {"idle": len(idle), "loaded": len(loaded)},
            "scrape_ms": {"idle_p50": round(statistics.median(idle), 2) if idle else None,
                          "idle_p99": round(percentile(idle, 0.99), 2),
                          "p50": round(statistics.median(loaded or idle), 2),
                          "p99": round(percentile(loaded or idle, 0.99), 2),
                          "max": round(max(loaded or idle), 2)},
            "series": {"max": max(series), "last": series[-1], "budget": BUDGET},
            "rss_mib": {"start": curve[1]["rss_mib"] if len(curve) > 1 else None,
                        "end": round(rss["sum"], 1), "peak": round(peak, 1),
                        "server": round(rss["server"], 1),
                        "collector": round(rss.get("collector", 0.0), 1),
                        "pss_sum": round(pss, 1),
                        "last_30_min_growth": round(max(last) - min(last), 1) if last else None,
                        "node_exporter": round(peer_rss, 1) if peer_rss else None},
            "cpu": cpu, "curve": curve}


def targets(result: dict) -> list[tuple[str, str, str, bool, str]]:
    """(target, figure, goal, met, the previous soak's figure) for the daemon's targets."""
    scrape_ms, rss, cpu = result["scrape_ms"], result["rss_mib"], result["cpu"]
    ratio = scrape_ms["p99"] / scrape_ms["idle_p99"] if scrape_ms["idle_p99"] else float("inf")
    peer = cpu.get("node_exporter", {}).get("per_hour_percent")
    return [
        ("scrape p99 under load", f"{scrape_ms['p99']} ms", "<= 10 ms", scrape_ms["p99"] <= 10,
         PREVIOUS["scrape_p99_ms"] + " ms"),
        ("scrape p99 / idle p99", f"{ratio:.1f}x (idle {scrape_ms['idle_p99']} ms)", "<= 3x",
         ratio <= 3, PREVIOUS["p99_over_idle"]),
        ("RSS at the end, each process",
         f"server {rss['server']} + collector {rss['collector']} = {rss['end']} MiB "
         f"(PSS {rss['pss_sum']})", "<= 80 MiB each",
         max(rss["server"], rss["collector"]) <= 80, PREVIOUS["rss_mib"] + " MiB"),
        ("RSS growth, last 30 min (sum)", f"{rss['last_30_min_growth']} MiB", "flat (< 2 MiB)",
         rss["last_30_min_growth"] is not None and rss["last_30_min_growth"] < 2,
         PREVIOUS["rss_growth_mib"] + " MiB"),
        ("CPU per hour (whole daemon)", f"{cpu['llmmon']['per_hour_percent']} % "
         f"(node_exporter {peer} %)", "<= 2 %", cpu["llmmon"]["per_hour_percent"] <= 2,
         PREVIOUS["cpu_percent_hour"] + " %"),
        ("series", f"{result['series']['max']}", f"<= {BUDGET}",
         result["series"]["max"] <= BUDGET, PREVIOUS["series"]),
    ]


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
    parser.add_argument("--idle-fraction", type=float, default=0.25,
                        help="share of the run before the CPU hog starts (default 0.25)")
    parser.add_argument("--no-hog", action="store_true", help="no second CPU-bound process")
    parser.add_argument("--ring", type=int, default=2000,
                        help="Flight Recorder records per rank (default 2000, full rings)")
    parser.add_argument("--write-result", action="store_true",
                        help="write the dated result docs/benchmarks/<date>-soak.md")
    args = parser.parse_args()
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="llmmon-soak-", dir=shm))
    try:
        result = soak(work, args.hours, args.compression, args.samples, args.scrape_interval,
                      args.idle_fraction, not args.no_hog, args.ring)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.hours:g} h at x{args.compression:g} ({result['wall_seconds']:g} s), "
          f"{result['scrapes']['idle']} idle + {result['scrapes']['loaded']} loaded scrapes")
    print(f"{'hour':>6}{'RSS MiB':>10}{'server':>8}{'collect':>8}{'CPU %':>8}{'series':>8}")
    for point in result["curve"]:
        cpu = "-" if point["cpu_percent"] is None else f"{point['cpu_percent']:.1f}"
        print(f"{point['hour']:>6.2f}{point['rss_mib']:>10.1f}"
              f"{point['server_rss_mib']:>8.1f}{point['collector_rss_mib']:>8.1f}{cpu:>8}"
              f"{point['series'] or 0:>8}")
    llmmon = result["cpu"]["llmmon"]
    print(f"\n{'collector':12}{'run median ms':>15}{'interval s':>12}{'CPU, % of a core':>18}"
          "   (wall time of a run; its CPU per uncompressed hour)")
    for name, run in result["collector_runs"].items():
        print(f"{name:12}{run['median_ms']:>15}{run['interval_s'] or '-':>12}"
              f"{run['cpu_percent']:>18}")
    print(f"{'all runs':12}{'':>27}{llmmon['collector_runs_percent']:>18}")
    print("the collector process outside its runs (20 Hz power, XID and PID watches, "
          f"publishing), as measured: {llmmon['collector_outside_runs_measured_percent']} %")
    rows = targets(result)
    result["targets"] = [dict(zip(("target", "figure", "goal", "met", "previous"), row))
                         for row in rows]
    print(f"\n{'target':34}{'figure':52}{'goal':16}{'':6}previous (2026-12-02)")
    for target, figure, goal, met, previous in rows:
        print(f"{target:34}{figure:52}{goal:16}{'pass' if met else 'MISS':6}{previous}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.write_result:
        path = write_result("soak", result_markdown(args, result, rows),
                            title="Soak of the fat simulated node")
        print(f"wrote {path}")
    return 0 if all(row[3] for row in rows) else 1


def result_markdown(args: argparse.Namespace, result: dict, rows: list) -> str:
    """The dated result: the run's shape, the targets (met or missed) and each collector's runs."""
    llmmon = result["cpu"]["llmmon"]
    hog = "no CPU hog" if args.no_hog else f"a CPU hog after the first {args.idle_fraction:.0%}"
    lines = [f"{args.hours:g} simulated hours at x{args.compression:g} "
             f"({result['wall_seconds']:g} s of wall time), {hog}, {args.ring}-record rings; "
             f"{result['scrapes']['idle']} idle and "
             f"{result['scrapes']['loaded']} loaded scrapes. Method: the docstring of "
             "`bench/soak.py`.", "",
             "| target | figure | goal | met |", "|---|---|---|---|"]
    lines += [f"| {target} | {figure} | {goal} | {'met' if met else '**missed**'} |"
              for target, figure, goal, met, _ in rows]
    lines += ["", "| collector | run median ms | interval s | CPU, % of a core per hour |",
              "|---|---:|---:|---:|"]
    lines += [f"| {name} | {run['median_ms']} | {run['interval_s'] or '-'} | {run['cpu_percent']} |"
              for name, run in result["collector_runs"].items()]
    lines += ["", f"All runs {llmmon['collector_runs_percent']} % of a core; the collector "
              "process outside its runs, as measured, "
              f"{llmmon['collector_outside_runs_measured_percent']} %."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
